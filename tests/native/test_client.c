/*
 * test_client.c - the client (native/client*.c, route.c) against the real
 * in-process server, and against a fake server (a thread in this file)
 * that misbehaves on purpose: never answers, answers half a header,
 * closes mid-payload, sends garbage or sizes that don't fit. Timeouts are
 * short, so every failure case is bounded; elapsed times are checked
 * against the client's deadline promise.
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "common/common.h"
#include "gdrkv.h"
#include "common/net.h"
#include "common/protocol.h"
#include "client/route.h"

#define POOL_BYTES (192ull << 20)
/* Bounds a loaded 2-core CI machine under ASan keeps: a call within the
 * timeout may overrun it by SLACK_MS; a short-circuited call takes at most
 * INSTANT_MS, still five times less than paying the timeout. */
#define TIMEOUT_MS 1000
#define SLACK_MS 250
#define INSTANT_MS (TIMEOUT_MS / 5)
#define MAX_SEGS 6

/* RUN for tests that share one server and client. */
#define RUN_WITH(test, arg)                   \
    do {                                      \
        test(arg);                            \
        check_passed++;                       \
        printf("ok %s\n", #test);             \
        fflush(stdout);                       \
    } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t ms_since(uint64_t start_ns)
{
    return (gk_now_ns() - start_ns) / 1000000u;
}

/* ------------------------------------------------------------ servers */

static gdrkv_server *start_server(const char *listen)
{
    gdrkv_server_opts o;
    gdrkv_server *s = NULL;
    char err[256] = "";

    gdrkv_server_opts_init(&o);
    o.listen = listen;
    o.memory_bytes = POOL_BYTES;
    o.workers = 2;
    o.hugepages = 0;
    o.pretouch = 0;
    CHECK(gdrkv_server_start(&o, &s, err, sizeof err) == 0, "server start: %s", err);
    return s;
}

static void address_of(gdrkv_server *s, char *buf, size_t len)
{
    CHECK(gdrkv_server_address(s, buf, len) == 0, "server address");
}

static gdrkv_client *open_client_over(const char *servers, uint32_t timeout_ms, int transport)
{
    gdrkv_client_opts o;
    gdrkv_client *c = NULL;
    char err[256] = "";

    gdrkv_client_opts_init(&o);
    o.servers = servers;
    o.timeout_ms = timeout_ms;
    o.connect_timeout_ms = timeout_ms;
    o.ns = "test";
    o.transport = transport;
    CHECK(gdrkv_client_open(&o, &c, err, sizeof err) == 0, "client open: %s", err);
    return c;
}

static gdrkv_client *open_client(const char *servers, uint32_t timeout_ms)
{
    return open_client_over(servers, timeout_ms, GDRKV_TRANSPORT_AUTO);
}

/* One counter from a "name value\n" text; -1 when absent. */
static int64_t stat_in(const char *text, const char *name)
{
    size_t len = strlen(name);
    for (const char *line = text; line; line = strchr(line, '\n')) {
        line += *line == '\n';
        if (!strncmp(line, name, len) && line[len] == ' ')
            return strtoll(line + len + 1, NULL, 10);
    }
    return -1;
}

static int64_t client_stat(gdrkv_client *c, const char *name)
{
    char text[8192];
    CHECK(gdrkv_client_stats(c, text, sizeof text) > 0, "client stats");
    return stat_in(text, name);
}

/* ------------------------------------------------------------ batches */

/* The arrays of one batch call, built key by key. */
struct batch {
    uint32_t n, nsegs;
    size_t keys_used;
    char keys[16 << 20];
    uint32_t key_lens[32768];
    uint32_t seg_counts[32768];
    int64_t results[32768];
    uint64_t seg_ptrs[65536];
    uint64_t seg_lens[65536];
};

static struct batch *batch_new(void)
{
    struct batch *b = calloc(1, sizeof *b);
    CHECK(b, "malloc");
    return b;
}

static void batch_key(struct batch *b, const char *fmt, uint64_t id)
{
    int len = snprintf(b->keys + b->keys_used, sizeof b->keys - b->keys_used, fmt,
                       (unsigned long long)id);
    b->key_lens[b->n] = (uint32_t)len;
    b->seg_counts[b->n] = 0;
    b->keys_used += (size_t)len;
    b->n++;
}

static void batch_seg(struct batch *b, const void *ptr, uint64_t len)
{
    b->seg_ptrs[b->nsegs] = (uint64_t)(uintptr_t)ptr;
    b->seg_lens[b->nsegs] = len;
    b->nsegs++;
    b->seg_counts[b->n - 1]++;
}

/* Lays len bytes at buf over up to MAX_SEGS segments cut at random,
 * empty ones included. */
static void batch_split(struct batch *b, uint8_t *buf, uint64_t len)
{
    uint32_t nsegs = 1 + (uint32_t)(check_rand(&rng) % MAX_SEGS);
    uint64_t at = 0;
    for (uint32_t s = 1; s < nsegs; s++) {
        uint64_t cut = at + check_rand(&rng) % (len - at + 1);
        batch_seg(b, buf + at, cut - at);
        at = cut;
    }
    batch_seg(b, buf + at, len - at);
}

static int put(gdrkv_client *c, struct batch *b)
{
    return gdrkv_batch_put(c, b->n, b->keys, b->key_lens, b->seg_ptrs, b->seg_lens,
                           b->seg_counts, b->results);
}

static int get(gdrkv_client *c, struct batch *b)
{
    return gdrkv_batch_get(c, b->n, b->keys, b->key_lens, b->seg_ptrs, b->seg_lens,
                           b->seg_counts, b->results);
}

static int exists(gdrkv_client *c, struct batch *b)
{
    return gdrkv_batch_exists(c, b->n, b->keys, b->key_lens, b->results);
}

static void fill(uint8_t *buf, uint64_t len, uint64_t seed)
{
    for (uint64_t i = 0; i < len; i++)
        buf[i] = (uint8_t)(gk_mix64(seed + i / 8) >> (8 * (i % 8)));
}

/* ------------------------------------------------------------ tests */

static void test_options(void)
{
    gdrkv_client_opts o;
    gdrkv_client *c = NULL;
    char err[256], long_ns[300];

    gdrkv_client_opts_init(&o);
    CHECK_EQ(o.timeout_ms, 5000);
    CHECK_EQ(o.connect_timeout_ms, 1000);
    CHECK_EQ(o.conns, 4);
    CHECK_EQ(o.backoff_min_ms, 100);
    CHECK_EQ(o.backoff_max_ms, 5000);
    CHECK(!strcmp(o.ns, ""), "default namespace");

    const char *bad_lists[] = {"", "a:1,,b:2", "a:1,", "host:99999", "a:1, a:1", "x:7480,x"};
    for (size_t i = 0; i < GK_ARRAY_LEN(bad_lists); i++) {
        o.servers = bad_lists[i];
        err[0] = '\0';
        CHECK_EQ(gdrkv_client_open(&o, &c, err, sizeof err), GDRKV_E_INVALID);
        CHECK(c == NULL && err[0], "'%s' rejected with a message", bad_lists[i]);
    }
    o.servers = "127.0.0.1:1";
    memset(long_ns, 'n', sizeof long_ns - 1);
    long_ns[sizeof long_ns - 1] = '\0';
    o.ns = long_ns;
    CHECK_EQ(gdrkv_client_open(&o, &c, err, sizeof err), GDRKV_E_INVALID);
    o.ns = "";
    o.conns = 0;
    CHECK_EQ(gdrkv_client_open(&o, &c, err, sizeof err), GDRKV_E_INVALID);
    o.conns = 65;
    CHECK_EQ(gdrkv_client_open(&o, &c, err, sizeof err), GDRKV_E_INVALID);
    o.conns = 4;
    o.timeout_ms = 0;
    CHECK_EQ(gdrkv_client_open(&o, &c, err, sizeof err), GDRKV_E_INVALID);
    o.timeout_ms = 100;

    /* Nothing listens there: opening still works, keys just fail. */
    o.servers = " 127.0.0.1:1 ,localhost,[::1]:9";
    CHECK_EQ(gdrkv_client_open(&o, &c, err, sizeof err), 0);
    CHECK_EQ(gdrkv_client_nservers(c), 3);
    char name[64];
    CHECK_EQ(gdrkv_client_server_name(c, 1, name, sizeof name), 0);
    CHECK(!strcmp(name, "localhost:7480"), "default port: %s", name);
    CHECK_EQ(gdrkv_client_server_name(c, 2, name, sizeof name), 0);
    CHECK(!strcmp(name, "[::1]:9"), "v6 name: %s", name);
    CHECK_EQ(gdrkv_client_server_name(c, 3, name, sizeof name), GDRKV_E_INVALID);
    CHECK(gdrkv_ping(c) < 0, "ping of nothing fails");

    CHECK_EQ(gdrkv_client_register(c, 0x10000, 4096), 0);
    CHECK_EQ(gdrkv_client_register(c, 0x10800, 4096), GDRKV_E_INVALID);
    CHECK_EQ(gdrkv_client_register(c, 0x0f000, 4097), GDRKV_E_INVALID);
    CHECK_EQ(gdrkv_client_register(c, 0x20000, 0), GDRKV_E_INVALID);
    CHECK_EQ(gdrkv_client_register(c, 0x11000, 4096), 0);
    CHECK_EQ(gdrkv_client_unregister(c, 0x10800), GDRKV_E_NOT_FOUND);
    CHECK_EQ(gdrkv_client_unregister(c, 0x10000), 0);
    CHECK_EQ(gdrkv_client_unregister(c, 0x10000), GDRKV_E_NOT_FOUND);
    gdrkv_client_close(c);

    /* A closed client is a NULL handle to the binding. */
    int64_t r;
    uint32_t len = 1;
    CHECK_EQ(gdrkv_batch_exists(NULL, 1, "k", &len, &r), GDRKV_E_CLOSED);
    CHECK_EQ(gdrkv_ping(NULL), GDRKV_E_CLOSED);
    CHECK_EQ(gdrkv_client_stats(NULL, err, sizeof err), GDRKV_E_CLOSED);
}

/* The unweighted rendezvous the client routed by before placement.c:
 * placement must give every key of a static list the same server
 * (test_placement.c checks that for random keys and lists). */
static uint32_t route_pick(uint64_t key_hash, const uint64_t *seeds, uint32_t nservers)
{
    uint32_t best = 0;
    uint64_t best_score = gk_mix64(key_hash ^ seeds[0]);
    for (uint32_t i = 1; i < nservers; i++) {
        uint64_t score = gk_mix64(key_hash ^ seeds[i]);
        if (score > best_score || (score == best_score && seeds[i] > seeds[best])) {
            best = i;
            best_score = score;
        }
    }
    return best;
}

/* Rendezvous hashing: spread evenly, and a new server takes keys only for
 * itself. */
static void test_routing(void)
{
    uint64_t seeds[4] = {route_server_seed("10.0.0.1:7480"), route_server_seed("10.0.0.2:7480"),
                         route_server_seed("10.0.0.3:7480"), route_server_seed("10.0.0.4:7480")};
    uint32_t per_server[4] = {0}, moved = 0;
    char key[32];

    for (uint32_t i = 0; i < 30000; i++) {
        int len = snprintf(key, sizeof key, "page-%u", i);
        uint64_t h = route_key_hash(key, (size_t)len);
        uint32_t before = route_pick(h, seeds, 3), after = route_pick(h, seeds, 4);
        per_server[before]++;
        if (before != after) {
            CHECK_EQ(after, 3);
            moved++;
        }
    }
    for (int s = 0; s < 3; s++)
        CHECK(per_server[s] > 9000 && per_server[s] < 11000, "server %d has %u keys", s,
              per_server[s]);
    CHECK(moved > 6500 && moved < 8500, "%u keys moved to the new server", moved);
}

/* Objects of random sizes, values and destinations both cut into random
 * segments, in one batch: byte-exact, and nothing written past the
 * object's size. */
static void test_round_trip(gdrkv_client *c)
{
    enum { N = 300 };
    struct batch *b = batch_new();
    uint8_t *src[N], *dst[N];
    uint64_t len[N], slack[N];

    for (uint32_t i = 0; i < N; i++) {
        /* Mostly small, some over a stripe's worth, a few empty. */
        uint64_t r = check_rand(&rng);
        len[i] = i % 50 == 0 ? 0 : r % 8 == 0 ? r % (1u << 20) : r % 5000;
        slack[i] = check_rand(&rng) % 64;
        src[i] = malloc(len[i] + 1);
        dst[i] = malloc(len[i] + slack[i] + 1);
        CHECK(src[i] && dst[i], "malloc");
        fill(src[i], len[i], i * 7919 + 1);
        memset(dst[i], 0xee, len[i] + slack[i]);
        batch_key(b, "round-trip/%llu", i);
        batch_split(b, src[i], len[i]);
    }
    CHECK_EQ(put(c, b), 0);
    for (uint32_t i = 0; i < N; i++)
        CHECK_EQ(b->results[i], 0);

    b->n = b->nsegs = 0;
    b->keys_used = 0;
    for (uint32_t i = 0; i < N; i++) {
        batch_key(b, "round-trip/%llu", i);
        batch_split(b, dst[i], len[i] + slack[i]);
    }
    CHECK_EQ(get(c, b), 0);
    for (uint32_t i = 0; i < N; i++) {
        CHECK_EQ(b->results[i], len[i]);
        CHECK(!memcmp(src[i], dst[i], len[i]), "object %u byte-exact", i);
        for (uint64_t j = len[i]; j < len[i] + slack[i]; j++)
            CHECK(dst[i][j] == 0xee, "object %u: byte %llu past the end untouched", i,
                  (unsigned long long)j);
    }
    CHECK_EQ(exists(c, b), 0);
    for (uint32_t i = 0; i < N; i++)
        CHECK_EQ(b->results[i], len[i]);
    for (uint32_t i = 0; i < N; i++) {
        free(src[i]);
        free(dst[i]);
    }
    free(b);
}

/* gdrkv_get_alloc: objects of any size, the empty one and a miss, each one
 * GET call whose memory is the caller's to free (ASan: none leaks). */
static void test_get_alloc(gdrkv_client *c)
{
    static const uint64_t sizes[] = {0, 1, 4096, 3u << 20};
    struct batch *b = batch_new();
    uint8_t *src[GK_ARRAY_LEN(sizes)];

    for (uint32_t i = 0; i < GK_ARRAY_LEN(sizes); i++) {
        src[i] = malloc(sizes[i] + 1);
        CHECK(src[i], "malloc");
        fill(src[i], sizes[i], i + 17);
        batch_key(b, "alloc/%llu", i);
        batch_seg(b, src[i], sizes[i]);
    }
    CHECK_EQ(put(c, b), 0);
    int64_t gets = client_stat(c, "calls_get"), misses = client_stat(c, "misses");
    for (uint32_t i = 0; i < GK_ARRAY_LEN(sizes); i++) {
        char key[32];
        uint8_t *value = (uint8_t *)"untouched";
        int64_t result = 0;
        int len = snprintf(key, sizeof key, "alloc/%u", i);
        CHECK_EQ(gdrkv_get_alloc(c, key, (uint32_t)len, &value, &result), 0);
        CHECK_EQ(result, (int64_t)sizes[i]);
        CHECK(value && !memcmp(value, src[i], sizes[i]), "object %u byte-exact", i);
        gdrkv_free(value);
        free(src[i]);
    }
    uint8_t *value = (uint8_t *)"untouched";
    int64_t result = 0;
    CHECK_EQ(gdrkv_get_alloc(c, "alloc/none", 10, &value, &result), 0);
    CHECK_EQ(result, GDRKV_E_NOT_FOUND);
    CHECK(value == NULL, "a miss gives no memory");
    CHECK_EQ(gdrkv_get_alloc(c, "", 0, &value, &result), 0);
    CHECK_EQ(result, GDRKV_E_INVALID);
    CHECK_EQ(client_stat(c, "calls_get") - gets, (int64_t)GK_ARRAY_LEN(sizes) + 2);
    CHECK_EQ(client_stat(c, "misses") - misses, 1);
    free(b);
}

/* Large values are striped over several connections (counted on a
 * client of its own, whose pool starts empty). */
static void test_striping(gdrkv_client *shared)
{
    enum { N = 24, LEN = 600 << 10 };
    struct batch *b = batch_new();
    char addr[64];
    CHECK_EQ(gdrkv_client_server_name(shared, 0, addr, sizeof addr), 0);
    gdrkv_client *c = open_client(addr, 5000);
    uint8_t *src = malloc((size_t)N * LEN), *dst = malloc((size_t)N * LEN);
    CHECK(src && dst, "malloc");

    fill(src, (uint64_t)N * LEN, 42);
    for (uint32_t i = 0; i < N; i++) {
        batch_key(b, "stripe/%llu", i);
        batch_seg(b, src + (size_t)i * LEN, LEN);
    }
    CHECK_EQ(put(c, b), 0);
    CHECK_EQ(client_stat(c, "connects"), 4);
    for (uint32_t i = 0; i < N; i++) {
        CHECK_EQ(b->results[i], 0);
        b->seg_ptrs[i] = (uint64_t)(uintptr_t)(dst + (size_t)i * LEN);
    }
    CHECK_EQ(get(c, b), 0);
    for (uint32_t i = 0; i < N; i++)
        CHECK_EQ(b->results[i], LEN);
    CHECK(!memcmp(src, dst, (size_t)N * LEN), "striped values byte-exact");
    CHECK_EQ(client_stat(c, "connects"), 4);
    gdrkv_client_close(c);
    free(src);
    free(dst);
    free(b);
}

/* More keys than one frame holds: several frames follow each other on a
 * connection. */
static void test_many_keys(gdrkv_client *c)
{
    enum { N = 20000 };
    struct batch *b = batch_new();
    uint64_t *vals = malloc(N * sizeof *vals);
    CHECK(vals, "malloc");

    for (uint32_t i = 0; i < N; i++) {
        vals[i] = gk_mix64(i);
        batch_key(b, "many/%llu", i);
        batch_seg(b, &vals[i], sizeof vals[i]);
    }
    CHECK_EQ(put(c, b), 0);
    for (uint32_t i = 0; i < N; i++)
        CHECK_EQ(b->results[i], 0);
    memset(vals, 0, N * sizeof *vals);
    CHECK_EQ(get(c, b), 0);
    for (uint32_t i = 0; i < N; i++) {
        CHECK_EQ(b->results[i], 8);
        CHECK(vals[i] == gk_mix64(i), "value %u", i);
    }
    CHECK_EQ(gdrkv_batch_delete(c, b->n, b->keys, b->key_lens, b->results), 0);
    for (uint32_t i = 0; i < N; i++)
        CHECK_EQ(b->results[i], 0);
    CHECK_EQ(exists(c, b), 0);
    for (uint32_t i = 0; i < N; i++)
        CHECK_EQ(b->results[i], GDRKV_E_NOT_FOUND);
    free(vals);
    free(b);
}

/* Long keys: the request body limit, not the key count, cuts the frames. */
static void test_long_keys(gdrkv_client *c)
{
    enum { N = 2500, KEY_LEN = 4000 };
    static char fmt[KEY_LEN + 8];
    struct batch *b = batch_new();
    uint32_t *vals = malloc(N * sizeof *vals);
    CHECK(vals, "malloc");

    memset(fmt, 'x', KEY_LEN - 8);
    strcpy(fmt + KEY_LEN - 8, "%08llx");
    CHECK((uint64_t)N * (KEY_LEN + GK_ENTRY_HDR_SIZE) > GK_MAX_BODY, "needs several frames");
    for (uint32_t i = 0; i < N; i++) {
        vals[i] = i;
        batch_key(b, fmt, i);
        batch_seg(b, &vals[i], sizeof vals[i]);
    }
    CHECK_EQ(put(c, b), 0);
    for (uint32_t i = 0; i < N; i++)
        CHECK_EQ(b->results[i], 0);
    memset(vals, 0xff, N * sizeof *vals);
    CHECK_EQ(get(c, b), 0);
    for (uint32_t i = 0; i < N; i++) {
        CHECK_EQ(b->results[i], sizeof vals[i]);
        CHECK_EQ(vals[i], i);
    }
    free(vals);
    free(b);
}

/* Put-if-absent, a destination too small, misses and bad keys, all in
 * batches where the other keys still work. */
static void test_key_results(gdrkv_client *c)
{
    struct batch *b = batch_new();
    char first[] = "first value", second[] = "second, longer value", out[64], tiny[4];

    batch_key(b, "pia/%llu", 1);
    batch_seg(b, first, sizeof first);
    CHECK_EQ(put(c, b), 0);
    CHECK_EQ(b->results[0], 0);
    b->seg_ptrs[0] = (uint64_t)(uintptr_t)second;
    b->seg_lens[0] = sizeof second;
    CHECK_EQ(put(c, b), 0);
    CHECK_EQ(b->results[0], 0);

    b->seg_ptrs[0] = (uint64_t)(uintptr_t)out;
    b->seg_lens[0] = sizeof out;
    batch_key(b, "pia/%llu", 1);
    batch_seg(b, tiny, sizeof tiny);
    batch_key(b, "missing/%llu", 1);
    batch_seg(b, out, sizeof out);
    CHECK_EQ(get(c, b), 0);
    CHECK_EQ(b->results[0], sizeof first);
    CHECK(!strcmp(out, first), "the first put wins: %s", out);
    CHECK_EQ(b->results[1], GDRKV_E_TOO_SMALL);
    CHECK_EQ(b->results[2], GDRKV_E_NOT_FOUND);

    /* Bad keys fail alone; key 0 still goes through. Key 2 is the last,
     * so its length is never used to find a key after it. */
    b->key_lens[1] = 0;
    b->key_lens[2] = GK_MAX_KEY_LEN + 1;
    CHECK_EQ(get(c, b), 0);
    CHECK_EQ(b->results[0], sizeof first);
    CHECK_EQ(b->results[1], GDRKV_E_INVALID);
    CHECK_EQ(b->results[2], GDRKV_E_INVALID);

    b->n = b->nsegs = 0;
    b->keys_used = 0;
    batch_key(b, "null/%llu", 1);
    batch_seg(b, NULL, 10);
    batch_key(b, "huge/%llu", 1);
    batch_seg(b, out, GK_MAX_OBJECT);
    batch_seg(b, out, 1);
    batch_key(b, "segs/%llu", 1);
    b->seg_counts[2] = GK_MAX_SEGMENTS + 1;
    CHECK_EQ(put(c, b), 0);
    CHECK_EQ(b->results[0], GDRKV_E_INVALID);
    CHECK_EQ(b->results[1], GDRKV_E_TOO_LARGE);
    CHECK_EQ(b->results[2], GDRKV_E_INVALID);

    CHECK_EQ(gdrkv_batch_get(c, 1, NULL, b->key_lens, b->seg_ptrs, b->seg_lens, b->seg_counts,
                             b->results), GDRKV_E_INVALID);
    CHECK_EQ(gdrkv_batch_get(c, 0, NULL, NULL, NULL, NULL, NULL, NULL), 0);
    free(b);
}

static void test_admin(gdrkv_client *c)
{
    char text[16384];
    struct batch *b = batch_new();
    char val[] = "v";

    CHECK_EQ(gdrkv_ping(c), 0);
    for (uint32_t i = 0; i < 10; i++) {
        batch_key(b, "admin/%llu", i);
        batch_seg(b, val, sizeof val);
    }
    CHECK_EQ(put(c, b), 0);
    int64_t removed = gdrkv_clear(c);
    CHECK(removed >= 10, "clear removed %lld", (long long)removed);
    CHECK_EQ(exists(c, b), 0);
    CHECK_EQ(b->results[0], GDRKV_E_NOT_FOUND);

    int len = gdrkv_client_server_stats(c, 0, text, sizeof text);
    CHECK(len > 0 && (size_t)len == strlen(text), "server stats: %d", len);
    CHECK_EQ(gdrkv_client_server_stats(c, 0, text, 8), 7);
    CHECK_EQ(strlen(text), 7);
    CHECK_EQ(gdrkv_client_server_stats(c, 99, text, sizeof text), GDRKV_E_INVALID);

    CHECK(gdrkv_client_stats(c, text, sizeof text) > 0, "client stats");
    CHECK(stat_in(text, "calls_put") >= 1 && stat_in(text, "keys_put") >= 10, "put counters");
    CHECK(stat_in(text, "bytes_sent") > 0 && stat_in(text, "bytes_received") > 0, "bytes");
    CHECK(stat_in(text, "latency_get_count") >= 1, "latency");
    CHECK_EQ(stat_in(text, "servers_down"), 0);
    free(b);
}

struct worker_arg {
    gdrkv_client *c;
    uint32_t id;
};

static void *worker(void *p)
{
    struct worker_arg *a = p;
    struct batch *b = batch_new();
    enum { KEYS = 8, ROUNDS = 150, MAX_LEN = 20000 };
    uint8_t *src = malloc(KEYS * MAX_LEN), *dst = malloc(KEYS * MAX_LEN);
    uint64_t r = a->id + 1;
    CHECK(src && dst, "malloc");

    for (uint32_t round = 0; round < ROUNDS; round++) {
        uint64_t lens[KEYS];
        b->n = b->nsegs = 0;
        b->keys_used = 0;
        for (uint32_t k = 0; k < KEYS; k++) {
            uint64_t id = ((uint64_t)a->id << 32) | (round * KEYS + k);
            lens[k] = check_rand(&r) % MAX_LEN;
            fill(src + k * MAX_LEN, lens[k], id);
            batch_key(b, "thread/%llx", id);
            batch_seg(b, src + k * MAX_LEN, lens[k]);
        }
        CHECK_EQ(put(a->c, b), 0);
        for (uint32_t k = 0; k < KEYS; k++) {
            CHECK_EQ(b->results[k], 0);
            b->seg_ptrs[k] = (uint64_t)(uintptr_t)(dst + k * MAX_LEN);
            b->seg_lens[k] = MAX_LEN;
        }
        CHECK_EQ(get(a->c, b), 0);
        for (uint32_t k = 0; k < KEYS; k++) {
            CHECK_EQ(b->results[k], lens[k]);
            CHECK(!memcmp(src + k * MAX_LEN, dst + k * MAX_LEN, lens[k]), "thread value");
        }
    }
    free(src);
    free(dst);
    free(b);
    return NULL;
}

static void test_threads(gdrkv_client *c)
{
    enum { THREADS = 4 };
    pthread_t t[THREADS];
    struct worker_arg args[THREADS];

    for (uint32_t i = 0; i < THREADS; i++) {
        args[i] = (struct worker_arg){c, i};
        CHECK(pthread_create(&t[i], NULL, worker, &args[i]) == 0, "thread");
    }
    for (uint32_t i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
}

/* The suite runs over both transports of a local server; the counters
 * say which one really moved the bytes. */
static void test_one_server(int transport)
{
    char addr[64];
    gdrkv_server *s = start_server("127.0.0.1:0");
    address_of(s, addr, sizeof addr);
    gdrkv_client *c = open_client_over(addr, 5000, transport);

    printf("-- over %s\n", transport == GDRKV_TRANSPORT_SHM ? "shm" : "tcp");
    RUN_WITH(test_round_trip, c);
    RUN_WITH(test_get_alloc, c);
    RUN_WITH(test_striping, c);
    RUN_WITH(test_many_keys, c);
    RUN_WITH(test_long_keys, c);
    RUN_WITH(test_key_results, c);
    RUN_WITH(test_admin, c);
    RUN_WITH(test_threads, c);
    int shm = transport == GDRKV_TRANSPORT_SHM;
    CHECK_EQ(client_stat(c, "shm_connects") > 0, shm);
    CHECK_EQ(client_stat(c, "shm_bytes_copied") > 0, shm);
    CHECK_EQ(client_stat(c, "shm_connects") == client_stat(c, "connects"), shm);
    gdrkv_client_close(c);
    gdrkv_server_stop(s);
}

/* ------------------------------------------------------------ a fake server */

enum fake_mode {
    FAKE_SILENT,            /* reads requests, never answers */
    FAKE_HALF_HEADER,       /* answers half a header, then stalls */
    FAKE_CLOSE_MID_PAYLOAD, /* GET: header, results, half the values, close */
    FAKE_GARBAGE,           /* 40 bytes that are not a header */
    FAKE_OVERSIZE,          /* GET: objects one byte larger than asked for */
    FAKE_REFUSE             /* a frame error status with a message */
};

struct fake {
    int listen_fd;
    int stop;
    enum fake_mode mode;
    pthread_t thread;
    char addr[64];
};

static int read_full(int fd, void *buf, size_t len)
{
    for (uint8_t *p = buf; len;) {
        ssize_t n = recv(fd, p, len, 0);
        if (n <= 0)
            return 0;
        p += n;
        len -= (size_t)n;
    }
    return 1;
}

static void send_full(int fd, const void *buf, size_t len)
{
    for (const uint8_t *p = buf; len;) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n <= 0)
            return;     /* the client gave up on us: nothing left to do */
        p += n;
        len -= (size_t)n;
    }
}

