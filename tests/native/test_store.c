/*
 * test_store.c - the store: options, put/get through the pool, put-if-absent,
 * reservations, pins, deferred frees, LRU eviction, namespaces, watermarks,
 * limits, a randomized churn checked against a shadow model (also over a
 * pool file, restarted as it goes), restarts over a pool file, and a few
 * threads hammering one store.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fcntl.h>
#include <sys/stat.h>

#include "store/alloc.h"
#include "store/persist.h"
#include "check.h"
#include "common/common.h"
#include "gdrkv.h"
#include "store/store.h"
#include "store/store_state.h"  /* STORE_TOUCH_LOG */

#define MiB (1ull << 20)

/* ---------------------------------------------------------------- helpers */

static struct store *open_store_wm(uint64_t memory, double high, double low)
{
    struct store_opts opts = {.memory_bytes = memory, .hugepages = 0, .pretouch = 0,
                              .high_watermark = high, .low_watermark = low};
    struct store *s;
    char err[256] = "";
    int rc = store_open(&s, &opts, err, sizeof err);
    CHECK(rc == 0, "store_open: %s", err);
    return s;
}

static struct store *open_store(uint64_t memory) { return open_store_wm(memory, 1.0, 0.9); }

/* A pool file per test process, on tmpfs. */
static const char *pool_path(void)
{
    static char path[64];
    snprintf(path, sizeof path, "/dev/shm/gdrkv-test-store-%d.pool", (int)getpid());
    return path;
}

static int try_open_file(struct store **s, uint64_t memory, int reset, double high, double low,
                         char *err, size_t errlen)
{
    struct store_opts opts = {.memory_bytes = memory, .high_watermark = high,
                              .low_watermark = low, .pool_file = pool_path(),
                              .reset_pool_file = reset};
    return store_open(s, &opts, err, errlen);
}

static struct store *open_file_wm(uint64_t memory, double high, double low)
{
    struct store *s;
    char err[256] = "";
    int rc = try_open_file(&s, memory, 0, high, low, err, sizeof err);
    CHECK(rc == 0, "store_open over %s: %s", pool_path(), err);
    return s;
}

static struct gk_ns ns_of(const char *name)
{
    return (struct gk_ns){(const uint8_t *)name, (uint32_t)strlen(name)};
}

static struct gk_entry entry_of(const char *key, uint64_t size)
{
    return (struct gk_entry){(const uint8_t *)key, (uint32_t)strlen(key), size};
}

static struct store_stats stats_of(struct store *s)
{
    struct store_stats st;
    store_get_stats(s, &st);
    return st;
}

/* Each chunk is filled with a byte derived from (tag, chunk) and, when
 * there is room, stamped with the tag at both ends, so bytes of another
 * object or a chunk out of order are caught by check_bytes. */
#define STAMPED 32
static uint8_t fill_byte(uint64_t tag, uint32_t chunk) { return (uint8_t)(tag * 37 + chunk * 11 + 1); }

static void write_bytes(struct store *s, const struct store_obj *o, uint64_t tag)
{
    uint32_t n;
    const struct store_chunk *c = store_obj_chunks(o, &n);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *p = store_base(s) + c[i].off;
        memset(p, fill_byte(tag, i), c[i].len);
        if (c[i].len >= STAMPED) {
            gk_store64(p, tag);
            gk_store64(p + c[i].len - 8, tag);
        }
    }
}

static void check_bytes(struct store *s, const struct store_obj *o, uint64_t tag)
{
    uint32_t n;
    const struct store_chunk *c = store_obj_chunks(o, &n);
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *p = store_base(s) + c[i].off;
        CHECK(c[i].off + c[i].len <= store_capacity(s), "chunk %u outside the pool", i);
        total += c[i].len;
        uint64_t edge = 0;
        if (c[i].len >= STAMPED) {
            CHECK_EQ(gk_load64(p), tag);
            CHECK_EQ(gk_load64(p + c[i].len - 8), tag);
            edge = 8;
        }
        uint64_t probes[] = {edge, c[i].len / 2, c[i].len - 1 - edge};
        for (size_t k = 0; k < GK_ARRAY_LEN(probes); k++)
            CHECK_EQ(p[probes[k]], fill_byte(tag, i));
    }
    CHECK_EQ(total, store_obj_size(o));
    CHECK(n >= alloc_nchunks(store_obj_size(o), 0, 0), "too few chunks");
}

static int32_t reserve1(struct store *s, const char *ns, const char *key, uint64_t size,
                        struct store_obj **o)
{
    struct gk_ns space = ns_of(ns);
    struct gk_entry e = entry_of(key, size);
    int32_t status;
    store_reserve_batch(s, &space, &e, 1, o, &status);
    CHECK((status == 0) == (*o != NULL), "reserve status %d with object %p", status, (void *)*o);
    return status;
}

/* Reserve, fill with tag's bytes, commit. */
static int32_t put(struct store *s, const char *ns, const char *key, uint64_t size, uint64_t tag)
{
    struct store_obj *o;
    int32_t status = reserve1(s, ns, key, size, &o);
    if (status == 0) {
        write_bytes(s, o, tag);
        store_commit_batch(s, &o, 1);
    }
    return status;
}

static int32_t pin1(struct store *s, const char *ns, const char *key, int touch, struct store_obj **o)
{
    struct gk_ns space = ns_of(ns);
    struct gk_entry e = entry_of(key, 0);
    int32_t status;
    uint64_t size;
    store_pin_batch(s, &space, &e, 1, touch, o, &status, &size);
    CHECK(status != 0 || size == store_obj_size(*o), "pin size");
    return status;
}

static void unpin1(struct store *s, struct store_obj *o) { store_unpin_batch(s, &o, 1); }

static int present(struct store *s, const char *ns, const char *key)
{
    struct gk_ns space = ns_of(ns);
    struct gk_entry e = entry_of(key, 0);
    int32_t status;
    uint64_t size;
    store_exists_batch(s, &space, &e, 1, &status, &size);
    CHECK(status == 0 || status == GDRKV_E_NOT_FOUND, "exists status %d", status);
    return status == 0;
}

static int32_t delete1(struct store *s, const char *ns, const char *key)
{
    struct gk_ns space = ns_of(ns);
    struct gk_entry e = entry_of(key, 0);
    int32_t status;
    store_delete_batch(s, &space, &e, 1, &status);
    return status;
}

static uint64_t clear(struct store *s, const char *ns)
{
    struct gk_ns space = ns_of(ns);
    return store_clear_ns(s, &space);
}

static const char *key_n(char *buf, size_t cap, int i)
{
    snprintf(buf, cap, "key-%d", i);
    return buf;
}

/* ------------------------------------------------------------------ tests */

static void test_open_options(void)
{
    struct store *s = open_store(10 * MiB + MiB / 2);
    CHECK_EQ(store_capacity(s), 10 * MiB);
    CHECK(store_base(s) != NULL && store_pool_fd(s) >= 0, "pool mapped");
    struct store_stats st = stats_of(s);
    CHECK_EQ(st.pool_bytes, 10 * MiB);
    CHECK_EQ(st.pool_used_bytes, 0);
    CHECK_EQ(st.hugepages, 0);
    store_close(s);

    struct store_opts bad[] = {
        {.memory_bytes = MiB - 1, .high_watermark = 0.9, .low_watermark = 0.8},
        {.memory_bytes = 4 * MiB, .high_watermark = 0.5, .low_watermark = 0.8},
        {.memory_bytes = 4 * MiB, .high_watermark = 1.5, .low_watermark = 0.8},
        {.memory_bytes = 4 * MiB, .high_watermark = 0.9, .low_watermark = 0},
        {.memory_bytes = 4 * MiB, .high_watermark = NAN, .low_watermark = 0.5},
    };
    for (size_t i = 0; i < GK_ARRAY_LEN(bad); i++) {
        char err[256] = "";
        CHECK_EQ(store_open(&s, &bad[i], err, sizeof err), GDRKV_E_INVALID);
        CHECK(s == NULL && err[0], "bad options %zu: no message", i);
    }
}

static int hugepages_free(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        sscanf(line, "HugePages_Free: %d", &n);
    if (f)
        fclose(f);
    return n;
}

/* "Require" either gets hugetlb pages or fails with a message saying how
 * to get them; "try" always opens. */
static void test_hugepages(void)
{
    struct store_opts opts = {.memory_bytes = 8 * MiB, .hugepages = 1, .high_watermark = 1,
                              .low_watermark = 0.5};
    struct store *s;
    char err[256] = "";
    int rc = store_open(&s, &opts, err, sizeof err);
    if (hugepages_free() >= 4) {
        CHECK(rc == 0, "hugepages available but open failed: %s", err);
        CHECK_EQ(stats_of(s).hugepages, 1);
        store_close(s);
    } else {
        CHECK(rc != 0 && strstr(err, "vm.nr_hugepages"), "required hugepages: rc %d, '%s'", rc, err);
    }
    opts.hugepages = -1;
    CHECK(store_open(&s, &opts, err, sizeof err) == 0, "try hugepages: %s", err);
    CHECK(put(s, "", "k", 3 * MiB, 1) == 0, "put into a try-hugepages pool");
    store_close(s);
}

/* Large enough to split the first touch over threads. */
enum { PAGE = 4096 };

