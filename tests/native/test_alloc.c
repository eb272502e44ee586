/*
 * test_alloc.c - the slab allocator: class table, object cutting, chunk
 * accounting, page recycling across classes, and a randomized churn that
 * checks no two live chunks ever overlap.
 */
#include <string.h>

#include "store/alloc.h"
#include "check.h"
#include "common/common.h"

#define PAGE ALLOC_PAGE_SIZE

static void test_class_table(void)
{
    struct alloc a;
    CHECK(alloc_init(&a, 4ull * PAGE) == 0, "init");
    CHECK_EQ(a.classes[0].size, ALLOC_MIN_CHUNK);
    CHECK_EQ(a.classes[a.nclasses - 1].size, PAGE);
    for (uint32_t c = 0; c < a.nclasses; c++) {
        const struct alloc_class *k = &a.classes[c];
        CHECK(k->size % ALLOC_MIN_CHUNK == 0, "class %u size %u not a 64-byte multiple", c, k->size);
        CHECK(k->per_page * k->size <= PAGE, "class %u overfills its page", c);
        /* Stretched: one more 64 bytes per chunk would no longer fit. */
        CHECK(k->per_page * (k->size + ALLOC_MIN_CHUNK) > PAGE, "class %u not stretched", c);
        CHECK_EQ(alloc_chunk_size(&a, k->size), k->size);
        if (c + 1 == a.nclasses)
            continue;
        const struct alloc_class *next = &a.classes[c + 1];
        CHECK(next->size >= k->size + k->size / 4, "class %u grows by less than 1.25", c);
        CHECK(c + 2 == a.nclasses || next->size <= PAGE / 2, "geometric classes stop at half a page");
        CHECK_EQ(alloc_chunk_size(&a, k->size + 1), next->size);
    }
    CHECK_EQ(alloc_chunk_size(&a, 1), 64);
    CHECK_EQ(alloc_chunk_size(&a, 65), 128);
    CHECK_EQ(alloc_chunk_size(&a, PAGE / 2), PAGE / 2);
    CHECK_EQ(alloc_chunk_size(&a, PAGE / 2 + 1), PAGE);
    alloc_destroy(&a);
}

static void test_object_pieces(void)
{
    struct alloc a;
    CHECK(alloc_init(&a, 4ull * PAGE) == 0, "init");
    CHECK_EQ(alloc_nchunks(0, 0, 0), 0);
    CHECK_EQ(alloc_nchunks(1, 0, 0), 1);
    CHECK_EQ(alloc_nchunks(PAGE, 0, 0), 1);
    CHECK_EQ(alloc_nchunks(PAGE + 1, 0, 0), 2);
    CHECK_EQ(alloc_nchunks(3ull * PAGE + 5, 0, 0), 4);

    uint64_t size = 2ull * PAGE + PAGE / 2;
    CHECK_EQ(alloc_nchunks(size, 0, 0), 3);
    CHECK_EQ(alloc_piece_len(size, 0, 0, 0), PAGE);
    CHECK_EQ(alloc_piece_len(size, 0, 0, 1), PAGE);
    CHECK_EQ(alloc_piece_len(size, 0, 0, 2), PAGE / 2);

    CHECK_EQ(alloc_footprint(&a, 0, 0, 0), 0);
    CHECK_EQ(alloc_footprint(&a, 1, 0, 0), 64);
    CHECK_EQ(alloc_footprint(&a, PAGE, 0, 0), PAGE);
    CHECK_EQ(alloc_footprint(&a, 3ull * PAGE + 5, 0, 0), 3ull * PAGE + 64);
    CHECK_EQ(alloc_footprint(&a, PAGE + PAGE / 2 + 1, 0, 0), 2ull * PAGE);

    /* With a pool file's headers: 256 bytes before chunk 0, 64 before the others. */
    CHECK_EQ(alloc_nchunks(0, 256, 64), 1);
    CHECK_EQ(alloc_nchunks(PAGE - 256, 256, 64), 1);
    CHECK_EQ(alloc_nchunks(PAGE - 255, 256, 64), 2);
    size = 2ull * PAGE;
    CHECK_EQ(alloc_nchunks(size, 256, 64), 3);
    CHECK_EQ(alloc_piece_len(size, 256, 64, 0), PAGE - 256);
    CHECK_EQ(alloc_piece_len(size, 256, 64, 1), PAGE - 64);
    CHECK_EQ(alloc_piece_len(size, 256, 64, 2), 256 + 64);
    CHECK_EQ(alloc_footprint(&a, size, 256, 64), 2ull * PAGE + alloc_chunk_size(&a, 384));
    CHECK_EQ(alloc_footprint(&a, 0, 256, 64), 256);
    CHECK_EQ(alloc_footprint(&a, 4096, 256, 64), alloc_chunk_size(&a, 4096 + 256));
    alloc_destroy(&a);
}

