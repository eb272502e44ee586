/*
 * test_gpu_slices.c - the bookkeeping of gpu_slices (native/gpu/gpu_slices.h)
 * with CUDA's registration stood in for at the C level: which slices get
 * registered, once each, within the pin limit, in what order; that a copy
 * asking for a slice never waits for a registration, its own or another's;
 * and many threads asking for slices at once; under a pin limit, the
 * least recently used slices nobody holds evicted to make room, and never
 * a held one, with many threads holding slices while the limit churns.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/common.h"
#include "gpu/gpu_slices.h"

#define MIB (1ull << 20)
#define MAX_SLICES 256

/* The stand-in registration: counts calls per slice, fails the slices it
 * is told to, and can hold a registration until released. */
struct stub {
    const uint8_t *base;
    uint64_t slice;
    int regs[MAX_SLICES];
    uint64_t lens[MAX_SLICES];
    int unregs[MAX_SLICES];
    int fail[MAX_SLICES];
    int live[MAX_SLICES];       /* atomic: registered now */
    int order[MAX_SLICES];
    int norder;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int started;                /* thread_start ran, on start_thread */
    pthread_t start_thread;
    int hold;                   /* registrations wait while set */
    int held;                   /* a registration is waiting */
};

static void stub_thread_start(void *ctx)
{
    struct stub *st = ctx;
    st->start_thread = pthread_self();
    st->started = 1;
}

static int stub_reg(void *ctx, const void *base, uint64_t len, int readonly, uint64_t *dptr)
{
    struct stub *st = ctx;
    CHECK(st->started && pthread_equal(st->start_thread, pthread_self()),
          "registrations run on the thread thread_start prepared");
    uint64_t i = ((const uint8_t *)base - st->base) / st->slice;
    CHECK(i < MAX_SLICES && len > 0 && len <= st->slice, "slice %llu of %llu bytes",
          (unsigned long long)i, (unsigned long long)len);
    CHECK(readonly == 1, "the mapping is read-only");
    pthread_mutex_lock(&st->lock);
    st->regs[i]++;
    st->lens[i] = len;
    if (st->norder < MAX_SLICES)
        st->order[st->norder++] = (int)i;
    st->held = 1;
    pthread_cond_broadcast(&st->cond);
    while (st->hold)
        pthread_cond_wait(&st->cond, &st->lock);
    st->held = 0;
    pthread_mutex_unlock(&st->lock);
    *dptr = 0x7000000000ull + i * st->slice;
    if (!st->fail[i])
        __atomic_store_n(&st->live[i], 1, __ATOMIC_SEQ_CST);
    return st->fail[i] ? -1 : 0;
}

static void stub_unreg(void *ctx, const void *base)
{
    struct stub *st = ctx;
    uint64_t i = ((const uint8_t *)base - st->base) / st->slice;
    pthread_mutex_lock(&st->lock);
    st->unregs[i]++;
    pthread_mutex_unlock(&st->lock);
    __atomic_store_n(&st->live[i], 0, __ATOMIC_SEQ_CST);
}

static void stub_init(struct stub *st, const void *base, uint64_t slice)
{
    memset(st, 0, sizeof *st);
    st->base = base;
    st->slice = slice;
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->cond, NULL);
}

static struct gpu_slices_ops stub_ops(struct stub *st)
{
    return (struct gpu_slices_ops){stub_thread_start, stub_reg, stub_unreg, st};
}

/* The mapping is never touched: slices only need addresses. */
static uint8_t *fake_base(void)
{
    return (uint8_t *)(uintptr_t)0x100000000000ull;
}

static uint64_t at(uint64_t off)
{
    return (uint64_t)(uintptr_t)fake_base() + off;
}

