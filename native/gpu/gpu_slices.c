/*
 * gpu_slices.c - see gpu_slices.h.
 *
 * A slice's state moves UNREGISTERED -> QUEUED (the first demand, or the
 * thread taking it ahead; a compare-and-swap decides which) -> READY,
 * FAILED or OVER_LIMIT, set by the thread alone. READY is published with
 * release order after dptr, so a reader that loads READY with acquire
 * order sees the dptr. Without eviction nothing goes back before
 * gpu_slices_destroy, so a reader never races an unregistration.
 *
 * With eviction (a pin limit below the mapping), READY -> EVICTING ->
 * UNREGISTERED, by the thread, for a slice nobody holds. A holder raises
 * users, then checks the state is READY; the thread sets EVICTING, then
 * checks users is 0, and else puts READY back. Both sequentially
 * consistent, so one of the two always sees the other: no slice is
 * unregistered under a holder (Dekker's handshake).
 */
#include "gpu_slices.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "common/log.h"
#include "gdrkv.h"
#include "gpu.h"

static void cuda_thread_start(void *ctx)
{
    int dev = (int)(intptr_t)ctx;
    if (gpu_thread_enter(dev))
        GK_WARN("the pool's registration thread cannot use GPU %d's context", dev);
}

static int cuda_reg(void *ctx, const void *base, uint64_t len, int readonly, uint64_t *dptr)
{
    (void)ctx;
    CUdeviceptr d = 0;
    int rc = gpu_register_shared(base, (size_t)len, readonly, &d);
    *dptr = d;
    return rc;
}

static void cuda_unreg(void *ctx, const void *base)
{
    (void)ctx;
    gpu_unregister(base);
}

struct gpu_slices_ops gpu_slices_cuda_ops(int dev)
{
    return (struct gpu_slices_ops){cuda_thread_start, cuda_reg, cuda_unreg, (void *)(intptr_t)dev};
}

static uint8_t slice_state(const struct gpu_slices *s, uint32_t i)
{
    return __atomic_load_n(&s->slices[i].state, __ATOMIC_ACQUIRE);
}

static void set_state(struct gpu_slices *s, uint32_t i, uint8_t state)
{
    __atomic_store_n(&s->slices[i].state, state, __ATOMIC_RELEASE);
}