static void test_get_put_accounting(void)
{
    struct alloc a;
    CHECK(alloc_init(&a, 4ull * PAGE + 12345) == 0, "init");
    CHECK_EQ(a.npages, 4);
    CHECK_EQ(alloc_capacity(&a), 4ull * PAGE);

    uint64_t x, y, z;
    CHECK(alloc_get(&a, 100, &x) == 0, "get 100");
    CHECK(alloc_get(&a, 100, &y) == 0, "get 100 again");
    CHECK(x % 128 == 0 && y % 128 == 0 && x != y, "chunks %llu %llu", (unsigned long long)x,
          (unsigned long long)y);
    CHECK_EQ(a.used_bytes, 256);
    CHECK_EQ(a.free_pages, 3);
    CHECK(alloc_get(&a, PAGE, &z) == 0, "whole page");
    CHECK(z % PAGE == 0, "whole pages are page aligned");
    CHECK_EQ(a.used_bytes, 256 + PAGE);
    CHECK_EQ(a.free_pages, 2);

    alloc_put(&a, y);
    alloc_put(&a, z);
    alloc_put(&a, x);
    CHECK_EQ(a.used_bytes, 0);
    CHECK_EQ(a.free_pages, 4);
    alloc_destroy(&a);
}

/* Fills the allocator with len-byte chunks; returns how many it took. */
static uint32_t fill(struct alloc *a, uint64_t len, uint64_t *offs, uint32_t cap)
{
    uint32_t n = 0;
    while (n < cap && alloc_get(a, len, &offs[n]) == 0)
        n++;
    CHECK(n < cap, "the allocator never ran out");
    return n;
}

static void put_all(struct alloc *a, const uint64_t *offs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        alloc_put(a, offs[i]);
}

/* All pages of a class come back to the free list and can serve another
 * class: the mix of sizes may change without the pool calcifying. */
static void test_pages_move_between_classes(void)
{
    enum { NPAGES = 8, CAP = NPAGES * 16384 + 1 };
    static uint64_t offs[CAP];
    struct alloc a;
    CHECK(alloc_init(&a, (uint64_t)NPAGES * PAGE) == 0, "init");

    uint32_t per_page_small = PAGE / alloc_chunk_size(&a, 100);
    uint32_t n = fill(&a, 100, offs, CAP);
    CHECK_EQ(n, NPAGES * per_page_small);
    CHECK_EQ(a.free_pages, 0);
    uint64_t other;
    CHECK(alloc_get(&a, 5000, &other) != 0, "another class can't get a page from a full pool");
    put_all(&a, offs, n);
    CHECK_EQ(a.free_pages, NPAGES);
    CHECK_EQ(a.used_bytes, 0);

    uint32_t per_page_big = PAGE / alloc_chunk_size(&a, 300000);
    n = fill(&a, 300000, offs, CAP);
    CHECK_EQ(n, NPAGES * per_page_big);
    put_all(&a, offs, n);

    n = fill(&a, PAGE, offs, CAP);
    CHECK_EQ(n, NPAGES);
    put_all(&a, offs, n);

    n = fill(&a, 64, offs, CAP);
    CHECK_EQ(n, NPAGES * (PAGE / 64));
    put_all(&a, offs, n);
    CHECK_EQ(a.free_pages, NPAGES);
    alloc_destroy(&a);
}

