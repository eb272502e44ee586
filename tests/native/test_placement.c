/*
 * test_placement.c - placement (native/client/placement.c) and the server
 * table (client_table.c) under ASan/UBSan: the fixed-point log, equal
 * weights routing exactly as the unweighted rendezvous did, shares that
 * follow the weights, replicas over failure domains, and tables swapped
 * while threads run calls on in-process servers.
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "client/placement.h"
#include "client/route.h"
#include "common/common.h"
#include "gdrkv.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t next_random(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}

/* The unweighted rendezvous the client routed by before placement.c. */
static uint32_t legacy_pick(uint64_t key_hash, const uint64_t *seeds, uint32_t n)
{
    uint32_t best = 0;
    uint64_t best_score = gk_mix64(key_hash ^ seeds[0]);
    for (uint32_t i = 1; i < n; i++) {
        uint64_t score = gk_mix64(key_hash ^ seeds[i]);
        if (score > best_score || (score == best_score && seeds[i] > seeds[best])) {
            best = i;
            best_score = score;
        }
    }
    return best;
}

/* -log2 in fixed point: monotone, and within a few units of 2^-32 of the
 * real value (libm is fine in a test: only the client must not use it). */
static void test_neg_log2(void)
{
    CHECK_EQ(placement_neg_log2(0), placement_neg_log2(1));
    CHECK_EQ(placement_neg_log2(1), 64ull << 32);
    CHECK_EQ(placement_neg_log2(1ull << 63), 1ull << 32);
    CHECK(placement_neg_log2(UINT64_MAX) >= 1, "at least 1");
    for (int i = 0; i < 200000; i++) {
        uint64_t a = next_random() >> (next_random() % 64), b = next_random() >> (next_random() % 64);
        if (a > b) {
            uint64_t t = a;
            a = b;
            b = t;
        }
        CHECK(placement_neg_log2(a) >= placement_neg_log2(b), "not monotone at %llu %llu",
              (unsigned long long)a, (unsigned long long)b);
        if (a < (1ull << 20))
            continue;
        double want = -log2((double)a / 18446744073709551616.0) * 4294967296.0;
        double got = (double)placement_neg_log2(a);
        /* Truncation to 32 mantissa bits costs up to 2^-31 relative in x. */
        CHECK(fabs(got - want) < 8.0, "-log2 of %llu: %f, want %f", (unsigned long long)a, got,
              want);
    }
}

static void members_of(struct placement_member *m, uint32_t n, const uint64_t *weights,
                       const uint32_t *domains)
{
    char name[64];
    for (uint32_t i = 0; i < n; i++) {
        snprintf(name, sizeof name, "10.1.%u.%u:7480", i / 200, i % 200 + 1);
        m[i] = (struct placement_member){.seed = route_server_seed(name),
                                         .weight = weights ? weights[i] : 1,
                                         .domain = domains ? domains[i] : i};
    }
}

/* Equal weights: exactly the server the unweighted rendezvous picked,
 * down the uniform shortcut and down the weighted comparison alike. */
static void test_equal_weights_route_as_before(void)
{
    struct placement_member m[16];
    uint64_t seeds[16], scratch[32], w[16];
    uint32_t out[PLACEMENT_MAX_REPLICAS];

    for (uint32_t n = 1; n <= 16; n++) {
        for (uint32_t i = 0; i < n; i++)
            w[i] = 1ull << 34;
        members_of(m, n, w, NULL);
        for (uint32_t i = 0; i < n; i++)
            seeds[i] = m[i].seed;
        for (int k = 0; k < 5000; k++) {
            uint64_t h = next_random();
            uint32_t want = legacy_pick(h, seeds, n);
            CHECK_EQ(placement_rank(h, m, n, 1, 1, 1, scratch, out), 1);
            CHECK_EQ(out[0], want);
            CHECK_EQ(placement_rank(h, m, n, 0, 1, 1, scratch, out), 1);
            CHECK_EQ(out[0], want);
        }
    }
}