/* Sends the first `upto` bytes of a response (header, then body). */
static void fake_respond(int fd, const struct gk_hdr *req, int32_t status, uint32_t count,
                         const uint8_t *body, uint32_t body_len, uint64_t payload_len,
                         size_t upto)
{
    uint8_t raw[GK_HDR_SIZE];
    struct gk_hdr h = {.magic = GK_MAGIC, .version = GK_VERSION,
                       .opcode = req->opcode | GK_OP_RESPONSE, .status = status,
                       .count = count, .body_len = body_len, .payload_len = payload_len,
                       .req_id = req->req_id};
    gk_hdr_encode(&h, raw);
    send_full(fd, raw, GK_MIN(upto, sizeof raw));
    if (upto > sizeof raw)
        send_full(fd, body, GK_MIN(upto - sizeof raw, body_len));
}

/* Reads one request from fd and answers it the fake's way; 0 closes fd. */
static int fake_serve(struct fake *f, int fd)
{
    uint8_t raw[GK_HDR_SIZE], scratch[4096];
    struct gk_hdr h;
    struct gk_ns ns;
    static struct gk_entry entries[GK_MAX_KEYS];
    static uint8_t body[1 << 20], results[GK_MAX_KEYS * GK_RESULT_SIZE];

    if (!read_full(fd, raw, sizeof raw))
        return 0;
    gk_hdr_decode(raw, &h);
    CHECK(gk_check_request_hdr(&h) == 0 && h.body_len <= sizeof body, "fake: request header");
    CHECK(read_full(fd, body, h.body_len), "fake: body");
    for (uint64_t left = h.payload_len; left;) {
        size_t n = (size_t)GK_MIN(left, sizeof scratch);
        CHECK(read_full(fd, scratch, n), "fake: payload");
        left -= n;
    }
    if (gk_op_is_keyed(h.opcode))
        CHECK(gk_parse_request_body(&h, body, &ns, entries) == 0, "fake: body parses");

    uint64_t payload = 0;
    for (uint32_t i = 0; i < h.count; i++) {
        uint64_t size = entries[i].size + (f->mode == FAKE_OVERSIZE);
        gk_result_encode(results + i * GK_RESULT_SIZE, 0, size);
        payload += size;
    }
    switch (f->mode) {
    case FAKE_SILENT:
        return 1;
    case FAKE_HALF_HEADER:
        fake_respond(fd, &h, 0, h.count, results, h.count * GK_RESULT_SIZE, payload,
                     GK_HDR_SIZE / 2);
        return 1;
    case FAKE_GARBAGE:
        memset(scratch, 0xab, GK_HDR_SIZE);
        send_full(fd, scratch, GK_HDR_SIZE);
        return 1;
    case FAKE_REFUSE:
        fake_respond(fd, &h, GDRKV_E_NO_SPACE, 0, (const uint8_t *)"pool full", 9, 0, SIZE_MAX);
        return 1;
    case FAKE_OVERSIZE:
        fake_respond(fd, &h, 0, h.count, results, h.count * GK_RESULT_SIZE, payload, SIZE_MAX);
        return 1;
    case FAKE_CLOSE_MID_PAYLOAD:
        fake_respond(fd, &h, 0, h.count, results, h.count * GK_RESULT_SIZE, payload, SIZE_MAX);
        memset(scratch, 0x55, sizeof scratch);
        send_full(fd, scratch, (size_t)GK_MIN(payload / 2, sizeof scratch));
        return 0;
    }
    return 0;
}