/* Pages of the pool in memory now (mincore). */
static uint64_t resident_pages(struct store *s)
{
    uint64_t n = store_capacity(s) / PAGE, resident = 0;
    unsigned char *vec = malloc(n);
    CHECK(vec && mincore(store_base(s), store_capacity(s), vec) == 0, "mincore: %s",
          strerror(errno));
    for (uint64_t i = 0; i < n; i++)
        resident += vec[i] & 1;
    free(vec);
    return resident;
}

static void test_pretouch(void)
{
    struct store_opts opts = {.memory_bytes = 512 * MiB, .hugepages = -1, .pretouch = 1,
                              .high_watermark = 1, .low_watermark = 0.5};
    struct store *s;
    char err[256] = "";
    uint64_t t0 = gk_now_ns();
    CHECK(store_open(&s, &opts, err, sizeof err) == 0, "pretouch open: %s", err);
    printf("   pretouched 512 MiB in %.0f ms\n", (double)(gk_now_ns() - t0) / 1e6);
    CHECK_EQ(resident_pages(s), store_capacity(s) / PAGE);
    CHECK(put(s, "", "k", 5 * MiB, 9) == 0, "put into a pretouched pool");
    store_close(s);

    /* Without pretouch the pages come on first touch: the check above can
     * tell the two apart. */
    opts.pretouch = 0;
    CHECK(store_open(&s, &opts, err, sizeof err) == 0, "open: %s", err);
    CHECK(resident_pages(s) < store_capacity(s) / PAGE / 2, "an untouched pool is resident");
    store_close(s);
}

static void test_roundtrip_sizes(void)
{
    static const uint64_t sizes[] = {0, 1, 100, 4096, MiB, 5 * MiB / 2, 3 * MiB + 7};
    struct store *s = open_store(32 * MiB);
    struct alloc shape;
    CHECK(alloc_init(&shape, MiB) == 0, "alloc for footprints");
    char key[32];
    uint64_t bytes = 0, footprint = 0;
    for (size_t i = 0; i < GK_ARRAY_LEN(sizes); i++) {
        CHECK_EQ(put(s, "ns", key_n(key, sizeof key, (int)i), sizes[i], 100 + i), 0);
        bytes += sizes[i];
        footprint += alloc_footprint(&shape, sizes[i], 0, 0);
    }
    for (size_t i = 0; i < GK_ARRAY_LEN(sizes); i++) {
        struct store_obj *o;
        CHECK_EQ(pin1(s, "ns", key_n(key, sizeof key, (int)i), 1, &o), 0);
        CHECK_EQ(store_obj_size(o), sizes[i]);
        check_bytes(s, o, 100 + i);
        unpin1(s, o);
    }
    /* The memfd maps the same bytes: what the shm transport relies on; and
     * it is sealed, so a client holding it can neither write nor resize. */
    uint8_t *shared = mmap(NULL, store_capacity(s), PROT_READ, MAP_SHARED, store_pool_fd(s), 0);
    CHECK(shared != MAP_FAILED, "mmap of the pool fd");
    CHECK(memcmp(shared, store_base(s), store_capacity(s)) == 0, "pool fd maps other bytes");
    munmap(shared, store_capacity(s));
    CHECK(mmap(NULL, store_capacity(s), PROT_READ | PROT_WRITE, MAP_SHARED, store_pool_fd(s), 0)
          == MAP_FAILED, "writable mapping of the shared pool fd refused");
    CHECK(ftruncate(store_pool_fd(s), 0) != 0, "shared pool fd can't be truncated");

    struct store_stats st = stats_of(s);
    CHECK_EQ(st.objects, GK_ARRAY_LEN(sizes));
    CHECK_EQ(st.object_bytes, bytes);
    CHECK_EQ(st.pool_used_bytes, footprint);
    CHECK_EQ(st.puts, GK_ARRAY_LEN(sizes));
    CHECK_EQ(st.hits, GK_ARRAY_LEN(sizes));
    CHECK_EQ(st.pinned_objects, 0);
    CHECK_EQ(st.namespaces, 1);
    alloc_destroy(&shape);
    store_close(s);
}

static void test_put_if_absent(void)
{
    struct store *s = open_store(8 * MiB);
    struct store_obj *first, *other;
    CHECK_EQ(reserve1(s, "", "k", 1000, &first), 0);
    /* Another writer's reservation may still be aborted: not stored yet. */
    CHECK_EQ(reserve1(s, "", "k", 1000, &other), GDRKV_E_BUSY);
    write_bytes(s, first, 1);
    store_commit_batch(s, &first, 1);
    CHECK_EQ(put(s, "", "k", 1000, 2), STORE_PRESENT);
    CHECK_EQ(put(s, "", "k", 5000, 3), STORE_PRESENT);

    /* The same key twice in one batch: the first reserves, the second is a
     * duplicate. */
    struct gk_ns space = ns_of("");
    struct gk_entry e[2] = {entry_of("twice", 64), entry_of("twice", 64)};
    struct store_obj *objs[2];
    int32_t status[2];
    store_reserve_batch(s, &space, e, 2, objs, status);
    CHECK(status[0] == 0 && status[1] == STORE_PRESENT && objs[1] == NULL, "duplicate in a batch");
    store_commit_batch(s, objs, 2);

    struct store_obj *o;
    CHECK_EQ(pin1(s, "", "k", 0, &o), 0);
    CHECK_EQ(store_obj_size(o), 1000);
    check_bytes(s, o, 1);
    unpin1(s, o);
    struct store_stats st = stats_of(s);
    CHECK_EQ(st.put_dedup, 3);   /* the BUSY reservation above is not a dedup */
    CHECK_EQ(st.puts, 2);
    CHECK_EQ(st.objects, 2);
    store_close(s);
}

static void test_reserved_is_invisible(void)
{
    struct store *s = open_store(8 * MiB);
    struct store_obj *o, *seen;
    CHECK_EQ(reserve1(s, "ns", "k", 2 * MiB, &o), 0);
    CHECK_EQ(pin1(s, "ns", "k", 1, &seen), GDRKV_E_NOT_FOUND);
    CHECK(seen == NULL, "pin of a reserved object returned it");
    CHECK(!present(s, "ns", "k"), "reserved object exists");
    CHECK_EQ(delete1(s, "ns", "k"), GDRKV_E_NOT_FOUND);
    CHECK_EQ(clear(s, "ns"), 0);
    struct store_stats st = stats_of(s);
    CHECK_EQ(st.reserved_objects, 1);
    CHECK_EQ(st.objects, 0);
    CHECK_EQ(st.pool_used_bytes, 2 * MiB);
    CHECK_EQ(st.namespaces, 1);

    write_bytes(s, o, 5);
    store_commit_batch(s, &o, 1);
    CHECK(present(s, "ns", "k"), "committed object missing");
    CHECK_EQ(pin1(s, "ns", "k", 1, &seen), 0);
    check_bytes(s, seen, 5);
    unpin1(s, seen);

    /* An aborted reservation leaves nothing behind, and frees the key. */
    CHECK_EQ(reserve1(s, "other", "a", 3 * MiB, &o), 0);
    store_abort_batch(s, &o, 1);
    st = stats_of(s);
    CHECK_EQ(st.reserved_objects, 0);
    CHECK_EQ(st.pool_used_bytes, 2 * MiB);
    CHECK_EQ(st.namespaces, 1);
    CHECK_EQ(reserve1(s, "other", "a", 10, &o), 0);
    store_abort_batch(s, &o, 1);
    store_close(s);
}

/* Reads under the shared lock log their LRU moves; the next exclusive
 * holder replays them. Reads beyond the log's STORE_TOUCH_LOG entries
 * before that are dropped, without harm: the logged moves still happen in
 * order, and the store goes on. */
static void test_touch_log_overflow(void)
{
    struct store *s = open_store(8 * MiB);
    char key[32];
    struct store_obj *o;
    for (int i = 0; i < 8; i++)
        CHECK_EQ(put(s, "", key_n(key, sizeof key, i), MiB, (uint64_t)i), 0);
    CHECK_EQ(pin1(s, "", "key-0", 1, &o), 0);
    unpin1(s, o);
    for (int i = 0; i < STORE_TOUCH_LOG + 5000; i++) {
        CHECK_EQ(pin1(s, "", "key-1", 1, &o), 0);
        unpin1(s, o);
    }
    CHECK_EQ(put(s, "", "key-8", MiB, 8), 0);       /* replays, then evicts key-2 */
    CHECK(present(s, "", "key-0") && present(s, "", "key-1"), "a logged read was lost");
    CHECK(!present(s, "", "key-2"), "the least recently used object survived");
    for (int i = 0; i < STORE_TOUCH_LOG + 5000; i++) {
        CHECK_EQ(pin1(s, "", "key-3", 1, &o), 0);
        unpin1(s, o);
    }
    CHECK_EQ(put(s, "", "key-9", MiB, 9), 0);
    CHECK(present(s, "", "key-3"), "a read in a full log moved nothing");
    struct store_stats st = stats_of(s);
    CHECK_EQ(st.objects, 8);
    CHECK_EQ(st.evictions, 2);
    CHECK_EQ(st.pinned_objects, 0);
    store_close(s);
}

/* Whole-page objects fill an 8-page pool exactly; reserving one more
 * evicts the least recently used. A touching pin counts as a use, a
 * non-touching one doesn't. */
