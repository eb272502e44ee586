/*
 * alloc.c - see alloc.h.
 *
 * Each page keeps a bitmap of its free chunks (a set bit is free) rather than
 * a free list: the bitmaps are allocated once at init (0.2% of the pool, of
 * which a page only ever touches the words its class needs), so nothing on
 * the allocation path can fail for lack of heap, and asserting builds catch
 * a double free. A page hands out its lowest free chunk; the per-page hint
 * makes the search start past the words known to be full.
 */
#include "alloc.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

static uint32_t round_up(uint32_t v, uint32_t to) { return (v + to - 1) / to * to; }

static void add_class(struct alloc *a, uint32_t size)
{
    assert(a->nclasses < ALLOC_MAX_CLASSES);
    struct alloc_class *c = &a->classes[a->nclasses++];
    c->size = size;
    c->per_page = ALLOC_PAGE_SIZE / size;
    c->partial = ALLOC_NIL;
}

/*
 * Sizes grow by a factor of 1.25 from ALLOC_MIN_CHUNK, each one stretched to
 * the largest 64-byte multiple that still fits as many chunks in a page, so
 * no page is left with a tail its chunks could have used. Geometric classes
 * stop at half a page: anything larger takes a whole page, whose rounding
 * used_bytes accounts for (a 600 KiB chunk alone in a page would hide its
 * 424 KiB tail from the watermarks).
 */
static void build_classes(struct alloc *a)
{
    uint32_t size = ALLOC_MIN_CHUNK;
    while (size <= ALLOC_PAGE_SIZE / 2) {
        uint32_t per_page = ALLOC_PAGE_SIZE / size;
        uint32_t stretched = ALLOC_PAGE_SIZE / per_page / ALLOC_MIN_CHUNK * ALLOC_MIN_CHUNK;
        add_class(a, stretched);
        size = round_up(stretched + stretched / 4, ALLOC_MIN_CHUNK);
    }
    add_class(a, ALLOC_PAGE_SIZE);
}

int alloc_init(struct alloc *a, uint64_t capacity)
{
    memset(a, 0, sizeof *a);
    uint64_t npages = capacity / ALLOC_PAGE_SIZE;
    if (npages >= ALLOC_NIL)
        return -1;
    a->npages = (uint32_t)npages;
    /* At least one element each: calloc(0) may return NULL. */
    a->pages = calloc(npages ? npages : 1, sizeof *a->pages);
    a->free_bits = calloc(npages ? npages * ALLOC_PAGE_WORDS : 1, sizeof *a->free_bits);
    if (!a->pages || !a->free_bits) {
        alloc_destroy(a);
        return -1;
    }
    build_classes(a);

    /* Stacked so that page 0 is handed out first. */
    a->free_head = ALLOC_NIL;
    for (uint32_t p = a->npages; p-- > 0;) {
        a->pages[p].cls = ALLOC_NIL;
        a->pages[p].wiped_for = ALLOC_NIL;
        a->pages[p].next = a->free_head;
        a->free_head = p;
    }
    a->free_pages = a->npages;
    return 0;
}

void alloc_destroy(struct alloc *a)
{
    free(a->pages);
    free(a->free_bits);
    a->pages = NULL;
    a->free_bits = NULL;
}

uint64_t alloc_capacity(const struct alloc *a)
{
    return (uint64_t)a->npages * ALLOC_PAGE_SIZE;
}

uint32_t alloc_nchunks(uint64_t size, uint32_t first_hdr, uint32_t hdr)
{
    uint64_t first = ALLOC_PAGE_SIZE - first_hdr, rest = ALLOC_PAGE_SIZE - hdr;
    if (size == 0)
        return first_hdr ? 1 : 0;   /* an empty object still needs its header */
    if (size <= first)
        return 1;
    return (uint32_t)(1 + (size - first + rest - 1) / rest);
}

uint64_t alloc_piece_len(uint64_t size, uint32_t first_hdr, uint32_t hdr, uint32_t i)
{
    uint64_t first = ALLOC_PAGE_SIZE - first_hdr, rest = ALLOC_PAGE_SIZE - hdr;
    if (i == 0)
        return GK_MIN(size, first);
    uint64_t start = first + (uint64_t)(i - 1) * rest;
    return GK_MIN(size - start, rest);
}