static void *fake_main(void *p)
{
    struct fake *f = p;
    struct pollfd fds[16] = {{.fd = f->listen_fd, .events = POLLIN}};
    nfds_t n = 1;

    while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
        if (poll(fds, n, 20) <= 0)
            continue;
        for (nfds_t i = 1; i < n; i++) {
            if (fds[i].revents && !fake_serve(f, fds[i].fd)) {
                close(fds[i].fd);
                fds[i--] = fds[--n];
            }
        }
        int fd = (fds[0].revents & POLLIN) ? accept(f->listen_fd, NULL, NULL) : -1;
        if (fd >= 0 && n < GK_ARRAY_LEN(fds)) {
            struct timeval tv = {.tv_sec = 2};
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            fds[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
        } else if (fd >= 0) {
            close(fd);
        }
    }
    for (nfds_t i = 0; i < n; i++)
        close(fds[i].fd);
    return NULL;
}

static void fake_start(struct fake *f, enum fake_mode mode)
{
    struct gk_addr a;
    char err[128];

    memset(f, 0, sizeof *f);
    f->mode = mode;
    CHECK(gk_parse_addr("127.0.0.1:0", 0, &a) == 0, "addr");
    f->listen_fd = gk_listen_tcp(&a, 16, err, sizeof err);
    CHECK(f->listen_fd >= 0, "fake listen: %s", err);
    CHECK(gk_sock_name(f->listen_fd, f->addr, sizeof f->addr) == 0, "fake address");
    CHECK(pthread_create(&f->thread, NULL, fake_main, f) == 0, "fake thread");
}