static void test_lru_order(void)
{
    struct store *s = open_store(8 * MiB);
    char key[32];
    for (int i = 0; i < 8; i++)
        CHECK_EQ(put(s, "", key_n(key, sizeof key, i), MiB, (uint64_t)i), 0);
    CHECK_EQ(stats_of(s).evictions, 0);

    struct store_obj *o;
    CHECK_EQ(pin1(s, "", "key-0", 1, &o), 0);
    unpin1(s, o);
    CHECK_EQ(pin1(s, "", "key-1", 0, &o), 0);
    unpin1(s, o);

    CHECK_EQ(put(s, "", "key-8", MiB, 8), 0);
    CHECK(present(s, "", "key-0"), "touched object evicted");
    CHECK(!present(s, "", "key-1"), "LRU object survived (a pin without touch moved it)");
    CHECK_EQ(put(s, "", "key-9", MiB, 9), 0);
    CHECK(!present(s, "", "key-2"), "second LRU object survived");
    for (int i = 3; i < 10; i++)
        CHECK(present(s, "", key_n(key, sizeof key, i)), "key-%d evicted out of order", i);
    struct store_stats st = stats_of(s);
    CHECK_EQ(st.evictions, 2);
    CHECK_EQ(st.evicted_bytes, 2 * MiB);
    CHECK_EQ(st.objects, 8);
    store_close(s);
}

static void test_pins_block_eviction(void)
{
    struct store *s = open_store(8 * MiB);
    char key[32];
    struct store_obj *pinned[8];
    for (int i = 0; i < 8; i++)
        CHECK_EQ(put(s, "", key_n(key, sizeof key, i), MiB, (uint64_t)i), 0);
    for (int i = 0; i < 4; i++)
        CHECK_EQ(pin1(s, "", key_n(key, sizeof key, i), 0, &pinned[i]), 0);

    /* The four oldest are pinned: the next four go instead. */
    for (int i = 8; i < 12; i++)
        CHECK_EQ(put(s, "", key_n(key, sizeof key, i), MiB, (uint64_t)i), 0);
    for (int i = 0; i < 12; i++)
        CHECK(present(s, "", key_n(key, sizeof key, i)) == (i < 4 || i >= 8),
              "key-%d presence after eviction around pins", i);
    for (int i = 0; i < 4; i++)
        check_bytes(s, pinned[i], (uint64_t)i);

    /* Everything pinned: no space, and nothing pinned is lost. */
    for (int i = 8; i < 12; i++)
        CHECK_EQ(pin1(s, "", key_n(key, sizeof key, i), 0, &pinned[i - 4]), 0);
    CHECK_EQ(put(s, "", "one-more", 1, 99), GDRKV_E_NO_SPACE);
    struct store_stats st = stats_of(s);
    CHECK_EQ(st.put_no_space, 1);
    CHECK_EQ(st.pinned_objects, 8);
    CHECK_EQ(st.objects, 8);
    CHECK_EQ(st.namespaces, 1);

    store_unpin_batch(s, pinned, 8);
    CHECK_EQ(put(s, "", "one-more", 1, 99), 0);
    CHECK_EQ(stats_of(s).pinned_objects, 0);
    store_close(s);
}

/* A multi-chunk reservation that can't get all its chunks gives back the
 * ones it got, and a namespace created for it goes away again. */
static void test_failed_reservation_rolls_back(void)
{
    struct store *s = open_store(4 * MiB);
    struct store_obj *pinned[2], *o;
    CHECK_EQ(put(s, "", "a", MiB, 1), 0);
    CHECK_EQ(put(s, "", "b", MiB, 2), 0);
    CHECK_EQ(pin1(s, "", "a", 0, &pinned[0]), 0);
    CHECK_EQ(pin1(s, "", "b", 0, &pinned[1]), 0);
    CHECK_EQ(reserve1(s, "", "big", 3 * MiB, &o), GDRKV_E_NO_SPACE);
    CHECK_EQ(reserve1(s, "fresh", "big", 5 * MiB / 2, &o), GDRKV_E_NO_SPACE);
    struct store_stats st = stats_of(s);
    CHECK_EQ(st.pool_used_bytes, 2 * MiB);
    CHECK_EQ(st.reserved_objects, 0);
    CHECK_EQ(st.namespaces, 1);
    CHECK_EQ(st.put_no_space, 2);
    CHECK(!present(s, "", "big"), "failed reservation left its key");

    store_unpin_batch(s, pinned, 2);
    CHECK_EQ(put(s, "", "big", 3 * MiB, 3), 0);
    CHECK_EQ(stats_of(s).evictions, 1);
    store_close(s);
}

/* Reservations are never evicted: a pool full of them has no space. */
static void test_reservations_not_evictable(void)
{
    struct store *s = open_store(4 * MiB);
    struct gk_ns space = ns_of("w");
    struct gk_entry e[5] = {entry_of("a", MiB), entry_of("b", MiB), entry_of("c", MiB),
                            entry_of("d", MiB), entry_of("e", MiB)};
    struct store_obj *objs[5];
    int32_t status[5];
    store_reserve_batch(s, &space, e, 5, objs, status);
    for (int i = 0; i < 4; i++)
        CHECK_EQ(status[i], 0);
    CHECK_EQ(status[4], GDRKV_E_NO_SPACE);
    store_commit_batch(s, objs, 5);
    CHECK_EQ(stats_of(s).objects, 4);
    /* Now they are committed, a new one may push the oldest out. */
    CHECK_EQ(put(s, "w", "e", MiB, 1), 0);
    CHECK_EQ(stats_of(s).evictions, 1);
    store_close(s);
}

static void test_delete_defers_free_while_pinned(void)
{
    struct store *s = open_store(8 * MiB);
    struct store_obj *old, *cur;
    CHECK_EQ(put(s, "", "k", MiB, 1), 0);
    CHECK_EQ(pin1(s, "", "k", 1, &old), 0);
    CHECK_EQ(delete1(s, "", "k"), 0);
    CHECK_EQ(delete1(s, "", "k"), GDRKV_E_NOT_FOUND);
    CHECK(!present(s, "", "k"), "deleted object still visible");
    struct store_stats st = stats_of(s);
    CHECK_EQ(st.objects, 0);
    CHECK_EQ(st.pinned_objects, 1);
    CHECK_EQ(st.pool_used_bytes, MiB);
    CHECK_EQ(st.deletes, 1);
    CHECK_EQ(st.namespaces, 0);

    /* The key is free for a new object while the old bytes stay readable. */
    CHECK_EQ(put(s, "", "k", MiB, 2), 0);
    CHECK_EQ(stats_of(s).pool_used_bytes, 2 * MiB);
    check_bytes(s, old, 1);
    unpin1(s, old);
    st = stats_of(s);
    CHECK_EQ(st.pool_used_bytes, MiB);
    CHECK_EQ(st.pinned_objects, 0);
    CHECK_EQ(pin1(s, "", "k", 1, &cur), 0);
    check_bytes(s, cur, 2);
    unpin1(s, cur);

    /* Closing with a pin still held frees everything (ASan checks). */
    CHECK_EQ(pin1(s, "", "k", 1, &cur), 0);
    CHECK_EQ(delete1(s, "", "k"), 0);
    store_close(s);
}

static void test_namespaces(void)
{
    struct store *s = open_store(16 * MiB);
    char key[32];
    CHECK_EQ(put(s, "a", "k", 100, 1), 0);
    CHECK_EQ(put(s, "b", "k", 200, 2), 0);
    CHECK_EQ(put(s, "", "k", 300, 3), 0);
    struct gk_ns unnamed = {NULL, 0};
    struct gk_entry e = entry_of("k", 0);
    int32_t status;
    uint64_t size;
    store_exists_batch(s, &unnamed, &e, 1, &status, &size);
    CHECK(status == 0 && size == 300, "default namespace with a NULL name");

    struct store_obj *o;
    CHECK_EQ(pin1(s, "a", "k", 1, &o), 0);
    check_bytes(s, o, 1);
    unpin1(s, o);
    CHECK_EQ(pin1(s, "b", "k", 1, &o), 0);
    check_bytes(s, o, 2);
    unpin1(s, o);
    CHECK(!present(s, "c", "k"), "key visible in a namespace it was never put in");
    CHECK_EQ(stats_of(s).namespaces, 3);

    for (int i = 0; i < 5; i++)
        CHECK_EQ(put(s, "a", key_n(key, sizeof key, i), 1000, 10), 0);
    struct store_obj *held;
    CHECK_EQ(pin1(s, "a", "key-0", 1, &held), 0);
    struct store_obj *writing;
    CHECK_EQ(reserve1(s, "a", "in-flight", 100, &writing), 0);
    CHECK_EQ(clear(s, "a"), 6);
    CHECK(!present(s, "a", "k") && !present(s, "a", "key-4"), "clear left objects");
    CHECK(present(s, "b", "k") && present(s, "", "k"), "clear touched other namespaces");
    check_bytes(s, held, 10);
    unpin1(s, held);
    /* The in-flight write survives the clear and lands afterwards. */
    store_commit_batch(s, &writing, 1);
    CHECK(present(s, "a", "in-flight"), "reservation lost by clear");
    CHECK_EQ(clear(s, "a"), 1);
    CHECK_EQ(clear(s, "a"), 0);
    CHECK_EQ(clear(s, "never"), 0);

    struct store_stats st = stats_of(s);
    CHECK_EQ(st.namespaces, 2);
    CHECK_EQ(st.objects, 2);
    CHECK_EQ(st.deletes, 7);
    CHECK_EQ(st.pool_used_bytes, 256 + 320); /* the 200- and 300-byte objects left */
    store_close(s);
}