static void test_demand_registers_once_and_maps_addresses(void)
{
    struct stub st;
    stub_init(&st, fake_base(), 4 * MIB);
    struct gpu_slices_ops ops = stub_ops(&st);
    struct gpu_slices s;
    struct gpu_slices_stats stats = {0};
    CHECK_EQ(gpu_slices_init(&s, fake_base(), 10 * MIB, 1, 4 * MIB, 0, 0, &ops, &stats), 0);
    CHECK_EQ(s.count, 3);

    CHECK_EQ(gpu_slices_reach(&s, at(5 * MIB), 4096), 0);      /* slice 1: queued */
    gpu_slices_reach(&s, at(5 * MIB + 8192), 4096);             /* queued or ready: not again */
    CHECK_EQ(gpu_slices_wait_idle(&s, 5000), 1);
    CHECK_EQ(gpu_slices_reach(&s, at(5 * MIB), 4096), 1);
    CHECK_EQ(st.regs[0], 0);
    CHECK_EQ(st.regs[1], 1);
    CHECK_EQ(st.regs[2], 0);
    CHECK_EQ(gpu_slices_dptr(&s, at(5 * MIB + 100)), 0x7000000000ull + 4 * MIB + MIB + 100);
    CHECK_EQ(gpu_slices_border(&s, at(5 * MIB)), at(8 * MIB));

    /* A range over two slices is ready only when both are. */
    CHECK_EQ(gpu_slices_reach(&s, at(7 * MIB), 2 * MIB), 0);
    CHECK_EQ(gpu_slices_wait_idle(&s, 5000), 1);
    CHECK_EQ(gpu_slices_reach(&s, at(7 * MIB), 2 * MIB), 1);
    /* The last slice is short: 2 MiB, and its end is inside. */
    CHECK_EQ(st.lens[2], 2 * MIB);
    CHECK_EQ(gpu_slices_reach(&s, at(10 * MIB - 1), 1), 1);
    /* Outside the mapping: never reachable, nothing queued. */
    CHECK_EQ(gpu_slices_reach(&s, at(10 * MIB), 1), 0);
    CHECK_EQ(gpu_slices_reach(&s, at(9 * MIB), 2 * MIB), 0);
    CHECK(!gpu_slices_within(&s, at(10 * MIB)) && gpu_slices_within(&s, at(0)), "within");

    CHECK_EQ(stats.pinned_bytes, 6 * MIB);      /* slice 0 was never asked for */
    CHECK_EQ(stats.slices_registered, 2);
    CHECK_EQ(stats.demands, 2);
    gpu_slices_destroy(&s);
    CHECK_EQ(stats.pinned_bytes, 0);            /* unregistered: nothing pinned */
    for (int i = 0; i < 3; i++)
        CHECK(st.regs[i] == (i > 0) && st.unregs[i] == st.regs[i],
              "slice %d: %d registrations, %d unregistrations", i, st.regs[i], st.unregs[i]);
}

static void test_a_copy_never_waits_for_a_registration(void)
{
    struct stub st;
    stub_init(&st, fake_base(), MIB);
    st.hold = 1;
    struct gpu_slices_ops ops = stub_ops(&st);
    struct gpu_slices s;
    struct gpu_slices_stats stats = {0};
    CHECK_EQ(gpu_slices_init(&s, fake_base(), 8 * MIB, 1, MIB, 0, 0, &ops, &stats), 0);

    CHECK_EQ(gpu_slices_reach(&s, at(0), 64), 0);
    pthread_mutex_lock(&st.lock);
    while (!st.held)
        pthread_cond_wait(&st.cond, &st.lock);
    pthread_mutex_unlock(&st.lock);
    /* Slice 0's registration is stuck: asking for it again, or for
     * another slice, still answers at once. */
    for (int k = 0; k < 1000; k++) {
        CHECK_EQ(gpu_slices_reach(&s, at(0), 64), 0);
        CHECK_EQ(gpu_slices_reach(&s, at(3 * MIB), 64), 0);
    }
    pthread_mutex_lock(&st.lock);
    st.hold = 0;
    pthread_cond_broadcast(&st.cond);
    pthread_mutex_unlock(&st.lock);
    CHECK_EQ(gpu_slices_wait_idle(&s, 5000), 1);
    CHECK_EQ(gpu_slices_reach(&s, at(0), 64), 1);
    CHECK_EQ(gpu_slices_reach(&s, at(3 * MIB), 64), 1);
    CHECK_EQ(st.regs[0], 1);
    CHECK_EQ(st.regs[3], 1);
    /* Demanded slices go first, in the order asked. */
    CHECK_EQ(st.order[0], 0);
    CHECK_EQ(st.order[1], 3);
    gpu_slices_destroy(&s);
}