static void fake_stop(struct fake *f)
{
    __atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
    pthread_join(f->thread, NULL);
}

/* One GET of 3 keys into canary-filled buffers. Returns the elapsed ms;
 * results are left in b. */
static uint64_t get_from_fake(gdrkv_client *c, struct batch *b, uint8_t *dst, size_t len)
{
    b->n = b->nsegs = 0;
    b->keys_used = 0;
    memset(dst, 0xee, 3 * len);
    for (uint32_t i = 0; i < 3; i++) {
        batch_key(b, "fake/%llu", i);
        batch_seg(b, dst + i * len, len);
    }
    uint64_t start = gk_now_ns();
    CHECK_EQ(get(c, b), 0);
    return ms_since(start);
}

static void expect_failure(enum fake_mode mode, int64_t expected, int within_timeout)
{
    struct fake f;
    struct batch *b = batch_new();
    static uint8_t dst[3 * 8192];

    fake_start(&f, mode);
    gdrkv_client *c = open_client(f.addr, TIMEOUT_MS);
    uint64_t ms = get_from_fake(c, b, dst, 8192);
    for (uint32_t i = 0; i < 3; i++)
        CHECK_EQ(b->results[i], expected);
    CHECK(ms <= TIMEOUT_MS + SLACK_MS, "mode %d: call took %llu ms", mode, (unsigned long long)ms);
    if (!within_timeout)
        CHECK(ms < TIMEOUT_MS / 2, "mode %d: failed fast, not by timeout (%llu ms)", mode,
              (unsigned long long)ms);
    if (mode == FAKE_OVERSIZE)
        for (size_t i = 0; i < sizeof dst; i++)
            CHECK(dst[i] == 0xee, "no byte of a rejected response reaches the caller");

    /* The server is down now: the next call costs nothing. */
    CHECK_EQ(client_stat(c, "servers_down"), 1);
    ms = get_from_fake(c, b, dst, 8192);
    CHECK(ms <= INSTANT_MS, "short-circuit took %llu ms", (unsigned long long)ms);
    CHECK_EQ(b->results[0], GDRKV_E_UNAVAILABLE);
    CHECK_EQ(client_stat(c, "shortcircuit_keys"), 3);
    gdrkv_client_close(c);
    fake_stop(&f);
    free(b);
}