static void test_watermarks(void)
{
    struct store *s = open_store_wm(16 * MiB, 0.75, 0.5);
    char key[32];
    for (int i = 0; i < 12; i++)
        CHECK_EQ(put(s, "", key_n(key, sizeof key, i), MiB, (uint64_t)i), 0);
    CHECK_EQ(store_maintain(s), 0); /* 75% is not above the high watermark */

    struct store_obj *o;
    CHECK_EQ(pin1(s, "", "key-0", 0, &o), 0);
    CHECK_EQ(put(s, "", "key-12", MiB, 12), 0);
    CHECK_EQ(store_maintain(s), 5); /* 13 MiB down to 8, skipping the pinned key-0 */
    for (int i = 0; i < 13; i++)
        CHECK(present(s, "", key_n(key, sizeof key, i)) == (i == 0 || i > 5),
              "key-%d after maintain", i);
    CHECK_EQ(stats_of(s).pool_used_bytes, 8 * MiB);
    unpin1(s, o);
    CHECK_EQ(store_maintain(s), 0);

    /* Between the watermarks nothing happens until use crosses high again. */
    for (int i = 13; i < 17; i++)
        CHECK_EQ(put(s, "", key_n(key, sizeof key, i), MiB, (uint64_t)i), 0);
    CHECK_EQ(store_maintain(s), 0);
    CHECK_EQ(put(s, "", "key-17", MiB, 17), 0);
    CHECK_EQ(store_maintain(s), 5);
    CHECK_EQ(stats_of(s).evictions, 10);
    store_close(s);
}

static void test_limits(void)
{
    struct store *s = open_store(8 * MiB);
    struct store_obj *o;
    CHECK_EQ(reserve1(s, "", "too-big", 8 * MiB + 1, &o), GDRKV_E_TOO_LARGE);
    CHECK_EQ(reserve1(s, "", "way-too-big", GK_MAX_OBJECT + 1, &o), GDRKV_E_TOO_LARGE);
    CHECK_EQ(put(s, "", "whole-pool", 8 * MiB, 1), 0);
    CHECK_EQ(put(s, "", "pushes-it-out", 1, 2), 0);
    CHECK(!present(s, "", "whole-pool"), "evicted to make room");

    static char long_key[GK_MAX_KEY_LEN + 2];
    memset(long_key, 'x', GK_MAX_KEY_LEN);
    CHECK_EQ(put(s, "", long_key, 10, 3), 0);
    CHECK(present(s, "", long_key), "a maximum-length key works");
    long_key[GK_MAX_KEY_LEN] = 'x';
    CHECK_EQ(reserve1(s, "", long_key, 10, &o), GDRKV_E_INVALID);
    CHECK_EQ(reserve1(s, "", "", 10, &o), GDRKV_E_INVALID);

    char long_ns[GK_MAX_NS_LEN + 2];
    memset(long_ns, 'n', sizeof long_ns - 1);
    long_ns[sizeof long_ns - 1] = 0;
    CHECK_EQ(reserve1(s, long_ns, "k", 10, &o), GDRKV_E_INVALID);
    CHECK_EQ(pin1(s, long_ns, "k", 0, &o), GDRKV_E_NOT_FOUND);
    long_ns[GK_MAX_NS_LEN] = 0;
    CHECK_EQ(put(s, long_ns, "k", 10, 4), 0);

    struct store_stats st = stats_of(s);
    CHECK_EQ(st.put_no_space, 0);
    CHECK_EQ(st.reserved_objects, 0);
    store_close(s);
}

/* A pool full of small objects: a multi-page object is made of whole pages,
 * so eviction must empty entire pages before it fits. */
static void test_big_object_evicts_small_ones(void)
{
    struct store *s = open_store(8 * MiB);
    char key[32];
    int n = 0;
    while (stats_of(s).evictions == 0)
        CHECK_EQ(put(s, "", key_n(key, sizeof key, n++), 100000, 1), 0);
    CHECK_EQ(put(s, "", "big", 3 * MiB, 7), 0);
    struct store_obj *o;
    CHECK_EQ(pin1(s, "", "big", 0, &o), 0);
    check_bytes(s, o, 7);
    unpin1(s, o);
    CHECK(present(s, "", key_n(key, sizeof key, n - 1)), "newest small object evicted");
    store_close(s);
}

/* A batch evicts at most 2 x GK_MAX_KEYS objects under one hold of the
 * lock, over all its keys (it used to be 32768 per key): in a pool full of
 * 64-byte objects a 1 MiB key needs more than a page's 16384 evictions, so
 * the batch runs out of budget and its last key finds no room. The
 * background drains the rest, in rounds. */
static void test_eviction_work_per_batch_is_bounded(void)
{
    struct store *s = open_store_wm(8 * MiB, 0.5, 0.25);
    char key[32];
    int n = 0;
    while (stats_of(s).evictions == 0)
        CHECK_EQ(put(s, "", key_n(key, sizeof key, n++), 64, 1), 0);
    uint64_t before = stats_of(s).evictions;
    struct gk_ns space = ns_of("");
    struct gk_entry e[3] = {entry_of("big-0", MiB), entry_of("big-1", MiB),
                            entry_of("big-2", MiB)};
    struct store_obj *objs[3];
    int32_t status[3];
    store_reserve_batch(s, &space, e, 3, objs, status);
    uint64_t evicted = stats_of(s).evictions - before;
    CHECK(evicted <= 2 * GK_MAX_KEYS, "one batch evicted %llu objects",
          (unsigned long long)evicted);
    CHECK(evicted >= GK_MAX_KEYS, "the batch tried: %llu evicted", (unsigned long long)evicted);
    CHECK_EQ(status[2], GDRKV_E_NO_SPACE);
    store_abort_batch(s, objs, 3);
    /* The background is not bounded per call the same way: it drains to
     * the low watermark, letting go of the lock between rounds. */
    uint64_t drained = store_maintain(s);
    CHECK(drained > 2 * GK_MAX_KEYS, "store_maintain evicted %llu", (unsigned long long)drained);
    CHECK(stats_of(s).pool_used_bytes <= 2 * MiB + MiB, "drained to the low watermark");
    store_close(s);
}

/* --------------------------------------------------------- random model */

/*
 * Random operations with a fixed seed against a shadow model. The model
 * cannot predict which objects eviction picks, so after every step it asks
 * the store which committed keys are gone, and checks that only unpinned
 * ones went and that the eviction counters agree; then every counter and
 * pool_used_bytes must match what the model computes.
 */
enum { M_NS = 3, M_KEYS = 64, M_OBJS = 8192, M_PINS = 16, M_RESV = 6, M_OPS = 6000 };
enum m_state { M_FREE, M_RESERVED, M_COMMITTED, M_UNLINKED };

struct m_obj {
    enum m_state state;
    uint64_t size;
    uint32_t pins;
    int ns, key;
    struct store_obj *real;
};

struct model {
    struct store *s;
    int file;                       /* over a pool file, restarted now and then */
    struct alloc shape;             /* for footprints */
    struct m_obj objs[M_OBJS];
    int nobjs;
    int current[M_NS][M_KEYS];      /* the key's reserved or committed object, or -1 */
    int pins[M_PINS], npins;        /* pinned objects, one entry per pin */
    int resv[M_RESV], nresv;
    uint64_t evictions, evicted_bytes;
};

static const char *const m_ns_names[M_NS] = {"", "model-a", "model-b"};

static const char *m_key(int k)
{
    static char buf[32];
    snprintf(buf, sizeof buf, "k%d", k);
    return buf;
}

static uint64_t m_size(uint64_t r)
{
    static const uint64_t sizes[] = {0, 100, 5000, 70000, 300000, MiB, 5 * MiB / 2};
    return r % 3 ? sizes[(r >> 4) % GK_ARRAY_LEN(sizes)] : (r >> 4) % (3 * MiB);
}

static void m_put(struct model *m, uint64_t r, int hold)
{
    int ns = (int)(r % M_NS), k = (int)((r >> 8) % M_KEYS);
    uint64_t size = m_size(r >> 16);
    struct store_obj *o;
    int32_t status = reserve1(m->s, m_ns_names[ns], m_key(k), size, &o);
    if (m->current[ns][k] >= 0) {
        CHECK_EQ(status, m->objs[m->current[ns][k]].state == M_RESERVED ? GDRKV_E_BUSY
                                                                         : STORE_PRESENT);
        return;
    }
    if (status == GDRKV_E_NO_SPACE)
        return; /* possible when pins and reservations hold most of the pool */
    CHECK_EQ(status, 0);
    CHECK(m->nobjs < M_OBJS, "model full");
    int id = m->nobjs++;
    m->objs[id] = (struct m_obj){M_RESERVED, size, 0, ns, k, o};
    m->current[ns][k] = id;
    write_bytes(m->s, o, (uint64_t)id);
    if (hold && m->nresv < M_RESV) {
        m->resv[m->nresv++] = id;
    } else if ((r >> 40) % 8 != 0) {
        store_commit_batch(m->s, &o, 1);
        m->objs[id].state = M_COMMITTED;
    } else {
        store_abort_batch(m->s, &o, 1);
        m->objs[id].state = M_FREE;
        m->current[ns][k] = -1;
    }
}

static void m_commit_held(struct model *m)
{
    for (int i = 0; i < m->nresv; i++) {
        struct m_obj *mo = &m->objs[m->resv[i]];
        store_commit_batch(m->s, &mo->real, 1);
        mo->state = M_COMMITTED;
    }
    m->nresv = 0;
}

