/*
 * alloc.h - slab allocator over the pool, in the manner of memcached.
 *
 * The pool is cut into pages of ALLOC_PAGE_SIZE bytes. A page is given to a
 * size class when that class runs out of chunks and is carved into equal
 * chunks; it goes back to the shared free-page list as soon as its last
 * chunk is freed, so over its life a page serves whichever class needs it
 * (no "slab calcification" when a deployment's object sizes change).
 *
 * Objects larger than a page are cut into whole pages plus one chunk of the
 * class that fits the remainder (memcached's chunked items):
 * alloc_nchunks() and alloc_piece_len() say how.
 *
 * Every piece of bookkeeping lives on the heap, never in the pool: pool
 * memory is mapped by clients (shm, RDMA) and must only ever hold object
 * bytes. The one exception is a pool file (persist.h): there each page's
 * class also goes to the file's page table, and a page carved for a class
 * has the first 8 bytes of each chunk zeroed (unless it was cut for that
 * same class last, when they hold headers or zeros already), so no stale
 * bytes at a chunk start pass for a header after a restart. Offsets are relative to the
 * start of the pool.
 *
 * Not thread-safe: the store's lock covers it.
 */
#ifndef GDRKV_ALLOC_H
#define GDRKV_ALLOC_H

#include <stdint.h>

#define ALLOC_PAGE_SIZE (1u << 20)
#define ALLOC_MIN_CHUNK 64u            /* also the alignment of every chunk */
#define ALLOC_MAX_CLASSES 48
#define ALLOC_NIL UINT32_MAX           /* "no page" in page links */

/* Free-chunk bitmap words per page: enough for a page of the smallest class. */
#define ALLOC_PAGE_WORDS (ALLOC_PAGE_SIZE / ALLOC_MIN_CHUNK / 64)

struct alloc_class {
    uint32_t size;          /* chunk bytes */
    uint32_t per_page;      /* chunks carved from one page */
    uint32_t partial;       /* first page of the class with a free chunk, or ALLOC_NIL */
};

struct alloc_page {
    uint32_t cls;           /* ALLOC_NIL while the page is free */
    uint32_t used;          /* chunks handed out */
    uint32_t prev, next;    /* class's partial list; the free list uses next only */
    uint32_t hint;          /* no free chunk in bitmap words below this one */
    uint32_t wiped_for;     /* a pool file's page: the class whose chunk starts hold
                               nothing but headers or zeros, or ALLOC_NIL */
};

struct alloc {
    struct alloc_page *pages;
    uint64_t *free_bits;    /* ALLOC_PAGE_WORDS per page; a set bit is a free chunk */
    uint32_t npages;
    uint32_t free_pages;
    uint32_t free_head;     /* stack of free pages */
    uint32_t nclasses;
    struct alloc_class classes[ALLOC_MAX_CLASSES];
    uint64_t used_bytes;    /* class sizes of the chunks handed out */
    uint32_t *page_tags;    /* a pool file's page table (class + 1, 0 = free), or NULL */
    uint8_t *pool;          /* the pool, to wipe chunk starts; set with page_tags */
};

/* Manages capacity bytes (rounded down to whole pages). 0, or -1 when the
 * bookkeeping can't be allocated. */
int alloc_init(struct alloc *a, uint64_t capacity);
void alloc_destroy(struct alloc *a);

uint64_t alloc_capacity(const struct alloc *a);

/* How an object of size bytes is cut into chunks of at most a page when
 * chunk 0 begins with first_hdr bytes of header and every other with hdr
 * bytes (both 0 but in a pool file): the number of chunks, and the value
 * bytes of chunk i (every chunk but the last is a whole page). */
uint32_t alloc_nchunks(uint64_t size, uint32_t first_hdr, uint32_t hdr);
uint64_t alloc_piece_len(uint64_t size, uint32_t first_hdr, uint32_t hdr, uint32_t i);

/* Chunk size of the smallest class holding len bytes, 1 <= len <= page. */
uint32_t alloc_chunk_size(const struct alloc *a, uint64_t len);
/* Pool bytes an object of size bytes takes, headers (as for
 * alloc_nchunks) and class rounding included. */
uint64_t alloc_footprint(const struct alloc *a, uint64_t size, uint32_t first_hdr, uint32_t hdr);

/* Hands out a chunk of at least len bytes (1 <= len <= page) at *off.
 * Returns -1 when the class has no free chunk and no page is free: the
 * caller evicts and tries again. */
int alloc_get(struct alloc *a, uint64_t len, uint64_t *off);
/* Gives back a chunk that alloc_get handed out. */
void alloc_put(struct alloc *a, uint64_t off);

/* Restart over a pool file, between alloc_init (with page_tags set) and the
 * first alloc_get: alloc_restore_begin gives every page the page table
 * marks its class, all chunks free; alloc_restore_claim marks the chunk at
 * off as handed out (-1 when the page table gives its page no class, off
 * is not a chunk start of that class, the chunk is shorter than len, or it
 * is taken); alloc_restore_unclaim takes one back; alloc_restore_done frees
 * every page with no chunk claimed and builds the free lists. Claims and
 * unclaims may run on several threads at once (atomics), the rest not. */
void alloc_restore_begin(struct alloc *a);
int alloc_restore_claim(struct alloc *a, uint64_t off, uint64_t len);
void alloc_restore_unclaim(struct alloc *a, uint64_t off);
void alloc_restore_done(struct alloc *a);

#endif
