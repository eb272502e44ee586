/*
 * uring.h - many reads in flight from one thread, through io_uring where
 * the kernel allows it (set up with the raw system calls: no liburing).
 *
 * The disk tier reads a frame's records back with one call: a thread
 * issuing them one pread at a time would keep one read in flight, where a
 * disk (NVMe above all) serves dozens at once. Where io_uring is missing
 * (an old kernel, kernel.io_uring_disabled, a seccomp filter) the reads
 * run as preads, one after the other, with the same results.
 */
#ifndef GDRKV_URING_H
#define GDRKV_URING_H

#include <stdint.h>

struct uring_read {
    int fd;
    void *buf;
    uint32_t len;
    uint64_t off;
};

/* Reads each of n requests; res[i] is the bytes read or -errno. Returns
 * whether io_uring carried them (1) or preads (0). */
int uring_read_all(const struct uring_read *reads, uint32_t n, int64_t *res);

/* Whether this process may use io_uring at all (checked once). */
int uring_available(void);

#endif
