/*
 * test_disk.c - the disk tier (store/disk.c) on real files in a temporary
 * directory (TMPDIR, else /tmp): byte-exact round trips of every size up
 * to a region, restarts that find every record again, deletes and clears
 * that stay done across restarts, region eviction in LRU order, records
 * whose bytes rot on disk read as misses, refusals of bad paths and sizes.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "common/common.h"
#include "gdrkv.h"
#include "store/disk.h"
#include "store/disk_format.h"
#include "store/uring.h"

#define REGION DISK_REGION_BYTES

static char dir[256];

static void make_dir(void)
{
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, sizeof dir, "%s/gdrkv-test-disk-XXXXXX", tmp);
    CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
}

static void remove_dir(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/gdrkv.disk", dir);
    unlink(path);
    rmdir(dir);
}

static struct disk_tier *open_tier(uint64_t regions, int reset)
{
    const char *paths[] = {dir};
    struct disk_opts o = {.paths = paths, .npaths = 1,
                          .bytes_per_path = DISK_SUPER_BYTES + regions * REGION, .reset = reset};
    struct disk_tier *d = NULL;
    char err[512] = "";
    CHECK(disk_open(&d, &o, err, sizeof err) == 0, "disk_open: %s", err);
    return d;
}

/* The value of key number k: its bytes follow from k alone. */
static void fill_value(uint8_t *p, uint64_t size, uint32_t k)
{
    uint64_t x = 0x9e3779b97f4a7c15ull * (k + 1);
    for (uint64_t i = 0; i < size; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

static void key_of(char *key, uint32_t k) { snprintf(key, 32, "key-%08u", k); }

static const uint8_t NS[] = "tenant";
#define NS_LEN (sizeof NS - 1)

/* Writes keys [first, first + n) of size bytes each, in one batch. */
static void put_keys(struct disk_tier *d, uint32_t first, uint32_t n, uint64_t size)
{
    struct disk_item *items = calloc(n, sizeof *items);
    struct iovec *iov = calloc(2 * n, sizeof *iov);
    uint8_t **bufs = calloc(n, sizeof *bufs);
    char (*keys)[32] = calloc(n, 32);
    int32_t *status = calloc(n, sizeof *status);
    for (uint32_t i = 0; i < n; i++) {
        bufs[i] = malloc(size ? size : 1);
        fill_value(bufs[i], size, first + i);
        key_of(keys[i], first + i);
        /* two pieces, as an object of two chunks */
        iov[2 * i] = (struct iovec){bufs[i], size / 3};
        iov[2 * i + 1] = (struct iovec){bufs[i] + size / 3, size - size / 3};
        items[i] = (struct disk_item){.ns = NS, .ns_len = NS_LEN, .key = (uint8_t *)keys[i],
                                      .key_len = (uint32_t)strlen(keys[i]), .iov = &iov[2 * i],
                                      .iovcnt = 2, .size = size};
    }
    disk_put_batch(d, items, n, status);
    for (uint32_t i = 0; i < n; i++) {
        CHECK_EQ(status[i], 0);
        free(bufs[i]);
    }
    free(items), free(iov), free(bufs), free(keys), free(status);
}

/* Whether key k reads back byte-exact (1), is absent (0); anything else fails. */
static int read_key(struct disk_tier *d, uint32_t k, uint64_t size)
{
    char key[32];
    key_of(key, k);
    struct disk_loc loc;
    uint64_t seen;
    int contains = disk_contains(d, NS, NS_LEN, (uint8_t *)key, (uint32_t)strlen(key), &seen);
    if (disk_lookup(d, NS, NS_LEN, (uint8_t *)key, (uint32_t)strlen(key), &loc) != 0) {
        CHECK(!contains, "contains %s but lookup misses", key);
        return 0;
    }
    CHECK(contains && seen == size, "%s: contains %d, size %llu", key, contains,
          (unsigned long long)seen);
    CHECK_EQ(loc.size, size);
    uint8_t *got = malloc(size + 1), *want = malloc(size + 1);
    struct iovec dst[3] = {{got, size / 2}, {got + size / 2, size - size / 2}, {got + size, 1}};
    int rc = disk_read(d, &loc, NS, NS_LEN, (uint8_t *)key, (uint32_t)strlen(key), dst, 3);
    disk_release(d, &loc);
    fill_value(want, size, k);
    int same = rc == 0 && memcmp(got, want, size) == 0;
    free(got), free(want);
    CHECK(rc != 0 || same, "%s read back different bytes", key);
    return rc == 0 ? 1 : -1;
}

static void test_round_trips_and_restarts(void)
{
    static const uint64_t sizes[] = {0, 1, 63, 64, 4096, 4097, 100000, 1 << 20};
    make_dir();
    struct disk_tier *d = open_tier(4, 0);
    uint32_t k = 0;
    for (size_t s = 0; s < GK_ARRAY_LEN(sizes); s++, k += 10)
        put_keys(d, k, 10, sizes[s]);
    /* the largest value a region takes */
    put_keys(d, 1000, 1, disk_max_value(d));
    for (int round = 0; round < 2; round++) {
        for (size_t s = 0, kk = 0; s < GK_ARRAY_LEN(sizes); s++, kk += 10) {
            for (uint32_t i = 0; i < 10; i++)
                CHECK_EQ(read_key(d, (uint32_t)kk + i, sizes[s]), 1);
        }
        CHECK_EQ(read_key(d, 1000, disk_max_value(d)), 1);
        CHECK_EQ(read_key(d, 99999, 10), 0);
        struct store_disk_stats st;
        disk_get_stats(d, &st);
        CHECK_EQ(st.disk_objects, 10 * GK_ARRAY_LEN(sizes) + 1);
        CHECK_EQ(st.disk_errors, 0);
        if (round == 1)
            CHECK_EQ(st.disk_restored_objects, 10 * GK_ARRAY_LEN(sizes) + 1);
        disk_close(d);
        d = open_tier(4, 0);            /* a restart finds every record */
    }
    /* a reset starts empty */
    disk_close(d);
    d = open_tier(4, 1);
    CHECK_EQ(read_key(d, 0, 0), 0);
    disk_close(d);
    remove_dir();
}

static void test_too_large_and_refusals(void)
{
    make_dir();
    struct disk_tier *d = open_tier(2, 0);
    uint8_t byte = 0;
    struct iovec iov = {&byte, 1};
    struct disk_item it = {.ns = NS, .ns_len = NS_LEN, .key = (const uint8_t *)"big",
                           .key_len = 3, .iov = &iov, .iovcnt = 1,
                           .size = disk_max_value(d) + 1};
    int32_t status;
    disk_put_batch(d, &it, 1, &status);
    CHECK_EQ(status, GDRKV_E_TOO_LARGE);
    disk_close(d);

    char err[512];
    const char *paths[] = {dir};
    struct disk_opts o = {.paths = paths, .npaths = 1,
                          .bytes_per_path = DISK_SUPER_BYTES + 3 * REGION};
    CHECK(disk_open(&d, &o, err, sizeof err) != 0 && strstr(err, "another --disk-size"),
          "a file of another size: %s", err);
    o.bytes_per_path = REGION;
    CHECK(disk_open(&d, &o, err, sizeof err) != 0 && strstr(err, "too small"), "%s", err);
    const char *missing[] = {"/nonexistent/gdrkv-disk"};
    o.paths = missing;
    o.bytes_per_path = DISK_SUPER_BYTES + 2 * REGION;
    CHECK(disk_open(&d, &o, err, sizeof err) != 0 && strstr(err, "nonexistent"), "%s", err);
    /* a second server on the same file */
    d = open_tier(2, 0);
    struct disk_tier *d2 = NULL;
    o.paths = paths;
    CHECK(disk_open(&d2, &o, err, sizeof err) != 0 && strstr(err, "another gdrkv server"),
          "%s", err);
    disk_close(d);
    remove_dir();
}

static void test_deletes_and_clears_stay_done(void)
{
    make_dir();
    struct disk_tier *d = open_tier(2, 0);
    put_keys(d, 0, 20, 5000);
    char key[32];
    key_of(key, 3);
    CHECK_EQ(disk_delete(d, NS, NS_LEN, (uint8_t *)key, (uint32_t)strlen(key)), 0);
    CHECK_EQ(disk_delete(d, NS, NS_LEN, (uint8_t *)key, (uint32_t)strlen(key)),
             GDRKV_E_NOT_FOUND);
    CHECK_EQ(read_key(d, 3, 5000), 0);
    /* another namespace's keys stay when this one is cleared */
    uint8_t v = 7;
    struct iovec iov = {&v, 1};
    struct disk_item other = {.ns = (const uint8_t *)"other", .ns_len = 5,
                              .key = (const uint8_t *)"key-00000004", .key_len = 12,
                              .iov = &iov, .iovcnt = 1, .size = 1};
    int32_t status;
    disk_put_batch(d, &other, 1, &status);
    CHECK_EQ(status, 0);
    disk_close(d);

    d = open_tier(2, 0);
    CHECK_EQ(read_key(d, 3, 5000), 0);      /* the delete outlived the restart */
    CHECK_EQ(read_key(d, 4, 5000), 1);
    CHECK_EQ(disk_clear_ns(d, NS, NS_LEN), 19);
    CHECK_EQ(read_key(d, 4, 5000), 0);
    uint64_t size;
    CHECK(disk_contains(d, (const uint8_t *)"other", 5, (const uint8_t *)"key-00000004", 12,
                        &size) && size == 1, "the other namespace's key went too");
    disk_close(d);
    d = open_tier(2, 0);
    for (uint32_t k = 0; k < 20; k++)
        CHECK_EQ(read_key(d, k, 5000), 0);
    CHECK(disk_contains(d, (const uint8_t *)"other", 5, (const uint8_t *)"key-00000004", 12,
                        &size), "the other namespace's key after the restart");
    disk_close(d);
    remove_dir();
}

static void test_regions_evicted_least_recently_read_first(void)
{
    make_dir();
    struct disk_tier *d = open_tier(3, 0);
    const uint64_t size = 1 << 20;
    const uint32_t per_region = (uint32_t)(REGION / (size + 4096)); /* 15 */
    /* regions 0, 1 and 2 fill with keys 0.., 100.., 200.. */
    for (uint32_t r = 0; r < 3; r++)
        put_keys(d, 100 * r, per_region, size);
    /* region 0 read now: region 1 is the least recently used */
    CHECK_EQ(read_key(d, 0, size), 1);
    put_keys(d, 300, per_region, size);
    CHECK_EQ(read_key(d, 100, size), 0);
    CHECK_EQ(read_key(d, 5, size), 1);
    CHECK_EQ(read_key(d, 205, size), 1);
    CHECK_EQ(read_key(d, 305, size), 1);
    struct store_disk_stats st;
    disk_get_stats(d, &st);
    CHECK_EQ(st.disk_evicted_regions, 1);
    CHECK_EQ(st.disk_evicted_objects, per_region);
    CHECK_EQ(st.disk_objects, 3 * per_region);
    /* a held region is never evicted: hold region 2's key while two more
     * regions' worth is written */
    char key[32];
    key_of(key, 200);
    struct disk_loc held;
    CHECK_EQ(disk_lookup(d, NS, NS_LEN, (uint8_t *)key, (uint32_t)strlen(key), &held), 0);
    put_keys(d, 400, per_region, size);
    put_keys(d, 500, per_region, size);
    uint8_t *got = malloc(size);
    struct iovec dst = {got, size};
    CHECK_EQ(disk_read(d, &held, NS, NS_LEN, (uint8_t *)key, (uint32_t)strlen(key), &dst, 1), 0);
    disk_release(d, &held);
    free(got);
    CHECK_EQ(read_key(d, 201, size), 1);
    disk_close(d);
    /* after the restart, what was overwritten is gone and the rest reads
     * back byte-exact (read_key checks the bytes of whatever it finds) */
    d = open_tier(3, 0);
    for (uint32_t k = 0; k < 600; k++)
        CHECK(read_key(d, k, size) >= 0, "key %u", k);
    CHECK_EQ(read_key(d, 505, size), 1);
    disk_close(d);
    remove_dir();
}

static void test_rotten_bytes_are_misses(void)
{
    make_dir();
    struct disk_tier *d = open_tier(2, 0);
    put_keys(d, 0, 4, 10000);
    disk_close(d);
    char path[300];
    snprintf(path, sizeof path, "%s/gdrkv.disk", dir);
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0, "open %s", path);
    /* key 0's value (its header is 128 bytes), and key 1's header */
    uint64_t rec = disk_record_len(disk_record_hdr_len(NS_LEN, 12), 10000);
    uint8_t junk = 0x5a;
    CHECK_EQ(pwrite(fd, &junk, 1, DISK_SUPER_BYTES + 128 + 5000), 1);
    CHECK_EQ(pwrite(fd, &junk, 1, DISK_SUPER_BYTES + rec + 40 + 8), 1);
    close(fd);
    d = open_tier(2, 0);
    CHECK_EQ(read_key(d, 0, 10000), -1);    /* found, but its bytes fail the checksum */
    CHECK_EQ(read_key(d, 0, 10000), 0);     /* and forgotten */
    /* key 1's header failed: the scan stopped there, key 2 and 3 are lost
     * with it (a torn batch ends the region) */
    CHECK_EQ(read_key(d, 1, 10000), 0);
    struct store_disk_stats st;
    disk_get_stats(d, &st);
    CHECK_EQ(st.disk_bad_records, 1);
    disk_close(d);
    remove_dir();
}

/* Bytes flipped and blocks zeroed anywhere in the file, a restart after
 * each round: whatever a record lost, what is read back is its own bytes
 * or a miss, never another record's or garbage (read_key checks). */
static void test_random_corruption_never_serves_wrong_bytes(void)
{
    static const uint64_t sizes[] = {1, 700, 4096, 65536, 300000};
    uint64_t rng = 0x5eed;
    make_dir();
    char path[300];
    snprintf(path, sizeof path, "%s/gdrkv.disk", dir);
    for (int round = 0; round < 12; round++) {
        struct disk_tier *d = open_tier(2, 1);
        for (size_t s = 0; s < GK_ARRAY_LEN(sizes); s++)
            put_keys(d, 100 * (uint32_t)s, 8, sizes[s]);
        disk_close(d);
        int fd = open(path, O_RDWR);
        CHECK(fd >= 0, "open %s", path);
        uint64_t used = DISK_SUPER_BYTES + 3 * (1 << 20);
        for (int k = 0; k < 40; k++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            uint64_t at = DISK_SUPER_BYTES + rng % (used - DISK_SUPER_BYTES);
            if (k % 10 == 9) {
                static uint8_t zeros[DISK_BLOCK];
                CHECK_EQ(pwrite(fd, zeros, DISK_BLOCK, (off_t)(at / DISK_BLOCK * DISK_BLOCK)),
                         DISK_BLOCK);
            } else {
                uint8_t b = (uint8_t)(rng >> 32) | 1;
                uint8_t old;
                CHECK_EQ(pread(fd, &old, 1, (off_t)at), 1);
                old ^= b;
                CHECK_EQ(pwrite(fd, &old, 1, (off_t)at), 1);
            }
        }
        close(fd);
        d = open_tier(2, 0);
        for (size_t s = 0; s < GK_ARRAY_LEN(sizes); s++)
            for (uint32_t i = 0; i < 8; i++)
                read_key(d, 100 * (uint32_t)s + i, sizes[s]);
        disk_close(d);
    }
    remove_dir();
}

/* One call reads many records side by side (io_uring where this process
 * may use it, preads otherwise; make check runs both): every value
 * byte-exact into its pieces, a record deleted after its lookup and one
 * whose bytes rotted are misses, and the tier says how its reads went. */
static void test_batch_reads(void)
{
    enum { N = 80 };
    const uint64_t size = 70000;
    make_dir();
    struct disk_tier *d = open_tier(4, 0);
    put_keys(d, 0, N, size);
    struct disk_loc locs[N];
    struct disk_read_req q[N];
    struct iovec dst[N][2];
    uint8_t *got[N];
    char keys[N][32];
    int32_t status[N];
    for (uint32_t k = 0; k < N; k++) {
        key_of(keys[k], k);
        CHECK_EQ(disk_lookup(d, NS, NS_LEN, (uint8_t *)keys[k], (uint32_t)strlen(keys[k]),
                             &locs[k]), 0);
        got[k] = malloc(size);
        dst[k][0] = (struct iovec){got[k], 1000};
        dst[k][1] = (struct iovec){got[k] + 1000, size - 1000};
        q[k] = (struct disk_read_req){.loc = &locs[k], .ns = NS, .ns_len = NS_LEN,
                                      .key = (uint8_t *)keys[k],
                                      .key_len = (uint32_t)strlen(keys[k]), .dst = dst[k],
                                      .dstcnt = 2};
    }
    /* key 7 deleted and marked dead while held; key 9's value rots on disk */
    CHECK_EQ(disk_delete(d, NS, NS_LEN, (uint8_t *)keys[7], (uint32_t)strlen(keys[7])), 0);
    disk_bury(d);
    char path[300];
    snprintf(path, sizeof path, "%s/gdrkv.disk", dir);
    int fd = open(path, O_WRONLY);
    uint8_t junk = 0x5a;
    CHECK(fd >= 0 && pwrite(fd, &junk, 1, (off_t)(locs[9].off + locs[9].len - 100)) == 1,
          "rot key 9");
    close(fd);
    struct store_disk_stats before, after;
    disk_get_stats(d, &before);
    disk_read_batch(d, q, N, status);
    disk_get_stats(d, &after);
    uint8_t *want = malloc(size);
    for (uint32_t k = 0; k < N; k++) {
        disk_release(d, &locs[k]);
        if (k == 7 || k == 9) {
            CHECK_EQ(status[k], GDRKV_E_NOT_FOUND);
            continue;
        }
        CHECK_EQ(status[k], 0);
        fill_value(want, size, k);
        CHECK(memcmp(got[k], want, size) == 0, "key %u read back different bytes", k);
    }
    CHECK_EQ(after.disk_reads - before.disk_reads, N - 2);
    CHECK_EQ(after.disk_bad_records - before.disk_bad_records, 1);
    CHECK_EQ(after.disk_uring_reads - before.disk_uring_reads,
             uring_available() ? N - 2 : 0);
    printf("   %s\n", uring_available() ? "through io_uring" : "through preads");
    for (uint32_t k = 0; k < N; k++)
        free(got[k]);
    free(want);
    disk_close(d);
    remove_dir();
}

int main(void)
{
    RUN(test_round_trips_and_restarts);
    RUN(test_too_large_and_refusals);
    RUN(test_deletes_and_clears_stay_done);
    RUN(test_regions_evicted_least_recently_read_first);
    RUN(test_rotten_bytes_are_misses);
    RUN(test_random_corruption_never_serves_wrong_bytes);
    RUN(test_batch_reads);
    return check_done("test_disk");
}