static void test_silent_server(void)
{
    expect_failure(FAKE_SILENT, GDRKV_E_TIMEOUT, 1);
}

static void test_half_header(void)
{
    expect_failure(FAKE_HALF_HEADER, GDRKV_E_TIMEOUT, 1);
}

static void test_close_mid_payload(void)
{
    expect_failure(FAKE_CLOSE_MID_PAYLOAD, GDRKV_E_UNAVAILABLE, 0);

    /* A get_alloc whose answer said the size (the fake: the largest
     * object), then stopped: the memory it took goes again. */
    struct fake f;
    fake_start(&f, FAKE_CLOSE_MID_PAYLOAD);
    gdrkv_client *c = open_client(f.addr, TIMEOUT_MS);
    uint8_t *value = (uint8_t *)"untouched";
    int64_t result = 0;
    CHECK_EQ(gdrkv_get_alloc(c, "fake/0", 6, &value, &result), 0);
    CHECK_EQ(result, GDRKV_E_UNAVAILABLE);
    CHECK(value == NULL, "a failed get gives no memory");
    gdrkv_client_close(c);
    fake_stop(&f);
}

static void test_garbage(void)
{
    expect_failure(FAKE_GARBAGE, GDRKV_E_PROTOCOL, 0);
}

static void test_oversize(void)
{
    expect_failure(FAKE_OVERSIZE, GDRKV_E_PROTOCOL, 0);
}

