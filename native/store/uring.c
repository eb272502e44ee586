/*
 * uring.c - see uring.h.
 *
 * A ring lives for one uring_read_all call: set up, filled, drained and
 * torn down (tens of microseconds, against reads of whole records). Its
 * rings are shared with the kernel: our stores to the submission tail and
 * completion head are releases, our loads of the kernel's indices
 * acquires, as io_uring(7) asks.
 */
#include "uring.h"

#include <errno.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/common.h"
#include "common/log.h"

#define URING_DEPTH 64u

struct ring {
    int fd;
    uint32_t *sq_head, *sq_tail, *sq_mask, *sq_array;
    uint32_t *cq_head, *cq_tail, *cq_mask;
    struct io_uring_cqe *cqes;
    struct io_uring_sqe *sqes;
    void *sq_map, *cq_map;
    size_t sq_len, cq_len, sqes_len;
    uint32_t entries;
};

static void ring_close(struct ring *r)
{
    if (r->sqes)
        munmap(r->sqes, r->sqes_len);
    if (r->cq_map && r->cq_map != r->sq_map)
        munmap(r->cq_map, r->cq_len);
    if (r->sq_map)
        munmap(r->sq_map, r->sq_len);
    if (r->fd >= 0)
        close(r->fd);
}

static int ring_open(struct ring *r, uint32_t entries)
{
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    memset(r, 0, sizeof *r);
    r->fd = (int)syscall(__NR_io_uring_setup, entries, &p);
    if (r->fd < 0)
        return -errno;
    r->entries = p.sq_entries;
    r->sq_len = p.sq_off.array + p.sq_entries * sizeof(uint32_t);
    r->cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (p.features & IORING_FEAT_SINGLE_MMAP)
        r->sq_len = r->cq_len = GK_MAX(r->sq_len, r->cq_len);
    r->sq_map = mmap(NULL, r->sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                     IORING_OFF_SQ_RING);
    if (r->sq_map == MAP_FAILED) {
        r->sq_map = NULL;
        goto fail;
    }
    r->cq_map = (p.features & IORING_FEAT_SINGLE_MMAP)
                    ? r->sq_map
                    : mmap(NULL, r->cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                           r->fd, IORING_OFF_CQ_RING);
    if (r->cq_map == MAP_FAILED) {
        r->cq_map = NULL;
        goto fail;
    }
    r->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
    r->sqes = mmap(NULL, r->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                   IORING_OFF_SQES);
    if (r->sqes == MAP_FAILED) {
        r->sqes = NULL;
        goto fail;
    }
    uint8_t *sq = r->sq_map, *cq = r->cq_map;
    r->sq_head = (uint32_t *)(sq + p.sq_off.head);
    r->sq_tail = (uint32_t *)(sq + p.sq_off.tail);
    r->sq_mask = (uint32_t *)(sq + p.sq_off.ring_mask);
    r->sq_array = (uint32_t *)(sq + p.sq_off.array);
    r->cq_head = (uint32_t *)(cq + p.cq_off.head);
    r->cq_tail = (uint32_t *)(cq + p.cq_off.tail);
    r->cq_mask = (uint32_t *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    return 0;
fail:;
    int err = -errno;
    ring_close(r);
    return err;
}

static void queue_read(struct ring *r, const struct uring_read *rd, uint64_t user)
{
    uint32_t tail = *r->sq_tail, idx = tail & *r->sq_mask;
    struct io_uring_sqe *sqe = &r->sqes[idx];
    memset(sqe, 0, sizeof *sqe);
    sqe->opcode = IORING_OP_READ;
    sqe->fd = rd->fd;
    sqe->addr = (uint64_t)(uintptr_t)rd->buf;
    sqe->len = rd->len;
    sqe->off = rd->off;
    sqe->user_data = user;
    r->sq_array[idx] = idx;
    __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
}

/* Takes the completions there are: how many. */
static uint32_t reap(struct ring *r, int64_t *res)
{
    uint32_t head = *r->cq_head, got = 0;
    while (head != __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE)) {
        const struct io_uring_cqe *cqe = &r->cqes[head & *r->cq_mask];
        res[cqe->user_data] = cqe->res;
        head++, got++;
    }
    __atomic_store_n(r->cq_head, head, __ATOMIC_RELEASE);
    return got;
}

static long enter(struct ring *r, uint32_t submit, uint32_t wait)
{
    return syscall(__NR_io_uring_enter, r->fd, submit, wait, IORING_ENTER_GETEVENTS, NULL, 0);
}

/* The reads through the ring, at most its depth in flight: 0, or -errno
 * when the ring failed (res[] then means nothing). */
static int ring_read_all(struct ring *r, const struct uring_read *reads, uint32_t n,
                         int64_t *res)
{
    uint32_t queued = 0, done = 0;
    while (done < n) {
        while (queued < n && queued - done < r->entries) {
            queue_read(r, &reads[queued], queued);
            queued++;
        }
        uint32_t unsent = *r->sq_tail - __atomic_load_n(r->sq_head, __ATOMIC_ACQUIRE);
        if (enter(r, unsent, 1) < 0 && errno != EINTR && errno != EAGAIN && errno != EBUSY) {
            int err = -errno;
            /* The reads the kernel took may still land in their buffers:
             * wait for them before the caller reuses or frees those. */
            uint32_t taken = queued - (*r->sq_tail - __atomic_load_n(r->sq_head,
                                                                     __ATOMIC_ACQUIRE));
            for (int tries = 0; done < taken && tries < 1000; tries++) {
                enter(r, 0, taken - done);
                done += reap(r, res);
            }
            return err;
        }
        done += reap(r, res);
    }
    return 0;
}

static void pread_all(const struct uring_read *reads, uint32_t n, int64_t *res)
{
    for (uint32_t i = 0; i < n; i++) {
        ssize_t got;
        do
            got = pread(reads[i].fd, reads[i].buf, reads[i].len, (off_t)reads[i].off);
        while (got < 0 && errno == EINTR);
        res[i] = got < 0 ? -errno : got;
    }
}

static int available = -1;
static pthread_once_t probe_once = PTHREAD_ONCE_INIT;

static void probe(void)
{
    struct ring r;
    const char *env = getenv("GDRKV_IO_URING");
    if (env && strcmp(env, "0") == 0) {
        available = 0;
        GK_INFO("disk: io_uring off (GDRKV_IO_URING=0): reads are preads");
        return;
    }
    int rc = ring_open(&r, 2);
    available = rc == 0;
    if (rc == 0)
        ring_close(&r);
    else
        GK_INFO("disk: no io_uring here (%s): reads are preads", strerror(-rc));
}

int uring_available(void)
{
    pthread_once(&probe_once, probe);
    return available;
}

int uring_read_all(const struct uring_read *reads, uint32_t n, int64_t *res)
{
    struct ring r;
    if (n > 1 && uring_available() && ring_open(&r, GK_MIN(n, URING_DEPTH)) == 0) {
        int rc = ring_read_all(&r, reads, n, res);
        ring_close(&r);
        /* A kernel with io_uring but without its READ op (before 5.6)
         * refuses each read: those go as preads. */
        for (uint32_t i = 0; rc == 0 && i < n; i++)
            if (res[i] == -EINVAL || res[i] == -EOPNOTSUPP)
                pread_all(&reads[i], 1, &res[i]);
        if (rc == 0)
            return 1;
        GK_WARN("disk: io_uring failed (%s): reading with pread", strerror(-rc));
    }
    pread_all(reads, n, res);
    return 0;
}