static uint8_t state_of(struct gpu_slices *s, int i)
{
    return __atomic_load_n(&s->slices[i].state, __ATOMIC_ACQUIRE);
}

static void test_failed_and_over_limit_slices_stay_unreachable(void)
{
    struct stub st;
    stub_init(&st, fake_base(), MIB);
    st.fail[1] = 1;
    struct gpu_slices_ops ops = stub_ops(&st);
    struct gpu_slices s;
    struct gpu_slices_stats stats = {0};
    CHECK_EQ(gpu_slices_init(&s, fake_base(), 4 * MIB, 1, MIB, 0, 0, &ops, &stats), 0);
    CHECK_EQ(gpu_slices_evicts(&s), 0);
    gpu_slices_reach(&s, at(1 * MIB), 1);
    CHECK_EQ(gpu_slices_wait_idle(&s, 5000), 1);
    CHECK_EQ(gpu_slices_reach(&s, at(1 * MIB), 1), 0);  /* failed, and never tried again */
    CHECK_EQ(gpu_slices_wait_idle(&s, 5000), 1);
    CHECK_EQ(st.regs[1], 1);
    CHECK_EQ(stats.slices_failed, 1);
    gpu_slices_destroy(&s);
    CHECK_EQ(st.unregs[1], 0);

    /* A limit below one slice: none is ever registered, nor evicted for. */
    stub_init(&st, fake_base(), MIB);
    stats = (struct gpu_slices_stats){0};
    CHECK_EQ(gpu_slices_init(&s, fake_base(), 4 * MIB, 1, MIB, MIB / 2, 0, &ops, &stats), 0);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 4; i++)
            CHECK_EQ(gpu_slices_reach(&s, at((uint64_t)i * MIB), 1), 0);
        CHECK_EQ(gpu_slices_wait_idle(&s, 5000), 1);
    }
    CHECK_EQ(stats.slices_over_limit, 4);   /* once each: over the limit for good */
    CHECK_EQ(st.regs[0] + st.regs[1] + st.regs[2] + st.regs[3], 0);
    gpu_slices_destroy(&s);
}

/* Holds slice i for a copy stamped now; it must be registered. */
static uint32_t hold(struct gpu_slices *s, int i, uint64_t now)
{
    uint32_t slice = UINT32_MAX;
    CHECK_EQ(gpu_slices_hold(s, at((uint64_t)i * MIB + 100), now, &slice), 1);
    CHECK_EQ(slice, i);
    return slice;
}

static void demand_and_settle(struct gpu_slices *s, int i)
{
    uint32_t slice;
    CHECK_EQ(gpu_slices_hold(s, at((uint64_t)i * MIB), 0, &slice), 0);
    CHECK_EQ(gpu_slices_wait_idle(s, 5000), 1);
}