/* A frame refused by a healthy server is a per-key result: the server
 * stays up and the connection is reused. */
static void test_refused_frame(void)
{
    struct fake f;
    struct batch *b = batch_new();
    static uint8_t dst[3 * 64];

    fake_start(&f, FAKE_REFUSE);
    gdrkv_client *c = open_client(f.addr, TIMEOUT_MS);
    for (int round = 0; round < 3; round++) {
        get_from_fake(c, b, dst, 64);
        for (uint32_t i = 0; i < 3; i++)
            CHECK_EQ(b->results[i], GDRKV_E_NO_SPACE);
    }
    CHECK_EQ(client_stat(c, "servers_down"), 0);
    CHECK_EQ(client_stat(c, "connects"), 1);
    gdrkv_client_close(c);
    fake_stop(&f);
    free(b);
}

/* Which of the client's servers each key of b goes to. */
static void route_batch(gdrkv_client *c, const struct batch *b, uint32_t *server)
{
    uint64_t seeds[8];
    char name[64];
    uint32_t n = gdrkv_client_nservers(c);
    size_t off = 0;

    for (uint32_t s = 0; s < n; s++) {
        CHECK_EQ(gdrkv_client_server_name(c, s, name, sizeof name), 0);
        seeds[s] = route_server_seed(name);
    }
    for (uint32_t i = 0; i < b->n; i++) {
        server[i] = route_pick(route_key_hash(b->keys + off, b->key_lens[i]), seeds, n);
        off += b->key_lens[i];
    }
}