static void m_pin(struct model *m, uint64_t r)
{
    int ns = (int)(r % M_NS), k = (int)((r >> 8) % M_KEYS);
    struct store_obj *o;
    int32_t status = pin1(m->s, m_ns_names[ns], m_key(k), (int)(r >> 20) & 1, &o);
    int id = m->current[ns][k];
    if (id < 0 || m->objs[id].state != M_COMMITTED) {
        CHECK_EQ(status, GDRKV_E_NOT_FOUND);
        return;
    }
    CHECK_EQ(status, 0);
    CHECK(o == m->objs[id].real, "pinned another object");
    check_bytes(m->s, o, (uint64_t)id);
    if (m->npins == M_PINS) {
        unpin1(m->s, o);
        return;
    }
    m->objs[id].pins++;
    m->pins[m->npins++] = id;
}

static void m_unpin(struct model *m, uint64_t r)
{
    if (m->npins == 0)
        return;
    int i = (int)(r % (uint64_t)m->npins), id = m->pins[i];
    struct m_obj *mo = &m->objs[id];
    check_bytes(m->s, mo->real, (uint64_t)id); /* intact even if deleted meanwhile */
    unpin1(m->s, mo->real);
    m->pins[i] = m->pins[--m->npins];
    if (--mo->pins == 0 && mo->state == M_UNLINKED)
        mo->state = M_FREE;
}

static void m_unlink(struct model *m, int id)
{
    struct m_obj *mo = &m->objs[id];
    m->current[mo->ns][mo->key] = -1;
    mo->state = mo->pins ? M_UNLINKED : M_FREE;
}

static void m_delete(struct model *m, uint64_t r)
{
    int ns = (int)(r % M_NS), k = (int)((r >> 8) % M_KEYS);
    int32_t status = delete1(m->s, m_ns_names[ns], m_key(k));
    int id = m->current[ns][k];
    if (id < 0 || m->objs[id].state != M_COMMITTED) {
        CHECK_EQ(status, GDRKV_E_NOT_FOUND);
        return;
    }
    CHECK_EQ(status, 0);
    m_unlink(m, id);
}

static void m_clear(struct model *m, uint64_t r)
{
    int ns = (int)(r % M_NS);
    uint64_t expected = 0;
    for (int k = 0; k < M_KEYS; k++) {
        int id = m->current[ns][k];
        if (id >= 0 && m->objs[id].state == M_COMMITTED) {
            m_unlink(m, id);
            expected++;
        }
    }
    CHECK_EQ(clear(m->s, m_ns_names[ns]), expected);
}

/* What an object takes in the pool, headers included over a pool file. */
static uint64_t m_footprint(const struct model *m, const struct m_obj *mo)
{
    if (!m->file)
        return alloc_footprint(&m->shape, mo->size, 0, 0);
    uint32_t n = 1, prev, head;
    do {
        prev = n;
        head = persist_head_len((uint32_t)strlen(m_ns_names[mo->ns]),
                                (uint32_t)strlen(m_key(mo->key)), n);
        n = alloc_nchunks(mo->size, head, PERSIST_PIECE_HDR);
    } while (n != prev);
    return alloc_footprint(&m->shape, mo->size, head, PERSIST_PIECE_HDR);
}

/* A restart over the pool file (closing the store writes nothing, so it is
 * a kill as far as the file goes): committed objects come back byte-exact,
 * reservations and pinned zombies are dropped. */
static void m_restart(struct model *m)
{
    uint64_t committed = 0, dropped = 0;
    store_close(m->s);
    m->s = open_file_wm(8 * MiB, 0.9, 0.6);
    for (int id = 0; id < m->nobjs; id++) {
        struct m_obj *mo = &m->objs[id];
        dropped += mo->state == M_RESERVED || mo->state == M_UNLINKED;
        if (mo->state == M_RESERVED)
            m->current[mo->ns][mo->key] = -1;
        if (mo->state != M_COMMITTED) {
            mo->state = M_FREE;
            continue;
        }
        committed++;
        mo->pins = 0;
        CHECK_EQ(pin1(m->s, m_ns_names[mo->ns], m_key(mo->key), 0, &mo->real), 0);
        check_bytes(m->s, mo->real, (uint64_t)id);
        unpin1(m->s, mo->real);
    }
    m->npins = m->nresv = 0;
    m->evictions = m->evicted_bytes = 0;
    struct store_stats st = stats_of(m->s);
    CHECK_EQ(st.restored_objects, committed);
    CHECK_EQ(st.restore_dropped, dropped);
}

/* Finds out what eviction took, then checks every counter. */
static void m_reconcile(struct model *m)
{
    uint64_t objects = 0, bytes = 0, reserved = 0, pinned = 0, used = 0;
    int spaces = 0;
    for (int ns = 0; ns < M_NS; ns++) {
        int live = 0;
        for (int k = 0; k < M_KEYS; k++) {
            int id = m->current[ns][k];
            if (id < 0)
                continue;
            struct m_obj *mo = &m->objs[id];
            if (mo->state == M_COMMITTED && !present(m->s, m_ns_names[ns], m_key(k))) {
                CHECK(mo->pins == 0, "pinned object %d evicted", id);
                m->evictions++;
                m->evicted_bytes += mo->size;
                m_unlink(m, id);
                continue;
            }
            live = 1;
        }
        spaces += live;
    }
    for (int id = 0; id < m->nobjs; id++) {
        const struct m_obj *mo = &m->objs[id];
        if (mo->state == M_FREE)
            continue;
        used += m_footprint(m, mo);
        objects += mo->state == M_COMMITTED;
        bytes += mo->state == M_COMMITTED ? mo->size : 0;
        reserved += mo->state == M_RESERVED;
        pinned += mo->pins > 0;
    }
    struct store_stats st = stats_of(m->s);
    CHECK_EQ(st.evictions, m->evictions);
    CHECK_EQ(st.evicted_bytes, m->evicted_bytes);
    CHECK_EQ(st.objects, objects);
    CHECK_EQ(st.object_bytes, bytes);
    CHECK_EQ(st.reserved_objects, reserved);
    CHECK_EQ(st.pinned_objects, pinned);
    CHECK_EQ(st.pool_used_bytes, used);
    CHECK_EQ(st.namespaces, spaces);
    CHECK(st.pool_used_bytes <= st.pool_bytes, "pool overcommitted");
}

static void churn(int file)
{
    static struct model m;
    uint64_t restarts = 0, puts_before = 0;
    memset(&m, 0, sizeof m);
    memset(m.current, -1, sizeof m.current);
    m.file = file;
    if (file) {
        char err[256];
        CHECK(try_open_file(&m.s, 8 * MiB, 1, 0.9, 0.6, err, sizeof err) == 0, "%s", err);
    } else {
        m.s = open_store_wm(8 * MiB, 0.9, 0.6);
    }
    CHECK(alloc_init(&m.shape, MiB) == 0, "alloc for footprints");
    uint64_t seed = 20240601;
    for (int op = 0; op < M_OPS; op++) {
        uint64_t r = check_rand(&seed);
        uint64_t arg = check_rand(&seed);
        if (file && r % 300 == 7) {
            puts_before += stats_of(m.s).puts;
            m_restart(&m);
            restarts++;
        }
        switch (r % 100) {
        case 0: m_clear(&m, arg); break;
        case 1: case 2: case 3: store_maintain(m.s); break;
        case 4: case 5: case 6: case 7: m_commit_held(&m); break;
        case 8: case 9: case 10: case 11: case 12: case 13: m_put(&m, arg, 1); break;
        default:
            if (r % 100 < 50)
                m_put(&m, arg, 0);
            else if (r % 100 < 65)
                m_pin(&m, arg);
            else if (r % 100 < 85)
                m_unpin(&m, arg);
            else
                m_delete(&m, arg);
        }
        m_reconcile(&m);
    }
    struct store_stats st = stats_of(m.s);
    printf("   %d ops: %llu puts, %llu evictions, %llu dedup, %llu no-space\n", M_OPS,
           (unsigned long long)st.puts, (unsigned long long)st.evictions,
           (unsigned long long)st.put_dedup, (unsigned long long)st.put_no_space);
    CHECK((st.evictions > 100 && st.puts > 1000) || file, "the churn did not exercise eviction");
    if (file)
        printf("   over a pool file: %llu restarts, %llu puts in all\n",
               (unsigned long long)restarts, (unsigned long long)(puts_before + st.puts));
    CHECK(!file || (restarts >= 10 && puts_before + st.puts > 1000), "too few restarts or puts");

    m_commit_held(&m);
    while (m.npins)
        m_unpin(&m, 0);
    for (int ns = 0; ns < M_NS; ns++)
        clear(m.s, m_ns_names[ns]);
    st = stats_of(m.s);
    CHECK_EQ(st.pool_used_bytes, 0);
    CHECK_EQ(st.objects + st.reserved_objects + st.pinned_objects + st.namespaces, 0);
    alloc_destroy(&m.shape);
    store_close(m.s);
    if (file)
        unlink(pool_path());
}

static void test_random_churn_matches_model(void) { churn(0); }
static void test_random_churn_over_a_pool_file(void) { churn(1); }

/* --------------------------------------------------------------- pool file */

static uint64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* Objects of every shape survive a restart byte for byte, in their
 * namespaces; deleted, aborted and half-written ones do not come back;
 * the restarted store goes on writing and restarts again. 32 pages: the
 * scan runs on two threads where there are two cores. */