static void test_the_limit_evicts_the_least_recently_used_unheld_slice(void)
{
    struct stub st;
    stub_init(&st, fake_base(), MIB);
    struct gpu_slices_ops ops = stub_ops(&st);
    struct gpu_slices s;
    struct gpu_slices_stats stats = {0};
    /* 3 MiB pinned at most, of 8. */
    CHECK_EQ(gpu_slices_init(&s, fake_base(), 8 * MIB, 1, MIB, 3 * MIB, 0, &ops, &stats), 0);
    CHECK_EQ(gpu_slices_evicts(&s), 1);
    for (int i = 0; i < 3; i++)
        demand_and_settle(&s, i);
    CHECK_EQ(stats.pinned_bytes, 3 * MIB);
    /* Used in the order 0, 2, 1 (copies stamp them); 1 stays held. */
    uint64_t t = gk_now_ns();
    gpu_slices_unhold(&s, hold(&s, 0, t + 1));
    gpu_slices_unhold(&s, hold(&s, 2, t + 2));
    uint32_t held1 = hold(&s, 1, t + 3);

    demand_and_settle(&s, 3);               /* evicts 0, the least recently used */
    CHECK_EQ(state_of(&s, 0), GPU_SLICE_UNREGISTERED);
    CHECK_EQ(st.unregs[0], 1);
    CHECK_EQ(state_of(&s, 3), GPU_SLICE_READY);
    uint32_t held3 = hold(&s, 3, t + 4);
    demand_and_settle(&s, 4);               /* 1 and 3 are held: evicts 2 */
    CHECK_EQ(st.unregs[2], 1);
    CHECK_EQ(st.unregs[1] + st.unregs[3], 0);
    CHECK_EQ(stats.slices_evicted, 2);
    CHECK_EQ(stats.pinned_bytes, 3 * MIB);

    /* Every registered slice held: the next waits, unregistered, and its
     * next demand registers it once one is let go. */
    uint32_t held4 = hold(&s, 4, t + 5);
    demand_and_settle(&s, 5);
    CHECK_EQ(state_of(&s, 5), GPU_SLICE_UNREGISTERED);
    CHECK_EQ(stats.slices_over_limit, 1);
    CHECK_EQ(stats.pinned_bytes, 3 * MIB);
    gpu_slices_unhold(&s, held3);
    demand_and_settle(&s, 5);
    CHECK_EQ(state_of(&s, 5), GPU_SLICE_READY);
    CHECK_EQ(st.unregs[3], 1);
    CHECK_EQ(st.unregs[1] + st.unregs[4], 0);
    /* An evicted slice comes back on demand. */
    gpu_slices_unhold(&s, held1);
    gpu_slices_unhold(&s, held4);
    demand_and_settle(&s, 0);
    CHECK_EQ(state_of(&s, 0), GPU_SLICE_READY);
    CHECK_EQ(st.regs[0], 2);
    CHECK_EQ(stats.pinned_bytes, 3 * MIB);
    gpu_slices_destroy(&s);
    CHECK_EQ(stats.pinned_bytes, 0);
    for (int i = 0; i < 8; i++)
        CHECK_EQ(st.unregs[i], st.regs[i]);
}

static void test_ahead_registers_from_the_start_up_to_its_limit(void)
{
    struct stub st;
    stub_init(&st, fake_base(), MIB);
    struct gpu_slices_ops ops = stub_ops(&st);
    struct gpu_slices s;
    struct gpu_slices_stats stats = {0};
    CHECK_EQ(gpu_slices_init(&s, fake_base(), 16 * MIB, 1, MIB, 0, 5 * MIB, &ops, &stats), 0);
    CHECK_EQ(gpu_slices_wait_idle(&s, 5000), 1);
    for (int i = 0; i < 16; i++)
        CHECK_EQ(st.regs[i], i < 5);
    /* Beyond the ahead limit, demand still registers. */
    CHECK_EQ(gpu_slices_reach(&s, at(12 * MIB), 1), 0);
    CHECK_EQ(gpu_slices_wait_idle(&s, 5000), 1);
    CHECK_EQ(gpu_slices_reach(&s, at(12 * MIB), 1), 1);
    gpu_slices_destroy(&s);
}