/* Two servers; one stops mid-run. Its keys fail within the timeout while
 * the other's still hit; the next call fails them at once; once the
 * server is back and the backoff has passed, they work again. */
static void test_server_lost(void)
{
    enum { N = 200 };
    char addr_a[64], addr_b[64], list[160];
    struct batch *b = batch_new();
    uint32_t server[N], on_b = 0;
    static uint64_t vals[N];

    gdrkv_server *sa = start_server("127.0.0.1:0"), *sb = start_server("127.0.0.1:0");
    address_of(sa, addr_a, sizeof addr_a);
    address_of(sb, addr_b, sizeof addr_b);
    snprintf(list, sizeof list, "%s,%s", addr_a, addr_b);
    gdrkv_client *c = open_client(list, TIMEOUT_MS);

    for (uint32_t i = 0; i < N; i++) {
        vals[i] = i;
        batch_key(b, "lost/%llu", i);
        batch_seg(b, &vals[i], sizeof vals[i]);
    }
    route_batch(c, b, server);
    for (uint32_t i = 0; i < N; i++)
        on_b += server[i];
    CHECK(on_b > N / 4 && on_b < 3 * N / 4, "%u of %u keys on the second server", on_b, N);
    CHECK_EQ(put(c, b), 0);
    for (uint32_t i = 0; i < N; i++)
        CHECK_EQ(b->results[i], 0);

    gdrkv_server_stop(sb);
    uint64_t start = gk_now_ns();
    CHECK_EQ(get(c, b), 0);
    CHECK(ms_since(start) <= TIMEOUT_MS + SLACK_MS, "lost server bounded by the timeout");
    for (uint32_t i = 0; i < N; i++) {
        if (server[i])
            CHECK(b->results[i] == GDRKV_E_UNAVAILABLE || b->results[i] == GDRKV_E_TIMEOUT,
                  "key %u on the lost server: %lld", i, (long long)b->results[i]);
        else
            CHECK_EQ(b->results[i], 8);
    }

    start = gk_now_ns();
    CHECK_EQ(get(c, b), 0);
    CHECK(ms_since(start) <= INSTANT_MS, "short-circuit");
    for (uint32_t i = 0; i < N; i++)
        CHECK_EQ(b->results[i], server[i] ? GDRKV_E_UNAVAILABLE : 8);
    CHECK_EQ(client_stat(c, "shortcircuit_keys"), on_b);
    CHECK_EQ(client_stat(c, "servers_down"), 1);

    sb = start_server(addr_b);
    usleep(150 * 1000);     /* past backoff_min_ms */
    CHECK_EQ(get(c, b), 0);
    for (uint32_t i = 0; i < N; i++)
        CHECK_EQ(b->results[i], server[i] ? GDRKV_E_NOT_FOUND : 8);
    CHECK_EQ(client_stat(c, "servers_down"), 0);

    gdrkv_client_close(c);
    gdrkv_server_stop(sa);
    gdrkv_server_stop(sb);
    free(b);
}

/* A silent server next to a healthy one: only its keys time out. */
static void test_mixed_servers(void)
{
    enum { N = 64 };
    struct fake f;
    char addr[64], list[160];
    struct batch *b = batch_new();
    uint32_t server[N];
    uint8_t val[100];

    fake_start(&f, FAKE_SILENT);
    gdrkv_server *s = start_server("127.0.0.1:0");
    address_of(s, addr, sizeof addr);
    snprintf(list, sizeof list, "%s,%s", addr, f.addr);
    gdrkv_client *c = open_client(list, TIMEOUT_MS);

    for (uint32_t i = 0; i < N; i++) {
        batch_key(b, "mixed/%llu", i);
        batch_seg(b, val, sizeof val);
    }
    route_batch(c, b, server);
    uint64_t start = gk_now_ns();
    CHECK_EQ(put(c, b), 0);
    CHECK(ms_since(start) <= TIMEOUT_MS + SLACK_MS, "bounded by the timeout");
    for (uint32_t i = 0; i < N; i++)
        CHECK_EQ(b->results[i], server[i] ? GDRKV_E_TIMEOUT : 0);

    gdrkv_client_close(c);
    gdrkv_server_stop(s);
    fake_stop(&f);
    free(b);
}

/* A server whose accept queue is full never completes a handshake: the
 * connect gives up at connect_timeout_ms and the call returns in time. */
static void test_blackhole(void)
{
    struct gk_addr a;
    char err[128], addr[64];
    int fds[8], nfds = 0, fd = 0;
    gdrkv_client_opts o;
    gdrkv_client *c = NULL;
    struct batch *b = batch_new();
    uint8_t val[16];

    CHECK(gk_parse_addr("127.0.0.1:0", 0, &a) == 0, "addr");
    int listen_fd = gk_listen_tcp(&a, 1, err, sizeof err);
    CHECK(listen_fd >= 0, "listen: %s", err);
    CHECK(gk_sock_name(listen_fd, addr, sizeof addr) == 0, "address");
    CHECK(gk_parse_addr(addr, 0, &a) == 0, "addr");
    while (nfds < (int)GK_ARRAY_LEN(fds) &&
           (fd = gk_connect_tcp(&a, gk_now_ns() + 100 * 1000000ull)) >= 0)
        fds[nfds++] = fd;
    CHECK_EQ(fd, GDRKV_E_TIMEOUT);

    gdrkv_client_opts_init(&o);
    o.servers = addr;
    o.timeout_ms = TIMEOUT_MS;
    o.connect_timeout_ms = TIMEOUT_MS / 4;
    CHECK_EQ(gdrkv_client_open(&o, &c, err, sizeof err), 0);
    batch_key(b, "blackhole/%llu", 1);
    batch_seg(b, val, sizeof val);
    uint64_t start = gk_now_ns();
    CHECK_EQ(put(c, b), 0);
    uint64_t ms = ms_since(start);
    CHECK(ms >= TIMEOUT_MS / 4 && ms <= TIMEOUT_MS / 4 + SLACK_MS, "connect gave up after %llu ms",
          (unsigned long long)ms);
    CHECK_EQ(b->results[0], GDRKV_E_UNAVAILABLE);
    CHECK_EQ(client_stat(c, "connect_failures"), 1);

    gdrkv_client_close(c);
    while (nfds)
        close(fds[--nfds]);
    close(listen_fd);
    free(b);
}