static void test_pool_file_restart(void)
{
    static const uint64_t sizes[] = {0, 1, 100, 4096, MiB - 300, MiB, 5 * MiB / 2, 3 * MiB + 5};
    enum { N = GK_ARRAY_LEN(sizes) };
    char key[32], err[256];
    struct store *s;
    struct store_obj *o;

    unlink(pool_path());
    CHECK(try_open_file(&s, 32 * MiB, 0, 1, 0.9, err, sizeof err) == 0, "%s", err);
    CHECK_EQ(stats_of(s).pool_file, 1);
    CHECK_EQ(file_size(pool_path()), persist_meta_off(32 * MiB) + persist_meta_len(32 * MiB));
    struct stat st;
    CHECK(stat(pool_path(), &st) == 0 && (st.st_mode & 0777) == 0600, "mode %o", st.st_mode);
    for (int i = 0; i < N; i++)
        CHECK_EQ(put(s, i % 2 ? "ns-odd" : "", key_n(key, sizeof key, i), sizes[i], 500 + i), 0);
    CHECK_EQ(put(s, "gone", "deleted", 5000, 1), 0);
    CHECK_EQ(delete1(s, "gone", "deleted"), 0);
    CHECK_EQ(reserve1(s, "", "aborted", 5000, &o), 0);
    store_abort_batch(s, &o, 1);
    CHECK_EQ(reserve1(s, "", "half-written", 2 * MiB, &o), 0);
    write_bytes(s, o, 7);
    uint64_t used = stats_of(s).pool_used_bytes;
    store_close(s);

    for (int round = 0; round < 2; round++) {
        s = open_file_wm(32 * MiB, 1, 0.9);
        struct store_stats after = stats_of(s);
        CHECK_EQ(after.restored_objects, N + round);
        CHECK_EQ(after.restore_dropped, round == 0);
        CHECK_EQ(after.objects, N + round);
        CHECK_EQ(after.namespaces, 2);
        CHECK_EQ(after.reserved_objects, 0);
        for (int i = 0; i < N; i++) {
            CHECK_EQ(pin1(s, i % 2 ? "ns-odd" : "", key_n(key, sizeof key, i), 1, &o), 0);
            CHECK_EQ(store_obj_size(o), sizes[i]);
            check_bytes(s, o, 500 + (uint64_t)i);
            unpin1(s, o);
        }
        CHECK(!present(s, "gone", "deleted") && !present(s, "", "aborted") &&
              !present(s, "", "half-written"), "a dead object came back");
        if (round == 0) {
            /* The half-written object's room is free again. */
            CHECK(after.pool_used_bytes < used, "used %llu, before %llu",
                  (unsigned long long)after.pool_used_bytes, (unsigned long long)used);
            CHECK_EQ(put(s, "", "after", 2 * MiB, 77), 0);
        } else {
            CHECK_EQ(pin1(s, "", "after", 1, &o), 0);
            check_bytes(s, o, 77);
            unpin1(s, o);
        }
        store_close(s);
    }
    unlink(pool_path());
}

/* Eviction is in commit order after a restart: the oldest writes go first. */
static void test_pool_file_keeps_commit_order(void)
{
    char key[32];
    unlink(pool_path());
    struct store *s = open_file_wm(8 * MiB, 1, 0.9);
    for (int i = 0; i < 7; i++)
        CHECK_EQ(put(s, "", key_n(key, sizeof key, i), MiB - 4096, (uint64_t)i), 0);
    store_close(s);
    s = open_file_wm(8 * MiB, 1, 0.9);
    CHECK_EQ(put(s, "", "new", 3 * MiB - 8192, 99), 0); /* 3 pages: 1 free, 2 evicted */
    CHECK(!present(s, "", key_n(key, sizeof key, 0)) && !present(s, "", key_n(key, sizeof key, 1)),
          "the oldest were not evicted first");
    for (int i = 2; i < 7; i++)
        CHECK(present(s, "", key_n(key, sizeof key, i)), "key %d evicted out of order", i);
    store_close(s);
    unlink(pool_path());
}

/* Where the bytes of needle first appear in the pool file, or -1. */
static int64_t find_in_file(const char *needle)
{
    int fd = open(pool_path(), O_RDONLY);
    uint64_t len = file_size(pool_path());
    uint8_t *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(fd >= 0 && map != MAP_FAILED, "map the pool file");
    const uint8_t *at = memmem(map, len, needle, strlen(needle));
    int64_t off = at ? at - map : -1;
    munmap(map, len);
    close(fd);
    return off;
}

static void poke_file(int64_t off, uint8_t byte)
{
    int fd = open(pool_path(), O_WRONLY);
    CHECK(fd >= 0 && pwrite(fd, &byte, 1, off) == 1, "poke the pool file");
    close(fd);
}

/* Counts a namespace's objects into counts[name[0] - 'a']. */
static void count_ns(void *arg, const uint8_t *name, uint32_t len, uint64_t objects,
                     uint64_t bytes)
{
    (void)bytes;
    if (len == 1 && name[0] >= 'a' && name[0] <= 'c')
        ((uint64_t *)arg)[name[0] - 'a'] = objects;
}

static const char *run_ns(int i) { return (const char *[]){"a", "b", "c"}[i / 1000 % 3]; }

static const char *key6(char *buf, size_t cap, int i)
{
    snprintf(buf, cap, "k%06d", i);
    return buf;
}

/* Enough objects, over enough pages, that every step of the restart runs
 * on a thread per core (two here), with commit order and page order apart
 * (a third of the first objects deleted, their chunks taken by later
 * ones): every object back byte for byte in its namespace, namespace
 * counts right, a forged second head of one key loses to the first one
 * committed wherever the two land, and eviction afterwards takes the
 * oldest writes first. */
static void test_pool_file_restart_in_parallel(void)
{
    enum { FIRST = 36000, DELETED_BELOW = 30000, LATER = 8000, SIZE = 1000 };
    enum { FORGED = 33000, VICTIM = 5 };           /* first objects, not deleted */
    static int order[FIRST + LATER];               /* object numbers, in commit order */
    int n = 0;
    char key[32], victim[32];
    struct store_obj *o;

    unlink(pool_path());
    struct store *s = open_file_wm(64 * MiB, 1, 0.9);
    for (int i = 0; i < FIRST; i++)
        CHECK_EQ(put(s, run_ns(i), key6(key, sizeof key, i), SIZE, (uint64_t)i), 0);
    for (int i = 0; i < DELETED_BELOW; i += 3)
        CHECK_EQ(delete1(s, run_ns(i), key6(key, sizeof key, i)), 0);
    for (int i = 0; i < FIRST; i++)
        if (i >= DELETED_BELOW || i % 3)
            order[n++] = i;
    for (int i = FIRST; i < FIRST + LATER; i++) {
        CHECK_EQ(put(s, run_ns(i), key6(key, sizeof key, i), SIZE, (uint64_t)i), 0);
        order[n++] = i;
    }
    store_close(s);

    /* FORGED's head rewritten to name VICTIM's key, still committed. */
    int64_t at = find_in_file(key6(key, sizeof key, FORGED));
    CHECK(at > 0, "key not in the file");
    uint64_t head = (uint64_t)at - 48 - 1;  /* single piece, namespace of one byte */
    int fd = open(pool_path(), O_RDWR);
    uint64_t len = file_size(pool_path());
    uint8_t *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(fd >= 0 && map != MAP_FAILED, "map the pool file");
    struct persist_head h;
    CHECK(persist_read_head(map, head, 4096, &h), "no head at %llu", (unsigned long long)head);
    CHECK(!strcmp(run_ns(FORGED), run_ns(VICTIM)), "the forged key's namespace");
    h.key = (const uint8_t *)key6(victim, sizeof victim, VICTIM);
    uint64_t seq = h.seq;
    persist_write_head(map, head, &h);
    persist_commit(map, head, seq);
    munmap(map, len);
    close(fd);

    s = open_file_wm(64 * MiB, 1, 0.9);
    struct store_stats st = stats_of(s);
    CHECK_EQ(st.restored_objects, (uint64_t)n - 1);
    CHECK_EQ(st.restore_dropped, 1);
    CHECK_EQ(st.objects, (uint64_t)n - 1);
    CHECK_EQ(st.object_bytes, (n - 1) * (uint64_t)SIZE);
    CHECK_EQ(st.namespaces, 3);
    uint64_t counts[3] = {0}, want[3] = {0};
    CHECK_EQ(store_each_namespace(s, 10, count_ns, counts), 3);
    for (int k = 0; k < n; k++)
        want[run_ns(order[k])[0] - 'a'] += order[k] != FORGED;
    for (int k = 0; k < 3; k++)
        CHECK_EQ(counts[k], want[k]);
    for (int k = 0; k < n; k++) {
        int i = order[k];
        int32_t rc = pin1(s, run_ns(i), key6(key, sizeof key, i), 0, &o);
        if (i == FORGED) {
            CHECK_EQ(rc, GDRKV_E_NOT_FOUND);
            continue;
        }
        CHECK_EQ(rc, 0);
        check_bytes(s, o, (uint64_t)i);
        unpin1(s, o);
    }

    /* Pages a page each until every small object is gone: after every
     * few, the ones evicted are the oldest, in commit order. */
    int gone = 0;                   /* order[0, gone) evicted */
    for (int k = 0; gone < n; k++) {
        CHECK(k < 256, "the small objects outlived 256 big ones");
        /* A call evicts a bounded number of objects: those a page is
         * shared with can take several calls to free it. */
        int32_t rc;
        for (int tries = 0; (rc = put(s, "big", key_n(key, sizeof key, k), MiB - 4096,
                                      1000 + (uint64_t)k)) == GDRKV_E_NO_SPACE && tries < 16;)
            tries++;
        CHECK_EQ(rc, 0);
        if (k % 4)
            continue;
        while (gone < n && (order[gone] == FORGED ||
                            !present(s, run_ns(order[gone]), key6(key, sizeof key, order[gone]))))
            gone++;
        for (int j = gone; j < n; j++)
            CHECK(order[j] == FORGED || present(s, run_ns(order[j]), key6(key, sizeof key, order[j])),
                  "object %d evicted before the older %d", order[j], order[gone]);
    }
    store_close(s);
    unlink(pool_path());
}