/* Weights 1:2:3:6 get their shares of the keys, within 3% of each. */
static void test_shares_follow_weights(void)
{
    enum { N = 4, KEYS = 120000 };
    const uint64_t w[N] = {1ull << 30, 2ull << 30, 3ull << 30, 6ull << 30};
    struct placement_member m[N];
    uint64_t scratch[2 * N];
    uint32_t out[1], count[N] = {0};

    members_of(m, N, w, NULL);
    for (int k = 0; k < KEYS; k++) {
        placement_rank(next_random(), m, N, 0, 1, 1, scratch, out);
        count[out[0]]++;
    }
    for (int i = 0; i < N; i++) {
        double share = (double)count[i] / KEYS, want = (double)w[i] / (12ull << 30);
        CHECK(fabs(share - want) < 0.03 * want + 0.002, "member %d: share %.4f, want %.4f", i,
              share, want);
    }
}

/* A member joining takes keys only for itself, about its weight's share. */
static void test_join_moves_only_its_keys(void)
{
    enum { N = 5, KEYS = 50000 };
    const uint64_t w[N] = {4, 4, 8, 4, 4};
    struct placement_member m[N];
    uint64_t scratch[2 * N];
    uint32_t before[1], after[1], moved = 0;

    members_of(m, N, w, NULL);
    for (int k = 0; k < KEYS; k++) {
        uint64_t h = next_random();
        placement_rank(h, m, N - 1, 0, 1, 1, scratch, before);
        placement_rank(h, m, N, 0, 1, 1, scratch, after);
        if (before[0] != after[0]) {
            CHECK_EQ(after[0], N - 1);
            moved++;
        }
    }
    double share = (double)moved / KEYS;
    CHECK(fabs(share - 4.0 / 24) < 0.01, "moved share %.4f, want %.4f", share, 4.0 / 24);
}

/* Replicas: distinct domains first; then distinct members; leaving ones
 * out when asked. */
static void test_domains_and_leaving(void)
{
    enum { N = 6 };
    const uint32_t domains[N] = {0, 0, 1, 1, 2, 2};
    struct placement_member m[N];
    uint64_t scratch[2 * N];
    uint32_t out[PLACEMENT_MAX_REPLICAS];

    members_of(m, N, NULL, domains);
    m[5].leaving = 1;
    for (int k = 0; k < 20000; k++) {
        uint64_t h = next_random();
        CHECK_EQ(placement_rank(h, m, N, 1, 3, 0, scratch, out), 3);
        CHECK(m[out[0]].domain != m[out[1]].domain && m[out[1]].domain != m[out[2]].domain &&
              m[out[0]].domain != m[out[2]].domain, "three domains");
        CHECK_EQ(placement_rank(h, m, N, 1, 8, 1, scratch, out), 5);
        for (int i = 0; i < 5; i++) {
            CHECK(!m[out[i]].leaving, "a leaving member is no PUT candidate");
            for (int j = 0; j < i; j++)
                CHECK(out[i] != out[j], "distinct members");
        }
        CHECK(m[out[0]].domain != m[out[1]].domain && m[out[1]].domain != m[out[2]].domain &&
              m[out[0]].domain != m[out[2]].domain, "the first three in three domains");
    }
}

