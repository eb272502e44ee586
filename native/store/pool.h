/*
 * pool.h - the one big memory region objects live in: a memfd (or, to
 * outlive the process, a file on tmpfs or hugetlbfs) mapped shared, so the
 * shm transport can hand the same pages to local clients (read-only), and
 * so RDMA can register it once.
 */
#ifndef GDRKV_POOL_H
#define GDRKV_POOL_H

#include <stddef.h>
#include <stdint.h>

struct pool {
    uint8_t *base;
    uint64_t size;          /* bytes asked for */
    uint64_t map_len;       /* size rounded up to the page size backing it, or a
                               pool file's whole length */
    int fd;                 /* the memfd or pool file; -1 when not open */
    int file;               /* backed by a pool file */
    int fresh;              /* a pool file created (or reset) now: no objects in it */
    int share_fd;           /* fd of the sealed memfd for local clients
                               (read-only unless writable_share); -1 when
                               the pool can't be shared */
    int hugepages;          /* 1 when backed by 2 MiB hugetlb pages */
};

struct pool_opts {
    uint64_t size;
    const char *path;       /* a pool file (persist.h) instead of a memfd, or NULL */
    uint64_t file_len;      /* its length: size and the store's metadata after it */
    int reset;              /* start the file afresh whatever it holds */
    int hugepages;
    int pretouch;
    int writable_share;
};

/* Once mapped, the memfd is sealed against shrinking, growing and any new
 * writable mapping or write(): the pool's own mapping stays writable, but a
 * client holding the fd (or reopening it through /proc) can neither corrupt
 * objects nor truncate the file under the server (SIGBUS). A kernel that
 * refuses the seals leaves share_fd at -1, and shm stays off. With
 * writable_share (single-tenant mode) only the size is sealed, and share_fd
 * is writable: clients copy PUT values straight into their reservations.
 *
 * hugepages: -1 try 2 MiB hugetlb pages and fall back to normal ones,
 * 0 never, 1 require. pretouch faults every page in now rather than on
 * first write. Returns 0, or -1 with a message in err.
 *
 * A pool file can't be sealed (only memfds can). It is created 0600 and
 * space for all of it is allocated at once (no SIGBUS on a full tmpfs
 * later); an existing one must be a regular file of ours, writable by no one
 * else, so that only our own user could shrink it under a client. An flock
 * keeps a second server off it. On hugetlbfs it gets hugepages. */
int pool_open(struct pool *p, const struct pool_opts *o, char *err, size_t errlen);
void pool_close(struct pool *p);

#endif
