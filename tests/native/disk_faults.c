/*
 * disk_faults.c - an LD_PRELOAD shim for tests: I/O on the disk tier's
 * files (named gdrkv.disk) fails or slows down while the file named by
 * $DISK_FAULT_SWITCH exists, so a test turns faults on and off under a
 * running server. $DISK_FAULT says which: "enospc" (writes fail with
 * ENOSPC), "eio" (reads and writes fail with EIO), "slow-reads" (each
 * read sleeps $DISK_FAULT_MS first), "slow-writes" (each write does).
 * Everything else goes through.
 * test_disk_tier.py builds it with cc.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

typedef ssize_t (*pio_fn)(int, void *, size_t, off_t);

static int on_disk_file(int fd)
{
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0)
        return 0;
    path[n] = 0;
    size_t len = strlen(path), name = strlen("/gdrkv.disk");
    return len >= name && strcmp(path + len - name, "/gdrkv.disk") == 0;
}

/* The fault in effect for this call, or NULL. */
static const char *fault(int fd)
{
    const char *sw = getenv("DISK_FAULT_SWITCH"), *kind = getenv("DISK_FAULT");
    if (!sw || !kind || access(sw, F_OK) != 0 || !on_disk_file(fd))
        return NULL;
    return kind;
}

static ssize_t io(const char *name, int writing, int fd, void *buf, size_t len, off_t off)
{
    const char *f = fault(fd);
    if (f && strcmp(f, "eio") == 0) {
        errno = EIO;
        return -1;
    }
    if (f && writing && strcmp(f, "enospc") == 0) {
        errno = ENOSPC;
        return -1;
    }
    if (f && strcmp(f, writing ? "slow-writes" : "slow-reads") == 0) {
        long ms = getenv("DISK_FAULT_MS") ? atol(getenv("DISK_FAULT_MS")) : 1000;
        struct timespec t = {ms / 1000, (ms % 1000) * 1000000l};
        nanosleep(&t, NULL);
    }
    pio_fn real = (pio_fn)dlsym(RTLD_NEXT, name);
    return real(fd, buf, len, off);
}

ssize_t pread(int fd, void *buf, size_t len, off_t off) { return io("pread", 0, fd, buf, len, off); }
ssize_t pread64(int fd, void *buf, size_t len, off_t off) { return io("pread64", 0, fd, buf, len, off); }
ssize_t pwrite(int fd, const void *buf, size_t len, off_t off)
{
    return io("pwrite", 1, fd, (void *)buf, len, off);
}
ssize_t pwrite64(int fd, const void *buf, size_t len, off_t off)
{
    return io("pwrite64", 1, fd, (void *)buf, len, off);
}