/* gdrkv_place: the public form, with addresses and zones. */
static void test_gdrkv_place(void)
{
    gdrkv_member m[4] = {
        {.addr = "10.0.0.1:7480", .capacity = 1 << 20, .zone = "a"},
        {.addr = "10.0.0.2", .capacity = 1 << 20, .zone = "a"},
        {.addr = "10.0.0.3:7480", .capacity = 1 << 20, .zone = "b"},
        {.addr = "10.0.0.4:7480", .capacity = 1 << 20, .leaving = 1},
    };
    uint32_t out[8];
    for (int k = 0; k < 1000; k++) {
        char key[32];
        int len = snprintf(key, sizeof key, "key-%d", k);
        CHECK_EQ(gdrkv_place(key, (size_t)len, m, 4, 2, out), 2);
        CHECK((out[0] == 2) != (out[1] == 2), "one copy in zone b");
        CHECK_EQ(gdrkv_place(key, (size_t)len, m, 4, 8, out), 3);
    }
    gdrkv_member dup[2] = {{.addr = "10.0.0.1:7480", .capacity = 1},
                           {.addr = "10.0.0.1", .capacity = 1}};
    CHECK_EQ(gdrkv_place("k", 1, dup, 2, 1, out), GDRKV_E_INVALID);
    gdrkv_member zero[1] = {{.addr = "10.0.0.1:7480", .capacity = 0}};
    CHECK_EQ(gdrkv_place("k", 1, zero, 1, 1, out), GDRKV_E_INVALID);
    gdrkv_member bad[1] = {{.addr = "10.0.0.1:notaport", .capacity = 1}};
    CHECK_EQ(gdrkv_place("k", 1, bad, 1, 1, out), GDRKV_E_INVALID);
}

/* ------------------------------------------------------------ tables */

enum { SERVERS = 3, THREADS = 3, SWAPS = 150, KEYS = 64 };

struct swap_run {
    gdrkv_client *c;
    volatile int stop;
    uint64_t calls, errors;
};

/* Keys are put and read back while tables change under the calls: every
 * call ends, and a key answers its bytes, a miss, or (a table of none)
 * UNAVAILABLE; nothing else. */