static int claim(struct gpu_slices *s, uint32_t i)
{
    uint8_t expect = GPU_SLICE_UNREGISTERED;
    return __atomic_compare_exchange_n(&s->slices[i].state, &expect, GPU_SLICE_QUEUED, 0,
                                       __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static uint64_t slice_len(const struct gpu_slices *s, uint32_t i)
{
    uint64_t off = (uint64_t)i << s->slice_shift;
    return GK_MIN(s->slice_bytes, s->len - off);
}

static void add_stat(uint64_t *counter, uint64_t n)
{
    __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}

/* Unregisters the least recently used registered slice nobody holds, to
 * make room under the limit: 1, or 0 when every registered slice is held. */
static int evict_one(struct gpu_slices *s)
{
    for (;;) {
        int64_t victim = -1;
        uint64_t oldest = UINT64_MAX;
        for (uint32_t i = 0; i < s->count; i++) {
            uint64_t used = __atomic_load_n(&s->slices[i].last_used, __ATOMIC_RELAXED);
            if (slice_state(s, i) == GPU_SLICE_READY && used < oldest &&
                !__atomic_load_n(&s->slices[i].users, __ATOMIC_SEQ_CST)) {
                victim = i;
                oldest = used;
            }
        }
        if (victim < 0)
            return 0;
        struct gpu_slice *v = &s->slices[victim];
        __atomic_store_n(&v->state, GPU_SLICE_EVICTING, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&v->users, __ATOMIC_SEQ_CST)) {
            __atomic_store_n(&v->state, GPU_SLICE_READY, __ATOMIC_SEQ_CST);
            continue;           /* held meanwhile: the next oldest */
        }
        s->ops.unreg(s->ops.ctx, s->base + ((uint64_t)victim << s->slice_shift));
        __atomic_fetch_sub(&s->pinned, slice_len(s, (uint32_t)victim), __ATOMIC_RELAXED);
        __atomic_fetch_sub(&s->stats->pinned_bytes, slice_len(s, (uint32_t)victim),
                           __ATOMIC_RELAXED);
        add_stat(&s->stats->slices_evicted, 1);
        set_state(s, (uint32_t)victim, GPU_SLICE_UNREGISTERED);
        return 1;
    }
}

/* Registers slice i, which the caller claimed (QUEUED), within the limit:
 * evicting others for it where they may go. */
static void register_slice(struct gpu_slices *s, uint32_t i)
{
    uint64_t len = slice_len(s, i);
    if (len > s->pin_limit) {
        add_stat(&s->stats->slices_over_limit, 1);
        set_state(s, i, GPU_SLICE_OVER_LIMIT);
        return;
    }
    while (s->pinned + len > s->pin_limit && gpu_slices_evicts(s) && evict_one(s))
        ;
    if (s->pinned + len > s->pin_limit) {
        /* Every registered slice is held (or nothing may be evicted): the
         * next copy to need this one asks again. */
        add_stat(&s->stats->slices_over_limit, 1);
        set_state(s, i, gpu_slices_evicts(s) ? GPU_SLICE_UNREGISTERED : GPU_SLICE_OVER_LIMIT);
        return;
    }
    uint64_t dptr = 0, t0 = gk_now_ns();
    int rc = s->ops.reg(s->ops.ctx, s->base + ((uint64_t)i << s->slice_shift), len,
                        s->readonly, &dptr);
    uint64_t us = (gk_now_ns() - t0) / 1000;
    add_stat(&s->stats->register_us, us);
    uint64_t max = __atomic_load_n(&s->stats->register_max_us, __ATOMIC_RELAXED);
    while (us > max && !__atomic_compare_exchange_n(&s->stats->register_max_us, &max, us, 1,
                                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    if (rc) {
        add_stat(&s->stats->slices_failed, 1);
        set_state(s, i, GPU_SLICE_FAILED);
        return;
    }
    s->slices[i].dptr = dptr;
    __atomic_store_n(&s->slices[i].last_used, gk_now_ns(), __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->pinned, len, __ATOMIC_RELAXED);
    add_stat(&s->stats->pinned_bytes, len);
    add_stat(&s->stats->slices_registered, 1);
    set_state(s, i, GPU_SLICE_READY);
}

/* Under the lock: the next slice to register, demanded ones first, then
 * ahead of demand while the ahead limit allows; -1 when there is none. */
static int64_t next_slice(struct gpu_slices *s)
{
    if (s->q_len) {
        uint32_t i = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->count;
        s->q_len--;
        return i;
    }
    while (s->ahead_next < s->count) {
        uint32_t i = s->ahead_next++;
        uint64_t len = slice_len(s, i);
        if (s->ahead_bytes + len > s->ahead_limit) {
            s->ahead_next = s->count;
            break;
        }
        if (claim(s, i)) {
            s->ahead_bytes += len;
            return i;
        }
    }
    return -1;
}

static void *registrar(void *arg)
{
    struct gpu_slices *s = arg;
    if (s->ops.thread_start)
        s->ops.thread_start(s->ops.ctx);
    pthread_mutex_lock(&s->lock);
    while (!s->stopping) {
        int64_t i = next_slice(s);
        if (i < 0) {
            pthread_cond_broadcast(&s->idle);
            pthread_cond_wait(&s->wake, &s->lock);
            continue;
        }
        s->registering = 1;
        pthread_mutex_unlock(&s->lock);
        register_slice(s, (uint32_t)i);
        pthread_mutex_lock(&s->lock);
        s->registering = 0;
    }
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

int gpu_slices_init(struct gpu_slices *s, const void *base, uint64_t len, int readonly,
                    uint64_t slice_bytes, uint64_t pin_limit, uint64_t ahead_limit,
                    const struct gpu_slices_ops *ops, struct gpu_slices_stats *stats)
{
    memset(s, 0, sizeof *s);
    slice_bytes = slice_bytes ? slice_bytes : GPU_SLICE_BYTES;
    if (!base || !len || (slice_bytes & (slice_bytes - 1)) || slice_bytes < (1u << 20))
        return GDRKV_E_INTERNAL;
    uint64_t count = (len + slice_bytes - 1) / slice_bytes;
    if (count > UINT32_MAX)
        return GDRKV_E_INTERNAL;
    s->base = base;
    s->len = len;
    s->slice_bytes = slice_bytes;
    s->slice_shift = (unsigned)__builtin_ctzll(slice_bytes);
    s->count = (uint32_t)count;
    s->readonly = readonly;
    s->pin_limit = pin_limit ? pin_limit : len;
    s->ahead_limit = GK_MIN(ahead_limit, s->pin_limit);
    s->ops = *ops;
    s->stats = stats;
    s->slices = calloc(count, sizeof *s->slices);
    s->queue = calloc(count, sizeof *s->queue);
    if (!s->slices || !s->queue)
        goto fail;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    pthread_cond_init(&s->idle, NULL);
    if (pthread_create(&s->thread, NULL, registrar, s) != 0) {
        pthread_cond_destroy(&s->idle);
        pthread_cond_destroy(&s->wake);
        pthread_mutex_destroy(&s->lock);
        goto fail;
    }
    s->thread_started = 1;
    return 0;
fail:
    free(s->slices);
    free(s->queue);
    memset(s, 0, sizeof *s);
    return GDRKV_E_INTERNAL;
}

void gpu_slices_destroy(struct gpu_slices *s)
{
    if (!s->thread_started)
        return;
    pthread_mutex_lock(&s->lock);
    s->stopping = 1;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    for (uint32_t i = 0; i < s->count; i++)
        if (slice_state(s, i) == GPU_SLICE_READY)
            s->ops.unreg(s->ops.ctx, s->base + ((uint64_t)i << s->slice_shift));
    __atomic_fetch_sub(&s->stats->pinned_bytes, s->pinned, __ATOMIC_RELAXED);
    pthread_cond_destroy(&s->idle);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->lock);
    free(s->slices);
    free(s->queue);
    memset(s, 0, sizeof *s);
}

/* The first copy to need slice i queues it for the thread. */
static void demand(struct gpu_slices *s, uint32_t i)
{
    if (!claim(s, i))
        return;
    add_stat(&s->stats->demands, 1);
    pthread_mutex_lock(&s->lock);
    s->queue[(s->q_head + s->q_len) % s->count] = i;
    s->q_len++;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
}

int gpu_slices_within(const struct gpu_slices *s, uint64_t addr)
{
    return addr >= (uint64_t)(uintptr_t)s->base && addr - (uint64_t)(uintptr_t)s->base < s->len;
}

int gpu_slices_reach(struct gpu_slices *s, uint64_t addr, uint64_t len)
{
    uint64_t off = addr - (uint64_t)(uintptr_t)s->base;
    if (!gpu_slices_within(s, addr) || len > s->len - off)
        return 0;
    uint32_t last = (uint32_t)((off + (len ? len - 1 : 0)) >> s->slice_shift);
    int ready = 1;
    for (uint32_t i = (uint32_t)(off >> s->slice_shift); i <= last; i++) {
        uint8_t state = slice_state(s, i);
        if (state == GPU_SLICE_READY)
            continue;
        ready = 0;
        if (state == GPU_SLICE_UNREGISTERED)
            demand(s, i);
    }
    return ready;
}

int gpu_slices_evicts(const struct gpu_slices *s)
{
    return s->pin_limit < s->len;
}

int gpu_slices_hold(struct gpu_slices *s, uint64_t addr, uint64_t now_ns, uint32_t *slice)
{
    if (!gpu_slices_within(s, addr))
        return 0;
    uint32_t i = (uint32_t)((addr - (uint64_t)(uintptr_t)s->base) >> s->slice_shift);
    struct gpu_slice *sl = &s->slices[i];
    uint8_t state = slice_state(s, i);
    if (state == GPU_SLICE_READY) {
        __atomic_fetch_add(&sl->users, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&sl->state, __ATOMIC_SEQ_CST) == GPU_SLICE_READY) {
            __atomic_store_n(&sl->last_used, now_ns, __ATOMIC_RELAXED);
            *slice = i;
            return 1;
        }
        __atomic_fetch_sub(&sl->users, 1, __ATOMIC_SEQ_CST);
        state = slice_state(s, i);
    }
    if (state == GPU_SLICE_UNREGISTERED)
        demand(s, i);
    return 0;
}

void gpu_slices_unhold(struct gpu_slices *s, uint32_t slice)
{
    __atomic_fetch_sub(&s->slices[slice].users, 1, __ATOMIC_SEQ_CST);
}

uint64_t gpu_slices_pinned(const struct gpu_slices *s)
{
    return __atomic_load_n(&s->pinned, __ATOMIC_RELAXED);
}

uint64_t gpu_slices_dptr(const struct gpu_slices *s, uint64_t addr)
{
    uint64_t off = addr - (uint64_t)(uintptr_t)s->base;
    uint32_t i = (uint32_t)(off >> s->slice_shift);
    return s->slices[i].dptr + (off - ((uint64_t)i << s->slice_shift));
}

uint64_t gpu_slices_border(const struct gpu_slices *s, uint64_t addr)
{
    uint64_t off = addr - (uint64_t)(uintptr_t)s->base;
    return (uint64_t)(uintptr_t)s->base + ((off >> s->slice_shift) + 1) * s->slice_bytes;
}

int gpu_slices_wait_idle(struct gpu_slices *s, int timeout_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    while ((s->q_len || s->registering || s->ahead_next < s->count) && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&s->idle, &s->lock, &until);
    int idle = !s->q_len && !s->registering;
    pthread_mutex_unlock(&s->lock);
    return idle;
}