static void test_bad_geometry_is_refused(void)
{
    struct stub st;
    stub_init(&st, fake_base(), MIB);
    struct gpu_slices_ops ops = stub_ops(&st);
    struct gpu_slices s;
    struct gpu_slices_stats stats = {0};
    CHECK(gpu_slices_init(&s, fake_base(), 8 * MIB, 1, 3 * MIB, 0, 0, &ops, &stats) < 0,
          "not a power of 2");
    CHECK(gpu_slices_init(&s, fake_base(), 8 * MIB, 1, 4096, 0, 0, &ops, &stats) < 0,
          "below 1 MiB");
    CHECK(gpu_slices_init(&s, fake_base(), 0, 1, MIB, 0, 0, &ops, &stats) < 0, "empty");
    gpu_slices_destroy(&s);     /* a refused init leaves nothing to destroy */
}

/* ------------------------------------------------------------ stress */

#define STRESS_THREADS 8
#define STRESS_SLICES 200

struct stress {
    struct gpu_slices *s;
    unsigned seed;
    int seen_ready;
};

static void *stress_thread(void *arg)
{
    struct stress *t = arg;
    /* 20000 asks, and on until some found their slice ready: the
     * registration thread may not have run at all before on a busy host. */
    for (long k = 0; k < 20000 || (t->seen_ready < 100 && k < 50000000); k++) {
        uint64_t off = (uint64_t)(rand_r(&t->seed) % STRESS_SLICES) * MIB +
                       (uint64_t)(rand_r(&t->seed) % (MIB / 2));
        uint64_t len = 1 + (uint64_t)(rand_r(&t->seed) % MIB);
        if (off + len > (uint64_t)STRESS_SLICES * MIB)
            len = (uint64_t)STRESS_SLICES * MIB - off;
        if (gpu_slices_reach(t->s, at(off), len)) {
            /* READY is published after its dptr. */
            uint64_t d = gpu_slices_dptr(t->s, at(off));
            CHECK_EQ(d, 0x7000000000ull + off);
            t->seen_ready++;
        }
    }
    return NULL;
}

static void test_many_threads_ask_for_slices_at_once(void)
{
    struct stub st;
    stub_init(&st, fake_base(), MIB);
    struct gpu_slices_ops ops = stub_ops(&st);
    struct gpu_slices s;
    struct gpu_slices_stats stats = {0};
    CHECK_EQ(gpu_slices_init(&s, fake_base(), STRESS_SLICES * MIB, 1, MIB, 0, 20 * MIB,
                             &ops, &stats), 0);
    pthread_t th[STRESS_THREADS];
    struct stress t[STRESS_THREADS];
    for (int i = 0; i < STRESS_THREADS; i++) {
        t[i] = (struct stress){&s, (unsigned)i * 7919u + 1, 0};
        CHECK_EQ(pthread_create(&th[i], NULL, stress_thread, &t[i]), 0);
    }
    int seen = 0;
    for (int i = 0; i < STRESS_THREADS; i++) {
        pthread_join(th[i], NULL);
        seen += t[i].seen_ready;
    }
    CHECK_EQ(gpu_slices_wait_idle(&s, 10000), 1);
    CHECK(seen > 0, "no thread ever found a slice ready");
    int registered = 0;
    for (int i = 0; i < STRESS_SLICES; i++) {
        CHECK(st.regs[i] <= 1, "slice %d registered %d times", i, st.regs[i]);
        registered += st.regs[i];
    }
    CHECK(registered > 20, "only %d slices registered", registered);
    CHECK_EQ(stats.slices_registered, registered);
    CHECK_EQ(stats.pinned_bytes, registered * MIB);
    CHECK_EQ(stats.slices_over_limit + stats.slices_evicted, 0);
    gpu_slices_destroy(&s);
    for (int i = 0; i < STRESS_SLICES; i++)
        CHECK_EQ(st.unregs[i], st.regs[i]);
}

