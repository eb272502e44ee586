/*
 * pool.c - see pool.h.
 *
 * Hugetlb pages are reserved when the shared mapping is made, so a mapping
 * that succeeds will not SIGBUS later: that is where "try" falls back.
 * Normal pages get MADV_HUGEPAGE so transparent hugepages are used where
 * the kernel allows them for shmem.
 */
#include "pool.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/memfd.h>   /* before sys/mman.h: MFD_HUGE_2MB */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/common.h"
#include "common/log.h"

#define POOL_HUGE_PAGE (2ull << 20)
/* First touch runs at about 1 GB/s per thread on VMs; a thread per this
 * many bytes, up to POOL_TOUCH_THREADS, is where threads start to pay. */
#define POOL_TOUCH_BYTES_PER_THREAD (256ull << 20)
#define POOL_TOUCH_THREADS 8

static int map_memfd(struct pool *p, uint64_t size, int huge)
{
    unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge ? MFD_HUGETLB | MFD_HUGE_2MB : 0);
    uint64_t len = huge ? (size + POOL_HUGE_PAGE - 1) / POOL_HUGE_PAGE * POOL_HUGE_PAGE : size;
    int fd = memfd_create("gdrkv-pool", flags);
    if (fd < 0)
        return -errno;
    if (ftruncate(fd, (off_t)len) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        int e = errno;
        close(fd);
        return -e;
    }
    p->base = base;
    p->size = size;
    p->map_len = len;
    p->fd = fd;
    p->hugepages = huge;
    return 0;
}

struct touch_range {
    volatile uint8_t *start;
    uint64_t len;
    uint64_t step;
};

static void *touch_range(void *arg)
{
    const struct touch_range *r = arg;
    for (uint64_t off = 0; off < r->len; off += r->step)
        r->start[off] = 0;
    return NULL;
}

/* A write per page, not a read: reading shmem could map pages without
 * giving them their own memory. */
static void pretouch(struct pool *p)
{
    uint64_t step = p->hugepages ? POOL_HUGE_PAGE : (uint64_t)sysconf(_SC_PAGESIZE);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t nthreads = p->map_len / POOL_TOUCH_BYTES_PER_THREAD;
    nthreads = GK_MIN(nthreads, (uint64_t)GK_MAX(cpus, 1L));
    nthreads = GK_MAX(GK_MIN(nthreads, (uint64_t)POOL_TOUCH_THREADS), 1ull);

    uint64_t pages = p->map_len / step;
    struct touch_range ranges[POOL_TOUCH_THREADS];
    pthread_t threads[POOL_TOUCH_THREADS];
    int started[POOL_TOUCH_THREADS] = {0};
    uint64_t first = 0;
    for (uint64_t t = 0; t < nthreads; t++) {
        uint64_t end = pages * (t + 1) / nthreads;
        ranges[t] = (struct touch_range){p->base + first * step, (end - first) * step, step};
        first = end;
    }
    /* The calling thread takes range 0, and any range a thread can't be
     * started for. */
    for (uint64_t t = 1; t < nthreads; t++)
        started[t] = pthread_create(&threads[t], NULL, touch_range, &ranges[t]) == 0;
    touch_range(&ranges[0]);
    for (uint64_t t = 1; t < nthreads; t++) {
        if (started[t])
            pthread_join(threads[t], NULL);
        else
            touch_range(&ranges[t]);
    }
}

/* Seals the memfd (see pool.h) and opens the fd clients get. */
static void make_shareable(struct pool *p, int writable)
{
    char path[64];
    int seals = F_SEAL_SHRINK | F_SEAL_GROW | (writable ? 0 : F_SEAL_FUTURE_WRITE);

    if (fcntl(p->fd, F_ADD_SEALS, seals) != 0) {
        GK_WARN("pool: cannot seal the memfd (%s); the shm transport is off", strerror(errno));
        return;
    }
    snprintf(path, sizeof path, "/proc/self/fd/%d", p->fd);
    p->share_fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (p->share_fd < 0)
        GK_WARN("pool: cannot reopen the memfd (%s); the shm transport is off", strerror(errno));
    else if (writable)
        GK_WARN("pool: single-tenant mode: local clients map the pool writable");
}

int pool_open(struct pool *p, uint64_t size, int hugepages, int pretouch_pages,
              int writable_share, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    p->fd = p->share_fd = -1;

    int rc = -1;
    if (hugepages != 0) {
        rc = map_memfd(p, size, 1);
        if (rc != 0 && hugepages < 0)
            GK_INFO("no hugetlb pool (%s); falling back to normal pages", strerror(-rc));
        if (rc != 0 && hugepages > 0) {
            snprintf(err, errlen,
                     "hugepages required but a %llu MiB hugetlb pool failed: %s "
                     "(reserve 2 MiB pages with sysctl vm.nr_hugepages)",
                     (unsigned long long)(size >> 20), strerror(-rc));
            return -1;
        }
    }
    if (rc != 0) {
        rc = map_memfd(p, size, 0);
        if (rc != 0) {
            snprintf(err, errlen, "cannot map a %llu MiB pool: %s",
                     (unsigned long long)(size >> 20), strerror(-rc));
            return -1;
        }
        madvise(p->base, p->map_len, MADV_HUGEPAGE);
    }
    GK_INFO("pool: %llu MiB on %s pages%s", (unsigned long long)(size >> 20),
            p->hugepages ? "2 MiB hugetlb" : "normal (THP advised)",
            pretouch_pages ? ", pretouching" : "");
    if (pretouch_pages) {
        uint64_t start = gk_now_ns();
        pretouch(p);
        GK_INFO("pool: pretouched in %llu ms", (unsigned long long)((gk_now_ns() - start) / 1000000));
    }
    make_shareable(p, writable_share);
    return 0;
}

void pool_close(struct pool *p)
{
    if (p->base)
        munmap(p->base, p->map_len);
    if (p->share_fd >= 0)
        close(p->share_fd);
    if (p->fd >= 0)
        close(p->fd);
    p->base = NULL;
    p->fd = p->share_fd = -1;
}