/* Index of the smallest class whose chunks hold len bytes. */
static uint32_t class_of(const struct alloc *a, uint64_t len)
{
    uint32_t lo = 0, hi = a->nclasses - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (a->classes[mid].size >= len)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

uint32_t alloc_chunk_size(const struct alloc *a, uint64_t len)
{
    assert(len >= 1 && len <= ALLOC_PAGE_SIZE);
    return a->classes[class_of(a, len)].size;
}

uint64_t alloc_footprint(const struct alloc *a, uint64_t size, uint32_t first_hdr, uint32_t hdr)
{
    uint32_t n = alloc_nchunks(size, first_hdr, hdr);
    if (n == 0)
        return 0;
    /* Every chunk but the last fills a page, headers included. */
    uint64_t last = alloc_piece_len(size, first_hdr, hdr, n - 1) + (n == 1 ? first_hdr : hdr);
    return (uint64_t)(n - 1) * ALLOC_PAGE_SIZE + alloc_chunk_size(a, last);
}

static uint64_t *page_bits(struct alloc *a, uint32_t p)
{
    return a->free_bits + (uint64_t)p * ALLOC_PAGE_WORDS;
}

static size_t bitmap_bytes(uint32_t per_page)
{
    return (per_page + 63) / 64 * sizeof(uint64_t);
}

static void partial_push(struct alloc *a, uint32_t cls, uint32_t p)
{
    struct alloc_class *c = &a->classes[cls];
    a->pages[p].prev = ALLOC_NIL;
    a->pages[p].next = c->partial;
    if (c->partial != ALLOC_NIL)
        a->pages[c->partial].prev = p;
    c->partial = p;
}

static void partial_remove(struct alloc *a, uint32_t cls, uint32_t p)
{
    struct alloc_page *pg = &a->pages[p];
    if (pg->prev != ALLOC_NIL)
        a->pages[pg->prev].next = pg->next;
    else
        a->classes[cls].partial = pg->next;
    if (pg->next != ALLOC_NIL)
        a->pages[pg->next].prev = pg->prev;
}

/* Takes a free page for class cls and marks all its chunks free. */
static int assign_page(struct alloc *a, uint32_t cls)
{
    uint32_t p = a->free_head;
    if (p == ALLOC_NIL)
        return -1;
    a->free_head = a->pages[p].next;
    a->free_pages--;

    /* A free page's bitmap is all zero (release_page), so only the bits of
     * this class's chunks need setting. */
    uint32_t per_page = a->classes[cls].per_page;
    uint64_t *bits = page_bits(a, p);
    memset(bits, 0xff, per_page / 64 * sizeof *bits);
    if (per_page % 64)
        bits[per_page / 64] = (1ull << (per_page % 64)) - 1;

    a->pages[p].cls = cls;
    a->pages[p].used = 0;
    a->pages[p].hint = 0;
    partial_push(a, cls, p);
    if (a->page_tags) {
        /* Wiped before the page table says where its chunks start. */
        uint8_t *page = a->pool + (uint64_t)p * ALLOC_PAGE_SIZE;
        for (uint32_t i = 0; a->pages[p].wiped_for != cls && i < per_page; i++)
            memset(page + (uint64_t)i * a->classes[cls].size, 0, 8);
        a->pages[p].wiped_for = cls;
        __atomic_store_n(&a->page_tags[p], cls + 1, __ATOMIC_RELEASE);
    }
    return 0;
}

static void release_page(struct alloc *a, uint32_t p)
{
    uint32_t cls = a->pages[p].cls;
    memset(page_bits(a, p), 0, bitmap_bytes(a->classes[cls].per_page));
    partial_remove(a, cls, p);
    a->pages[p].cls = ALLOC_NIL;
    a->pages[p].next = a->free_head;
    a->free_head = p;
    a->free_pages++;
    if (a->page_tags)
        a->page_tags[p] = 0;
}

int alloc_get(struct alloc *a, uint64_t len, uint64_t *off)
{
    uint32_t cls = class_of(a, len);
    struct alloc_class *c = &a->classes[cls];
    if (c->partial == ALLOC_NIL && assign_page(a, cls) != 0)
        return -1;

    uint32_t p = c->partial;
    struct alloc_page *pg = &a->pages[p];
    uint64_t *bits = page_bits(a, p);
    uint32_t w = pg->hint;
    while (bits[w] == 0) {
        w++;
        assert(w < ALLOC_PAGE_WORDS && "partial page without a free chunk");
    }
    uint32_t idx = w * 64 + (uint32_t)__builtin_ctzll(bits[w]);
    bits[w] &= bits[w] - 1;
    pg->hint = w;

    if (++pg->used == c->per_page)
        partial_remove(a, cls, p);
    a->used_bytes += c->size;
    *off = (uint64_t)p * ALLOC_PAGE_SIZE + (uint64_t)idx * c->size;
    return 0;
}

void alloc_put(struct alloc *a, uint64_t off)
{
    uint32_t p = (uint32_t)(off / ALLOC_PAGE_SIZE);
    assert(p < a->npages && a->pages[p].cls != ALLOC_NIL);
    struct alloc_page *pg = &a->pages[p];
    struct alloc_class *c = &a->classes[pg->cls];
    uint32_t idx = (uint32_t)(off % ALLOC_PAGE_SIZE / c->size);
    assert(off % ALLOC_PAGE_SIZE % c->size == 0 && idx < c->per_page);

    uint64_t *bits = page_bits(a, p);
    uint64_t bit = 1ull << (idx % 64);
    assert(!(bits[idx / 64] & bit) && "chunk freed twice");
    bits[idx / 64] |= bit;
    if (idx / 64 < pg->hint)
        pg->hint = idx / 64;

    if (pg->used-- == c->per_page)
        partial_push(a, pg->cls, p);
    a->used_bytes -= c->size;
    if (pg->used == 0)
        release_page(a, p);
}

/* ---------------------------------------------------------------- restart */

void alloc_restore_begin(struct alloc *a)
{
    for (uint32_t p = 0; p < a->npages; p++) {
        uint32_t tag = a->page_tags[p];
        if (tag == 0 || tag > a->nclasses)
            continue;
        const struct alloc_class *c = &a->classes[tag - 1];
        uint64_t *bits = page_bits(a, p);
        memset(bits, 0xff, c->per_page / 64 * sizeof *bits);
        if (c->per_page % 64)
            bits[c->per_page / 64] = (1ull << (c->per_page % 64)) - 1;
        a->pages[p] = (struct alloc_page){.cls = tag - 1, .used = 0, .hint = 0,
                                          .prev = ALLOC_NIL, .next = ALLOC_NIL,
                                          .wiped_for = a->pages[p].wiped_for};
    }
}

int alloc_restore_claim(struct alloc *a, uint64_t off, uint64_t len)
{
    uint64_t p = off / ALLOC_PAGE_SIZE;
    if (p >= a->npages || a->page_tags[p] == 0 || a->page_tags[p] > a->nclasses)
        return -1;
    struct alloc_page *pg = &a->pages[p];
    const struct alloc_class *c = &a->classes[pg->cls];
    if (pg->cls != a->page_tags[p] - 1 || off % ALLOC_PAGE_SIZE % c->size || len > c->size)
        return -1;
    uint32_t idx = (uint32_t)(off % ALLOC_PAGE_SIZE / c->size);
    uint64_t bit = 1ull << (idx % 64);
    if (!(__atomic_fetch_and(&page_bits(a, (uint32_t)p)[idx / 64], ~bit, __ATOMIC_RELAXED) & bit))
        return -1;
    __atomic_fetch_add(&pg->used, 1, __ATOMIC_RELAXED);
    return 0;
}

void alloc_restore_unclaim(struct alloc *a, uint64_t off)
{
    uint32_t p = (uint32_t)(off / ALLOC_PAGE_SIZE);
    struct alloc_page *pg = &a->pages[p];
    const struct alloc_class *c = &a->classes[pg->cls];
    uint32_t idx = (uint32_t)(off % ALLOC_PAGE_SIZE / c->size);
    __atomic_fetch_or(&page_bits(a, p)[idx / 64], 1ull << (idx % 64), __ATOMIC_RELAXED);
    __atomic_fetch_sub(&pg->used, 1, __ATOMIC_RELAXED);
}

void alloc_restore_done(struct alloc *a)
{
    a->free_head = ALLOC_NIL;
    a->free_pages = 0;
    /* Backwards, so that the lowest free page is handed out first. */
    for (uint32_t p = a->npages; p-- > 0;) {
        struct alloc_page *pg = &a->pages[p];
        if (pg->cls != ALLOC_NIL && pg->used == 0) {
            memset(page_bits(a, p), 0, bitmap_bytes(a->classes[pg->cls].per_page));
            pg->cls = ALLOC_NIL;
        }
        if (pg->cls == ALLOC_NIL) {
            pg->next = a->free_head;
            a->free_head = p;
            a->free_pages++;
            a->page_tags[p] = 0;
        } else {
            a->used_bytes += (uint64_t)pg->used * a->classes[pg->cls].size;
            if (pg->used < a->classes[pg->cls].per_page)
                partial_push(a, pg->cls, p);
        }
    }
}