/* Threads hold random slices while the limit (a tenth of them) keeps
 * the registration thread evicting: a held slice must stay registered
 * until it is let go, and its address stay its own. */
#define HOLD_SLICES 40

struct holder {
    struct gpu_slices *s;
    struct stub *st;
    unsigned seed;
    long held;
};

static void *hold_thread(void *arg)
{
    struct holder *h = arg;
    for (long k = 0; k < 200000 || (h->held < 100 && k < 50000000); k++) {
        int i = (int)(rand_r(&h->seed) % HOLD_SLICES);
        uint32_t slice;
        if (!gpu_slices_hold(h->s, at((uint64_t)i * MIB + 8), gk_now_ns(), &slice))
            continue;
        CHECK_EQ(slice, i);
        CHECK(__atomic_load_n(&h->st->live[i], __ATOMIC_SEQ_CST), "slice %d held unregistered", i);
        CHECK_EQ(gpu_slices_dptr(h->s, at((uint64_t)i * MIB + 8)), 0x7000000000ull + i * MIB + 8);
        for (int spin = 0; spin < (int)(rand_r(&h->seed) % 64); spin++)
            __asm__ volatile("" ::: "memory");
        CHECK(__atomic_load_n(&h->st->live[i], __ATOMIC_SEQ_CST), "slice %d evicted while held",
              i);
        gpu_slices_unhold(h->s, slice);
        h->held++;
    }
    return NULL;
}

static void test_many_threads_hold_slices_while_the_limit_evicts(void)
{
    struct stub st;
    stub_init(&st, fake_base(), MIB);
    struct gpu_slices_ops ops = stub_ops(&st);
    struct gpu_slices s;
    struct gpu_slices_stats stats = {0};
    CHECK_EQ(gpu_slices_init(&s, fake_base(), HOLD_SLICES * MIB, 1, MIB, HOLD_SLICES / 10 * MIB,
                             0, &ops, &stats), 0);
    pthread_t th[STRESS_THREADS];
    struct holder h[STRESS_THREADS];
    for (int i = 0; i < STRESS_THREADS; i++) {
        h[i] = (struct holder){&s, &st, (unsigned)i * 104729u + 3, 0};
        CHECK_EQ(pthread_create(&th[i], NULL, hold_thread, &h[i]), 0);
    }
    long held = 0;
    for (int i = 0; i < STRESS_THREADS; i++) {
        pthread_join(th[i], NULL);
        held += h[i].held;
    }
    CHECK_EQ(gpu_slices_wait_idle(&s, 10000), 1);
    CHECK(held > 0, "no thread ever held a slice");
    CHECK(stats.slices_evicted > 0, "the limit never evicted");
    CHECK(stats.pinned_bytes <= HOLD_SLICES / 10 * MIB, "pinned past the limit");
    for (int i = 0; i < HOLD_SLICES; i++)
        CHECK_EQ(__atomic_load_n(&s.slices[i].users, __ATOMIC_SEQ_CST), 0);
    printf("  %ld holds, %llu evictions\n", held, (unsigned long long)stats.slices_evicted);
    gpu_slices_destroy(&s);
    for (int i = 0; i < HOLD_SLICES; i++)
        CHECK_EQ(st.unregs[i], st.regs[i]);
}

int main(void)
{
    RUN(test_demand_registers_once_and_maps_addresses);
    RUN(test_a_copy_never_waits_for_a_registration);
    RUN(test_failed_and_over_limit_slices_stay_unreachable);
    RUN(test_the_limit_evicts_the_least_recently_used_unheld_slice);
    RUN(test_ahead_registers_from_the_start_up_to_its_limit);
    RUN(test_bad_geometry_is_refused);
    RUN(test_many_threads_ask_for_slices_at_once);
    RUN(test_many_threads_hold_slices_while_the_limit_evicts);
    return check_done("test_gpu_slices");
}