/* A freed chunk of a partly used page is reused before a new page is taken. */
static void test_partial_page_reused(void)
{
    struct alloc a;
    CHECK(alloc_init(&a, 4ull * PAGE) == 0, "init");
    uint64_t first, off;
    CHECK(alloc_get(&a, 4096, &first) == 0, "get");
    for (int i = 0; i < 10; i++)
        CHECK(alloc_get(&a, 4096, &off) == 0, "get");
    CHECK_EQ(a.free_pages, 3);
    alloc_put(&a, first);
    CHECK(alloc_get(&a, 4000, &off) == 0, "get");
    CHECK_EQ(off, first);
    CHECK_EQ(a.free_pages, 3);
    alloc_destroy(&a);
}

static void test_smaller_than_a_page(void)
{
    struct alloc a;
    CHECK(alloc_init(&a, PAGE - 1) == 0, "init");
    CHECK_EQ(alloc_capacity(&a), 0);
    uint64_t off;
    CHECK(alloc_get(&a, 64, &off) != 0, "nothing to hand out");
    alloc_destroy(&a);
}

/* Randomized churn over many sizes with a fixed seed: every live chunk is
 * marked in a map of 64-byte units, so an overlap or an out-of-pool offset
 * is caught at the allocation that causes it; used_bytes must match the
 * shadow sum throughout, and everything must come back at the end. */
static void test_random_churn(void)
{
    enum { NPAGES = 16, UNITS = NPAGES * (PAGE / 64), MAX_LIVE = 4096, OPS = 40000 };
    static const uint64_t sizes[] = {64, 100, 1000, 4096, 70000, 300000, PAGE};
    static uint8_t owner[UNITS];
    static uint64_t live_off[MAX_LIVE], live_len[MAX_LIVE];
    uint32_t nlive = 0;
    uint64_t used = 0, seed = 42;
    struct alloc a;
    CHECK(alloc_init(&a, (uint64_t)NPAGES * PAGE) == 0, "init");
    memset(owner, 0, sizeof owner);

    for (int op = 0; op < OPS; op++) {
        uint64_t r = check_rand(&seed);
        int want_free = nlive == MAX_LIVE || (nlive > 0 && r % 100 < 45);
        if (!want_free) {
            uint64_t len = r % 4 ? sizes[(r >> 8) % GK_ARRAY_LEN(sizes)] : 1 + (r >> 8) % PAGE;
            uint64_t off;
            if (alloc_get(&a, len, &off) != 0) {
                want_free = nlive > 0;
            } else {
                uint64_t chunk = alloc_chunk_size(&a, len);
                CHECK(off % 64 == 0 && off + chunk <= (uint64_t)NPAGES * PAGE, "bad offset %llu",
                      (unsigned long long)off);
                CHECK(off / PAGE == (off + chunk - 1) / PAGE, "chunk crosses a page");
                for (uint64_t u = off / 64; u < (off + chunk) / 64; u++) {
                    CHECK(!owner[u], "chunk at %llu overlaps a live one", (unsigned long long)off);
                    owner[u] = 1;
                }
                live_off[nlive] = off;
                live_len[nlive++] = len;
                used += chunk;
            }
        }
        if (want_free) {
            uint32_t i = (uint32_t)((r >> 16) % nlive);
            uint64_t chunk = alloc_chunk_size(&a, live_len[i]);
            memset(&owner[live_off[i] / 64], 0, chunk / 64);
            alloc_put(&a, live_off[i]);
            used -= chunk;
            live_off[i] = live_off[--nlive];
            live_len[i] = live_len[nlive];
        }
        CHECK_EQ(a.used_bytes, used);
    }
    put_all(&a, live_off, nlive);
    CHECK_EQ(a.used_bytes, 0);
    CHECK_EQ(a.free_pages, NPAGES);
    alloc_destroy(&a);
}

int main(void)
{
    RUN(test_class_table);
    RUN(test_object_pieces);
    RUN(test_get_put_accounting);
    RUN(test_pages_move_between_classes);
    RUN(test_partial_page_reused);
    RUN(test_smaller_than_a_page);
    RUN(test_random_churn);
    return check_done("test_alloc");
}
