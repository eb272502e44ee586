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
#include <linux/magic.h>
#include <linux/memfd.h>   /* before sys/mman.h: MFD_HUGE_2MB */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "common/common.h"
#include "common/files.h"
#include "common/log.h"

#define POOL_HUGE_PAGE (2ull << 20)
/* First touch is a page fault and a zeroed page per page, slow on one
 * thread; a thread per this many bytes, up to POOL_TOUCH_THREADS, is where
 * threads start to pay. */
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
    int read;
};

static void *touch_range(void *arg)
{
    const struct touch_range *r = arg;
    for (uint64_t off = 0; off < r->len; off += r->step) {
        if (r->read)
            (void)r->start[off];
        else
            r->start[off] = 0;
    }
    return NULL;
}

/* A write per page, not a read: reading shmem could map pages without
 * giving them their own memory. A pool file's pages all exist already
 * (allocated at creation) and may hold objects: those are read. */
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
        ranges[t] = (struct touch_range){p->base + first * step, (end - first) * step, step,
                                         p->file};
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

    if (!p->file && fcntl(p->fd, F_ADD_SEALS, seals) != 0) {
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

/* Opens (creating it 0600 if absent) and locks the pool file; refuses one
 * that is not a regular file of ours private to us, or is in use. */
static int map_file(struct pool *p, const struct pool_opts *o, char *err, size_t errlen)
{
    struct stat st;
    struct statfs fs;
    int fd = gk_open_owned_file(o->path, "the pool file", 0, &st, err, errlen);
    if (fd < 0)
        return -1;
    p->fd = fd;
    p->file = 1;
    p->size = o->size;
    p->map_len = o->file_len;
    p->hugepages = fstatfs(fd, &fs) == 0 && fs.f_type == HUGETLBFS_MAGIC;
    if (o->hugepages > 0 && !p->hugepages) {
        snprintf(err, errlen, "hugepages required but the pool file %s is not on hugetlbfs",
                 o->path);
        return -1;
    }
    if (!p->hugepages && !(fstatfs(fd, &fs) == 0 && fs.f_type == TMPFS_MAGIC))
        GK_WARN("pool: %s is on neither tmpfs nor hugetlbfs: the pool lives in the page cache "
                "of a disk, written back behind the server's back", o->path);

    if ((uint64_t)st.st_size != o->file_len && st.st_size != 0 && !o->reset) {
        snprintf(err, errlen, "the pool file %s has %llu bytes where this pool needs %llu: "
                 "start with the memory it was made with, or reset it", o->path,
                 (unsigned long long)st.st_size, (unsigned long long)o->file_len);
        return -1;
    }
    p->fresh = (uint64_t)st.st_size != o->file_len || o->reset;
    if (p->fresh) {
        /* Emptied, then all its space allocated now: a full tmpfs fails
         * here rather than with SIGBUS on some later write. */
        int rc = ftruncate(fd, 0) == 0 && ftruncate(fd, (off_t)o->file_len) == 0 ? 0 : errno;
        if (!rc)
            rc = fallocate(fd, 0, 0, (off_t)o->file_len) == 0 ? 0 : errno;
        if (rc == EOPNOTSUPP) {
            GK_WARN("pool: %s can't preallocate its space: a full filesystem would mean SIGBUS",
                    o->path);
            rc = 0;
        }
        if (rc) {
            snprintf(err, errlen, "cannot make the pool file %s %llu MiB: %s", o->path,
                     (unsigned long long)(o->file_len >> 20), strerror(rc));
            (void)!ftruncate(fd, 0);
            return -1;
        }
    }
    void *base = mmap(NULL, o->file_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        snprintf(err, errlen, "cannot map the pool file %s: %s", o->path, strerror(errno));
        return -1;
    }
    p->base = base;
    if (!p->hugepages)
        madvise(p->base, p->map_len, MADV_HUGEPAGE);
    return 0;
}

/* A pool as large as the host's memory can never be held: pretouching it
 * (the default) would fault in more than there is and bring the OOM killer
 * within seconds, and without pretouch the same comes later, under load.
 * Refused before anything is mapped, naming both sizes. */
static int check_fits_in_memory(uint64_t size, char *err, size_t errlen)
{
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page_size <= 0)
        return 0;                       /* unknown: nothing to hold it against */
    uint64_t memory = (uint64_t)pages * (uint64_t)page_size;
    if (size < memory)
        return 0;
    snprintf(err, errlen, "a %llu MiB pool does not fit in this host's %llu MiB of memory: "
             "ask for less (gdrkv serve --memory SIZE or a share such as 25%%)",
             (unsigned long long)(size >> 20), (unsigned long long)(memory >> 20));
    return -1;
}

static int map_anonymous(struct pool *p, const struct pool_opts *o, char *err, size_t errlen)
{
    uint64_t size = o->size;
    int rc = -1;
    if (check_fits_in_memory(size, err, errlen) != 0)
        return -1;
    if (o->hugepages != 0) {
        rc = map_memfd(p, size, 1);
        if (rc != 0 && o->hugepages < 0)
            GK_INFO("no hugetlb pool (%s); falling back to normal pages", strerror(-rc));
        if (rc != 0 && o->hugepages > 0) {
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
    return 0;
}

int pool_open(struct pool *p, const struct pool_opts *o, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    p->fd = p->share_fd = -1;

    if ((o->path ? map_file(p, o, err, errlen) : map_anonymous(p, o, err, errlen)) != 0) {
        pool_close(p);
        return -1;
    }
    uint64_t size = o->size;
    GK_INFO("pool: %llu MiB on %s pages%s%s%s", (unsigned long long)(size >> 20),
            p->hugepages ? "2 MiB hugetlb" : "normal (THP advised)",
            o->path ? " in " : "", o->path ? o->path : "",
            o->pretouch ? ", pretouching" : "");
    if (o->pretouch) {
        uint64_t start = gk_now_ns();
        pretouch(p);
        GK_INFO("pool: pretouched in %llu ms", (unsigned long long)((gk_now_ns() - start) / 1000000));
    }
    make_shareable(p, o->writable_share);
    return 0;
}

void pool_close(struct pool *p)
{
    /* A pool file on a disk gets its pages written back now; on tmpfs and
     * hugetlbfs this costs nothing. */
    if (p->base && p->file)
        msync(p->base, p->map_len, MS_SYNC);
    if (p->base)
        munmap(p->base, p->map_len);
    if (p->share_fd >= 0)
        close(p->share_fd);
    if (p->fd >= 0)
        close(p->fd);
    p->base = NULL;
    p->fd = p->share_fd = -1;
}