struct churn {
    gdrkv_client *c;
    uint32_t id;
    int *stop;
    uint32_t hits;
};

static int churn_error_ok(int64_t r)
{
    return r == GDRKV_E_UNAVAILABLE || r == GDRKV_E_TIMEOUT || r == GDRKV_E_NOT_FOUND;
}

static void *churn_worker(void *p)
{
    enum { KEYS = 8, MAX_LEN = 3000 };
    struct churn *w = p;
    struct batch *b = batch_new();
    uint8_t(*src)[MAX_LEN] = malloc(KEYS * MAX_LEN), (*dst)[MAX_LEN] = malloc(KEYS * MAX_LEN);
    uint64_t r = w->id + 77, lens[KEYS];

    CHECK(src && dst, "malloc");
    for (uint32_t round = 0; !__atomic_load_n(w->stop, __ATOMIC_ACQUIRE); round++) {
        b->n = b->nsegs = 0;
        b->keys_used = 0;
        for (uint32_t k = 0; k < KEYS; k++) {
            uint64_t id = ((uint64_t)w->id << 40) | ((uint64_t)round << 8) | k;
            lens[k] = 1 + check_rand(&r) % (MAX_LEN - 1);
            fill(src[k], lens[k], id);
            batch_key(b, "churn/%llx", id);
            batch_seg(b, src[k], lens[k]);
        }
        CHECK_EQ(put(w->c, b), 0);
        for (uint32_t k = 0; k < KEYS; k++) {
            CHECK(b->results[k] == 0 || churn_error_ok(b->results[k]), "put: %lld",
                  (long long)b->results[k]);
            b->seg_ptrs[k] = (uint64_t)(uintptr_t)dst[k];
            b->seg_lens[k] = MAX_LEN;
        }
        CHECK_EQ(get(w->c, b), 0);
        for (uint32_t k = 0; k < KEYS; k++) {
            if (b->results[k] >= 0) {
                CHECK_EQ(b->results[k], lens[k]);
                CHECK(!memcmp(src[k], dst[k], lens[k]), "value after failover");
                w->hits++;
            } else {
                CHECK(churn_error_ok(b->results[k]), "get: %lld", (long long)b->results[k]);
            }
        }
    }
    free(src);
    free(dst);
    free(b);
    return NULL;
}

/* Threads keep working on one client while one of its two servers goes
 * away and comes back: every result is a correct value or a clean error,
 * and the client ends up using both servers again. */
static void test_churn(void)
{
    enum { THREADS = 4 };
    char addr_a[64], addr_b[64], list[160];
    pthread_t t[THREADS];
    struct churn w[THREADS];
    int stop = 0;
    gdrkv_client_opts o;
    gdrkv_client *c = NULL;
    char err[128];

    gdrkv_server *sa = start_server("127.0.0.1:0"), *sb = start_server("127.0.0.1:0");
    address_of(sa, addr_a, sizeof addr_a);
    address_of(sb, addr_b, sizeof addr_b);
    snprintf(list, sizeof list, "%s,%s", addr_a, addr_b);
    gdrkv_client_opts_init(&o);
    o.servers = list;
    o.timeout_ms = TIMEOUT_MS;
    o.backoff_min_ms = 20;
    o.backoff_max_ms = 80;
    CHECK_EQ(gdrkv_client_open(&o, &c, err, sizeof err), 0);

    for (uint32_t i = 0; i < THREADS; i++) {
        w[i] = (struct churn){.c = c, .id = i, .stop = &stop};
        CHECK(pthread_create(&t[i], NULL, churn_worker, &w[i]) == 0, "thread");
    }
    for (int cycle = 0; cycle < 2; cycle++) {
        usleep(200 * 1000);
        gdrkv_server_stop(sb);
        usleep(200 * 1000);
        sb = start_server(addr_b);
    }
    usleep(200 * 1000);
    __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
    for (uint32_t i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK(w[i].hits > 0, "thread %u got values", i);
    }
    for (int i = 0; i < 100 && gdrkv_ping(c) != 0; i++)
        usleep(10 * 1000);
    CHECK_EQ(gdrkv_ping(c), 0);
    CHECK_EQ(client_stat(c, "servers_down"), 0);

    gdrkv_client_close(c);
    gdrkv_server_stop(sa);
    gdrkv_server_stop(sb);
}

/* Client connections probe a peer that went quiet (TCP keepalive), so a
 * pooled connection to a host that died is found out within a minute. */
static void test_keepalive(void)
{
    struct gk_addr a;
    char err[200], name[64];
    CHECK_EQ(gk_parse_addr("127.0.0.1:0", 0, &a), 0);
    int listener = gk_listen_tcp(&a, 4, err, sizeof err);
    CHECK(listener >= 0, "listen: %s", err);
    gk_sock_name(listener, name, sizeof name);
    CHECK_EQ(gk_parse_addr(name, 0, &a), 0);
    int fd = gk_connect_tcp(&a, gk_now_ns() + 5000000000ull);
    CHECK(fd >= 0, "connect %s: %d", name, fd);
    int on = 0, idle = 0;
    socklen_t len = sizeof on;
    CHECK_EQ(getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, &len), 0);
    CHECK_EQ(on, 1);
    len = sizeof idle;
    CHECK_EQ(getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, &len), 0);
    CHECK_EQ(idle, 30);
    close(fd);
    close(listener);
}

int main(void)
{
    RUN(test_options);
    RUN(test_keepalive);
    RUN(test_routing);
    test_one_server(GDRKV_TRANSPORT_TCP);
    test_one_server(GDRKV_TRANSPORT_SHM);
    RUN(test_silent_server);
    RUN(test_half_header);
    RUN(test_close_mid_payload);
    RUN(test_garbage);
    RUN(test_oversize);
    RUN(test_refused_frame);
    RUN(test_server_lost);
    RUN(test_mixed_servers);
    RUN(test_blackhole);
    RUN(test_churn);
    return check_done("test_client");
}