/* A head whose bytes changed (a torn write) is dropped, never served; the
 * other objects are unharmed. */
static void test_pool_file_drops_a_torn_head(void)
{
    unlink(pool_path());
    struct store *s = open_file_wm(8 * MiB, 1, 0.9);
    CHECK_EQ(put(s, "", "intact-key", 5000, 1), 0);
    CHECK_EQ(put(s, "", "damaged-key", 5000, 2), 0);
    store_close(s);
    int64_t off = find_in_file("damaged-key");
    CHECK(off > 0, "key not in the file");
    poke_file(off, 'D');
    s = open_file_wm(8 * MiB, 1, 0.9);
    CHECK(present(s, "", "intact-key"), "the intact object is gone");
    CHECK(!present(s, "", "damaged-key") && !present(s, "", "Damaged-key"), "a torn head served");
    CHECK_EQ(stats_of(s).restore_dropped, 1);
    store_close(s);
    unlink(pool_path());
}

/* Another geometry, a file that is no pool, one in use and one others can
 * read are refused with a reason; reset starts afresh. */
static void test_pool_file_refusals(void)
{
    char err[256] = "";
    struct store *s, *other;
    unlink(pool_path());
    s = open_file_wm(8 * MiB, 1, 0.9);
    CHECK_EQ(put(s, "", "k", 100, 1), 0);
    CHECK(try_open_file(&other, 8 * MiB, 0, 1, 0.9, err, sizeof err) != 0 &&
          strstr(err, "another gdrkv server"), "a second store on the file: '%s'", err);
    store_close(s);

    CHECK(try_open_file(&s, 16 * MiB, 0, 1, 0.9, err, sizeof err) != 0 &&
          strstr(err, "reset it"), "another size: '%s'", err);
    CHECK_EQ(file_size(pool_path()), persist_meta_off(8 * MiB) + persist_meta_len(8 * MiB));

    poke_file((int64_t)persist_meta_off(8 * MiB), 'X');
    CHECK(try_open_file(&s, 8 * MiB, 0, 1, 0.9, err, sizeof err) != 0 &&
          strstr(err, "not a gdrkv pool file"), "bad magic: '%s'", err);

    CHECK(try_open_file(&s, 16 * MiB, 1, 1, 0.9, err, sizeof err) == 0, "reset: %s", err);
    CHECK(!present(s, "", "k") && stats_of(s).restored_objects == 0, "reset kept objects");
    store_close(s);

    chmod(pool_path(), 0640);
    CHECK(try_open_file(&s, 16 * MiB, 0, 1, 0.9, err, sizeof err) != 0 &&
          strstr(err, "chmod 600"), "group-readable file: '%s'", err);
    unlink(pool_path());
}

/* ---------------------------------------------------------------- threads */

struct worker {
    struct store *s;
    int id;
    uint64_t ops;
    uint64_t reads;             /* objects pinned and checked byte for byte */
};

/* The tag an object's bytes carry: a function of what it is, so any
 * thread can check any object whoever wrote it. */