static void *caller(void *arg)
{
    struct swap_run *run = arg;
    char keys[KEYS * 8 + 1];
    uint32_t lens[KEYS], counts[KEYS];
    uint64_t ptrs[KEYS], sizes[KEYS], vals[KEYS], back[KEYS];
    int64_t results[KEYS];

    for (int i = 0; i < KEYS; i++) {
        snprintf(keys + 8 * i, 9, "k%07u", (unsigned)i % 10000000u);
        lens[i] = 8;
        counts[i] = 1;
        vals[i] = 0x1000u + (uint64_t)i;
        sizes[i] = 8;
    }
    while (!run->stop) {
        for (int i = 0; i < KEYS; i++)
            ptrs[i] = (uint64_t)(uintptr_t)&vals[i];
        CHECK_EQ(gdrkv_batch_put(run->c, KEYS, keys, lens, ptrs, sizes, counts, results), 0);
        for (int i = 0; i < KEYS; i++) {
            back[i] = 0;
            ptrs[i] = (uint64_t)(uintptr_t)&back[i];
        }
        CHECK_EQ(gdrkv_batch_get(run->c, KEYS, keys, lens, ptrs, sizes, counts, results), 0);
        for (int i = 0; i < KEYS; i++) {
            int ok = results[i] == 8 ? back[i] == vals[i]
                                     : results[i] == GDRKV_E_NOT_FOUND ||
                                           results[i] == GDRKV_E_UNAVAILABLE;
            CHECK(ok, "key %d: result %lld", i, (long long)results[i]);
        }
        __atomic_add_fetch(&run->calls, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static void test_swap_under_calls(void)
{
    gdrkv_server *servers[SERVERS];
    char addrs[SERVERS][64], err[256] = "";
    gdrkv_server_opts so;
    gdrkv_client_opts co;
    struct swap_run run = {0};
    pthread_t threads[THREADS];

    for (int i = 0; i < SERVERS; i++) {
        gdrkv_server_opts_init(&so);
        so.listen = "127.0.0.1:0";
        so.memory_bytes = 16 << 20;
        so.workers = 1;
        so.hugepages = 0;
        so.pretouch = 0;
        so.unix_path = "";
        CHECK(gdrkv_server_start(&so, &servers[i], err, sizeof err) == 0, "start: %s", err);
        CHECK_EQ(gdrkv_server_address(servers[i], addrs[i], sizeof addrs[i]), 0);
    }
    gdrkv_client_opts_init(&co);
    co.servers = "";
    co.members_later = 1;
    co.replicas = 2;
    co.timeout_ms = 5000;
    co.transport = GDRKV_TRANSPORT_TCP;
    CHECK(gdrkv_client_open(&co, &run.c, err, sizeof err) == 0, "open: %s", err);
    CHECK_EQ(gdrkv_client_nservers(run.c), 0);

    gdrkv_member all[SERVERS];
    for (int i = 0; i < SERVERS; i++)
        all[i] = (gdrkv_member){.addr = addrs[i], .capacity = (uint64_t)(i + 1) << 20};
    for (int t = 0; t < THREADS; t++)
        CHECK_EQ(pthread_create(&threads[t], NULL, caller, &run), 0);
    /* Tables of 0..3 members, some leaving; a bad one refused on the way. */
    for (int s = 0; s < SWAPS; s++) {
        uint32_t n = (uint32_t)(s % (SERVERS + 1));
        gdrkv_member m[SERVERS];
        memcpy(m, all, sizeof m);
        m[0].leaving = s % 3 == 0 && n > 1;
        CHECK(gdrkv_client_set_members(run.c, m, n, err, sizeof err) == 0, "swap: %s", err);
        CHECK_EQ(gdrkv_client_nservers(run.c), n);
        gdrkv_member bad[2] = {all[0], all[0]};
        CHECK_EQ(gdrkv_client_set_members(run.c, bad, 2, err, sizeof err), GDRKV_E_INVALID);
        CHECK(strstr(err, "listed twice"), "err: %s", err);
        CHECK_EQ(gdrkv_client_nservers(run.c), n);
        /* Some calls run on each table. */
        uint64_t seen = __atomic_load_n(&run.calls, __ATOMIC_RELAXED);
        while (__atomic_load_n(&run.calls, __ATOMIC_RELAXED) < seen + THREADS)
            sched_yield();
    }
    run.stop = 1;
    for (int t = 0; t < THREADS; t++)
        CHECK_EQ(pthread_join(threads[t], NULL), 0);
    CHECK(run.calls > 0, "calls ran");

    /* Servers kept across swaps keep their connections: swapping between
     * two tables that share every server opens nothing new. */
    CHECK(gdrkv_client_set_members(run.c, all, SERVERS, err, sizeof err) == 0, "%s", err);
    CHECK_EQ(gdrkv_ping(run.c), 0);
    char text[8192];
    CHECK(gdrkv_client_stats(run.c, text, sizeof text) > 0, "stats");
    long long connects = strtoll(strstr(text, "\nconnects ") + 10, NULL, 10);
    for (int s = 0; s < 20; s++) {
        all[1].leaving = s % 2;
        CHECK(gdrkv_client_set_members(run.c, all, SERVERS, err, sizeof err) == 0, "%s", err);
        CHECK_EQ(gdrkv_ping(run.c), 0);
    }
    CHECK(gdrkv_client_stats(run.c, text, sizeof text) > 0, "stats");
    CHECK_EQ(strtoll(strstr(text, "\nconnects ") + 10, NULL, 10), connects);
    CHECK(strtoll(strstr(text, "\nmembership_changes ") + 20, NULL, 10) >= SWAPS + 21,
          "membership_changes counted");
    gdrkv_client_close(run.c);
    for (int i = 0; i < SERVERS; i++)
        gdrkv_server_stop(servers[i]);
}

int main(void)
{
    RUN(test_neg_log2);
    RUN(test_equal_weights_route_as_before);
    RUN(test_shares_follow_weights);
    RUN(test_join_moves_only_its_keys);
    RUN(test_domains_and_leaving);
    RUN(test_gdrkv_place);
    RUN(test_swap_under_calls);
    return check_done("test_placement");
}