static uint64_t tag_of(const char *ns, const char *key, uint64_t size)
{
    uint64_t h = size * 0x9e3779b97f4a7c15ull;
    for (const char *p = ns; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    for (const char *p = key; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    return h;
}

static void *worker_run(void *arg)
{
    struct worker *w = arg;
    uint64_t seed = 1000 + (uint64_t)w->id;
    const char *spaces[] = {"shared", w->id % 2 ? "odd" : "even"};
    char key[32];
    uint64_t deadline = gk_now_ns() + 300 * 1000000ull;
    while (gk_now_ns() < deadline) {
        uint64_t r = check_rand(&seed);
        const char *ns = spaces[r & 1];
        key_n(key, sizeof key, (int)((r >> 8) % 200));
        struct store_obj *o;
        int32_t status;
        switch ((r >> 16) % 4) {
        case 0:
        case 1: {
            uint64_t size = (r >> 24) % (2 * MiB);
            status = put(w->s, ns, key, size, tag_of(ns, key, size));
            /* BUSY: another thread is writing the same key right now. */
            CHECK(status == 0 || status == STORE_PRESENT || status == GDRKV_E_NO_SPACE ||
                  status == GDRKV_E_BUSY, "put status %d", status);
            break;
        }
        case 2:
            /* Whoever wrote the object, its bytes are those of its key,
             * namespace and size: a torn or misplaced write shows here. */
            status = pin1(w->s, ns, key, 1, &o);
            CHECK(status == 0 || status == GDRKV_E_NOT_FOUND, "pin status %d", status);
            if (status == 0) {
                check_bytes(w->s, o, tag_of(ns, key, store_obj_size(o)));
                unpin1(w->s, o);
                w->reads++;
            }
            break;
        default:
            status = delete1(w->s, ns, key);
            CHECK(status == 0 || status == GDRKV_E_NOT_FOUND, "delete status %d", status);
        }
        if (r % 64 == 0)
            store_maintain(w->s);
        w->ops++;
    }
    return NULL;
}

/* Several threads on one store: afterwards no pin or reservation is left
 * over and clearing every namespace empties the pool. */
static void test_threads(void)
{
    enum { N = 4 };
    struct store *s = open_store_wm(32 * MiB, 0.9, 0.7);
    pthread_t threads[N];
    struct worker workers[N];
    for (int i = 0; i < N; i++) {
        workers[i] = (struct worker){s, i, 0, 0};
        CHECK(pthread_create(&threads[i], NULL, worker_run, &workers[i]) == 0, "thread");
    }
    uint64_t ops = 0, reads = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(threads[i], NULL);
        ops += workers[i].ops;
        reads += workers[i].reads;
    }
    CHECK(reads > 0, "no object was ever read back");
    struct store_stats st = stats_of(s);
    CHECK_EQ(st.pinned_objects, 0);
    CHECK_EQ(st.reserved_objects, 0);
    clear(s, "shared");
    clear(s, "odd");
    clear(s, "even");
    st = stats_of(s);
    CHECK_EQ(st.objects, 0);
    CHECK_EQ(st.pool_used_bytes, 0);
    CHECK_EQ(st.namespaces, 0);
    printf("   %d threads, %llu ops, %llu objects checked\n", N, (unsigned long long)ops,
           (unsigned long long)reads);
    store_close(s);
}

/* ------------------------------------------------------------ disk tier */

static char disk_dir[256];

static struct store *open_with_disk(uint64_t memory, uint64_t disk_regions, int reset)
{
    if (!disk_dir[0]) {
        const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(disk_dir, sizeof disk_dir, "%s/gdrkv-test-store-disk-XXXXXX", tmp);
        CHECK(mkdtemp(disk_dir) != NULL, "mkdtemp: %s", strerror(errno));
    }
    const char *paths[] = {disk_dir};
    struct store_opts opts = {.memory_bytes = memory, .high_watermark = 0.75,
                              .low_watermark = 0.5, .disk_paths = paths, .disk_npaths = 1,
                              .disk_bytes_per_path = 4096 + disk_regions * (16 * MiB),
                              .reset_disk = reset};
    struct store *s;
    char err[512] = "";
    CHECK(store_open(&s, &opts, err, sizeof err) == 0, "store_open with a disk: %s", err);
    return s;
}

static void remove_disk_dir(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/gdrkv.disk", disk_dir);
    unlink(path);
    rmdir(disk_dir);
    disk_dir[0] = 0;
}

/* Waits until the demoter brought the pool under its high watermark. */
static void wait_demoted(struct store *s)
{
    for (int i = 0; i < 2000; i++) {
        struct store_stats st = stats_of(s);
        if (st.pool_used_bytes <= st.pool_bytes * 3 / 4)
            return;
        store_maintain(s);
        usleep(2000);
    }
    CHECK(0, "the demoter did not bring the pool under its high watermark");
}

/* Reads key i as a reader does: promoted from disk when it is not in the
 * pool, then pinned; checks its bytes. Returns whether it was found. */
static int read_through(struct store *s, const char *ns, int i)
{
    char key[32];
    key_n(key, sizeof key, i);
    struct gk_ns space = ns_of(ns);
    struct gk_entry e = entry_of(key, 0);
    struct store_obj *present, *held = NULL;
    if (store_hold_batch(s, &space, &e, 1, &present))
        CHECK_EQ(store_promote_batch(s, &space, &e, 1, &held), 1);
    struct store_obj *o;
    int rc = pin1(s, ns, key, 1, &o);
    store_unpin_batch(s, &present, 1);
    store_unpin_batch(s, &held, 1);
    if (rc != 0)
        return 0;
    check_bytes(s, o, (uint64_t)i);
    unpin1(s, o);
    return 1;
}

static void test_disk_tier_serves_8x_the_pool(void)
{
    /* 8 MiB of pool, 64 MiB written in 256 KiB objects, paced as a writer
     * that lets the demoter keep up */
    struct store *s = open_with_disk(8 * MiB, 8, 1);
    char key[32];
    const int n = 256;
    for (int i = 0; i < n; i++) {
        CHECK_EQ(put(s, "ns", key_n(key, sizeof key, i), 256 * 1024, (uint64_t)i), 0);
        if (i % 8 == 7)
            wait_demoted(s);
    }
    struct store_stats st = stats_of(s);
    CHECK(st.demotions > (uint64_t)n / 2, "%llu demotions", (unsigned long long)st.demotions);
    CHECK_EQ(st.evicted_not_on_disk, 0);
    for (int i = 0; i < n; i++) {
        CHECK(present(s, "ns", key_n(key, sizeof key, i)), "key %d is gone", i);
        CHECK(read_through(s, "ns", i), "key %d could not be read", i);
        if (i % 8 == 7)
            wait_demoted(s);
    }
    st = stats_of(s);
    CHECK(st.promotions > (uint64_t)n / 2, "%llu promotions", (unsigned long long)st.promotions);
    CHECK_EQ(st.disk_errors, 0);
    CHECK_EQ(st.disk_bad_records, 0);
    store_close(s);

    /* a restart finds them on disk */
    s = open_with_disk(8 * MiB, 8, 0);
    CHECK(stats_of(s).disk_restored_objects >= (uint64_t)n * 3 / 4, "%llu restored",
          (unsigned long long)stats_of(s).disk_restored_objects);
    int found = 0;
    for (int i = 0; i < n; i++) {
        found += read_through(s, "ns", i);
        if (i % 8 == 7)
            wait_demoted(s);
    }
    CHECK(found >= n * 3 / 4, "%d of %d found after the restart", found, n);
    store_close(s);
    remove_disk_dir();
}

/* The room hook's calls (store_set_room_hook). */
static void count_room(void *arg) { __atomic_add_fetch((int *)arg, 1, __ATOMIC_RELAXED); }

/* The throttle policy (the default with a disk tier): writers twice the
 * pool, unpaced, in batches of 8. A batch that finds the pool full of
 * objects not on disk yet reserves nothing and waits for the room hook,
 * which the demoter calls once it wrote some; nothing is evicted before
 * it reached the disk, and every key reads back. */
static void test_writers_wait_for_the_disk_instead_of_dropping(void)
{
    struct store *s = open_with_disk(8 * MiB, 8, 1);
    int rooms = 0, waits = 0;
    store_set_room_hook(s, count_room, &rooms);
    struct gk_ns space = ns_of("ns");
    char keys[8][32];
    struct gk_entry e[8];
    struct store_obj *objs[8];
    int32_t status[8];
    for (int first = 0; first < 64; first += 8) {
        for (int k = 0; k < 8; k++)
            e[k] = entry_of(key_n(keys[k], sizeof keys[k], first + k), 256 * 1024);
        for (int tries = 0; store_reserve_batch_or_wait(s, &space, e, 8, objs, status); tries++) {
            for (int k = 0; k < 8; k++)
                CHECK(objs[k] == NULL, "a waiting batch holds a reservation");
            int seen = __atomic_load_n(&rooms, __ATOMIC_RELAXED);
            for (int ms = 0; ms < 10000 && __atomic_load_n(&rooms, __ATOMIC_RELAXED) == seen;
                 ms++)
                usleep(1000);       /* the demoter's hook, or 10 s */
            CHECK(tries < 1000, "batch at %d never found room", first);
            waits++;
        }
        for (int k = 0; k < 8; k++) {
            CHECK_EQ(status[k], 0);
            write_bytes(s, objs[k], (uint64_t)(first + k));
        }
        store_commit_batch(s, objs, 8);
    }
    store_set_room_hook(s, NULL, NULL);
    struct store_stats st = stats_of(s);
    CHECK(waits > 0 && st.put_throttled >= (uint64_t)waits, "%d waits, %llu throttled", waits,
          (unsigned long long)st.put_throttled);
    CHECK(rooms > 0, "the room hook was never called");
    CHECK_EQ(st.evicted_not_on_disk, 0);
    CHECK_EQ(st.put_no_space, 0);
    for (int i = 0; i < 64; i++)
        CHECK(read_through(s, "ns", i), "key %d was dropped", i);
    store_close(s);
    remove_disk_dir();
}

/* A reader's keys stay in the pool from their promotion until it pins them
 * itself: the promotion pins the keys it brings back and those it found
 * there, so a burst of writes meanwhile (which evicts whatever is not
 * pinned, on disk or not) takes neither. */
static void test_promoted_keys_stay_until_read(void)
{
    struct store *s = open_with_disk(8 * MiB, 8, 1);
    char key[32], cold[32], warm[32];
    for (int i = 0; i < 64; i++) {
        CHECK_EQ(put(s, "ns", key_n(key, sizeof key, i), 256 * 1024, (uint64_t)i), 0);
        if (i % 8 == 7)
            wait_demoted(s);
    }
    key_n(cold, sizeof cold, 0);        /* on disk only by now */
    key_n(warm, sizeof warm, 63);       /* in the pool */
    struct gk_ns space = ns_of("ns");
    struct gk_entry e[2] = {entry_of(cold, 0), entry_of(warm, 0)};
    struct store_obj *held[2];
    CHECK_EQ(store_promote_batch(s, &space, e, 2, held), 1);
    CHECK(held[0] && held[1], "held %p %p", (void *)held[0], (void *)held[1]);
    for (int i = 100; i < 140; i++)     /* a pool's worth of writes, unpaced */
        put(s, "ns", key_n(key, sizeof key, i), 256 * 1024, (uint64_t)i);
    struct store_obj *o;
    CHECK_EQ(pin1(s, "ns", cold, 1, &o), 0);
    check_bytes(s, o, 0);
    unpin1(s, o);
    CHECK_EQ(pin1(s, "ns", warm, 1, &o), 0);
    check_bytes(s, o, 63);
    unpin1(s, o);
    store_unpin_batch(s, held, 2);
    store_close(s);
    remove_disk_dir();
}

static void test_disk_tier_deletes_and_clears(void)
{
    struct store *s = open_with_disk(4 * MiB, 2, 1);
    char key[32];
    for (int i = 0; i < 64; i++) {
        CHECK_EQ(put(s, i < 32 ? "a" : "b", key_n(key, sizeof key, i), 128 * 1024,
                     (uint64_t)i), 0);
        if (i % 4 == 3)
            wait_demoted(s);
    }
    /* key 0 is on disk only by now: deleting it deletes it there */
    CHECK(present(s, "a", key_n(key, sizeof key, 0)), "key 0");
    CHECK_EQ(delete1(s, "a", key_n(key, sizeof key, 0)), 0);
    CHECK(!present(s, "a", key_n(key, sizeof key, 0)), "key 0 after its delete");
    CHECK_EQ(delete1(s, "a", key_n(key, sizeof key, 0)), GDRKV_E_NOT_FOUND);
    uint64_t cleared = clear(s, "a");
    CHECK(cleared >= 31, "the clear of a removed %llu keys", (unsigned long long)cleared);
    for (int i = 0; i < 32; i++)
        CHECK(!present(s, "a", key_n(key, sizeof key, i)), "key %d after the clear", i);
    CHECK(read_through(s, "b", 40), "b's keys stay");
    store_close(s);
    s = open_with_disk(4 * MiB, 2, 0);
    for (int i = 0; i < 32; i++)
        CHECK(!present(s, "a", key_n(key, sizeof key, i)), "key %d came back", i);
    CHECK(read_through(s, "b", 40), "b's keys after the restart");
    store_close(s);

    /* refusals come from the disk tier, in the store's error */
    const char *bad[] = {"/nonexistent-gdrkv-dir"};
    struct store_opts opts = {.memory_bytes = 4 * MiB, .high_watermark = 0.75,
                              .low_watermark = 0.5, .disk_paths = bad, .disk_npaths = 1,
                              .disk_bytes_per_path = 64 * MiB};
    char err[512] = "";
    CHECK(store_open(&s, &opts, err, sizeof err) != 0 && strstr(err, "nonexistent-gdrkv-dir"),
          "%s", err);
    remove_disk_dir();
}

int main(void)
{
    RUN(test_open_options);
    RUN(test_hugepages);
    RUN(test_pretouch);
    RUN(test_roundtrip_sizes);
    RUN(test_put_if_absent);
    RUN(test_reserved_is_invisible);
    RUN(test_lru_order);
    RUN(test_touch_log_overflow);
    RUN(test_pins_block_eviction);
    RUN(test_failed_reservation_rolls_back);
    RUN(test_reservations_not_evictable);
    RUN(test_delete_defers_free_while_pinned);
    RUN(test_namespaces);
    RUN(test_watermarks);
    RUN(test_limits);
    RUN(test_big_object_evicts_small_ones);
    RUN(test_eviction_work_per_batch_is_bounded);
    RUN(test_random_churn_matches_model);
    RUN(test_random_churn_over_a_pool_file);
    RUN(test_pool_file_restart);
    RUN(test_pool_file_keeps_commit_order);
    RUN(test_pool_file_restart_in_parallel);
    RUN(test_pool_file_drops_a_torn_head);
    RUN(test_pool_file_refusals);
    RUN(test_threads);
    RUN(test_disk_tier_serves_8x_the_pool);
    RUN(test_disk_tier_deletes_and_clears);
    RUN(test_promoted_keys_stay_until_read);
    RUN(test_writers_wait_for_the_disk_instead_of_dropping);
    return check_done("test_store");
}
