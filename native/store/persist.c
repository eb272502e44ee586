/*
 * persist.c - see persist.h.
 *
 * Head layout (little-endian):
 *    0  u64  magic "gdkvhead"
 *    8  u64  commit word
 *   16  u64  checksum: gk_hash64 of bytes [24, head_len), seeded with the
 *            head's own pool offset (a copy elsewhere does not check)
 *   24  u64  size
 *   32  u32  head_len
 *   36  u32  npieces
 *   40  u16  ns_len
 *   42  u16  key_len
 *   44  u32  value checksum: gk_checksum64 of the value's bytes, chunk after
 *            chunk, folded to 32 bits; written (with the head's checksum
 *            again) just before the commit word
 *   48  u64  offsets of pieces 1..npieces-1, then ns bytes, key bytes, zeros
 *
 * Piece header: u64 magic "gdkvpiec", u64 checksum of bytes [16, 32) seeded
 * with its offset, u64 head offset, u32 index, u32 0.
 */
#include "persist.h"

#include <stdio.h>
#include <string.h>

#include "common/common.h"

#define HEAD_MAGIC 0x64616568766b6467ull   /* "gdkvhead" */
#define PIECE_MAGIC 0x63656970766b6467ull  /* "gdkvpiec" */
#define HEAD_FIXED 48u
#define SUPER_MAGIC "gdrkvpl"              /* 8 bytes with its NUL */

static uint64_t round_up64(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

uint64_t persist_meta_off(uint64_t capacity) { return round_up64(capacity, PERSIST_META_ALIGN); }

uint64_t persist_meta_len(uint64_t capacity)
{
    uint64_t pages = capacity / ALLOC_PAGE_SIZE;
    return round_up64(PERSIST_SUPER_BYTES + pages * sizeof(uint32_t), PERSIST_META_ALIGN);
}

uint32_t *persist_page_table(uint8_t *meta) { return (uint32_t *)(meta + PERSIST_SUPER_BYTES); }

/* ----------------------------------------------------------- superblock */

/* Superblock: magic[8], u32 version, u32 page size, u32 min chunk,
 * u32 nclasses, u64 capacity, u32 class sizes[ALLOC_MAX_CLASSES]. What
 * this build would write for the pool is what an existing file must hold. */
static size_t super_image(uint8_t *out, uint64_t capacity, const struct alloc *a)
{
    memset(out, 0, PERSIST_SUPER_BYTES);
    memcpy(out, SUPER_MAGIC, 8);
    gk_store32(out + 8, PERSIST_VERSION);
    gk_store32(out + 12, ALLOC_PAGE_SIZE);
    gk_store32(out + 16, ALLOC_MIN_CHUNK);
    gk_store32(out + 20, a->nclasses);
    gk_store64(out + 24, capacity);
    for (uint32_t i = 0; i < a->nclasses; i++)
        gk_store32(out + 32 + 4 * i, a->classes[i].size);
    return 32 + 4 * ALLOC_MAX_CLASSES;
}

void persist_format(uint8_t *meta, uint64_t capacity, const struct alloc *a)
{
    uint8_t image[PERSIST_SUPER_BYTES];
    super_image(image, capacity, a);
    memset(persist_page_table(meta), 0, capacity / ALLOC_PAGE_SIZE * sizeof(uint32_t));
    /* The magic last: a kill mid-format leaves a file that is not a pool. */
    memcpy(meta + 8, image + 8, PERSIST_SUPER_BYTES - 8);
    memcpy(meta, image, 8);
}

int persist_check(const uint8_t *meta, uint64_t capacity, const struct alloc *a, char *err,
                  size_t errlen)
{
    uint8_t want[PERSIST_SUPER_BYTES];
    size_t len = super_image(want, capacity, a);
    if (memcmp(meta, SUPER_MAGIC, 8) != 0) {
        snprintf(err, errlen, "it is not a gdrkv pool file (or its creation was cut short)");
        return -1;
    }
    if (gk_load32(meta + 8) != PERSIST_VERSION) {
        snprintf(err, errlen, "it has format version %u; this gdrkv reads version %u",
                 gk_load32(meta + 8), PERSIST_VERSION);
        return -1;
    }
    if (gk_load64(meta + 24) != capacity) {
        snprintf(err, errlen, "it holds a %llu MiB pool, not %llu MiB",
                 (unsigned long long)(gk_load64(meta + 24) >> 20),
                 (unsigned long long)(capacity >> 20));
        return -1;
    }
    if (memcmp(meta, want, len) != 0) {
        snprintf(err, errlen, "its size classes differ from this gdrkv's");
        return -1;
    }
    return 0;
}

/* --------------------------------------------------------------- headers */

uint32_t persist_head_len(uint32_t ns_len, uint32_t key_len, uint32_t npieces)
{
    uint64_t len = HEAD_FIXED + 8ull * (npieces - 1) + ns_len + key_len;
    return (uint32_t)round_up64(len, PERSIST_ALIGN);
}

static uint64_t head_checksum(const uint8_t *head, uint32_t head_len, uint64_t off)
{
    return gk_hash64(head + 24, head_len - 24, off);
}

uint8_t *persist_head_offsets(uint8_t *pool, uint64_t off) { return pool + off + HEAD_FIXED; }

void persist_write_head(uint8_t *pool, uint64_t off, const struct persist_head *h)
{
    uint8_t *p = pool + off;
    uint8_t *offs = p + HEAD_FIXED;
    uint8_t *names = offs + 8ull * (h->npieces - 1);

    gk_store64(p + 8, 0);
    gk_store64(p + 24, h->size);
    gk_store32(p + 32, h->head_len);
    gk_store32(p + 36, h->npieces);
    gk_store16(p + 40, (uint16_t)h->ns_len);
    gk_store16(p + 42, (uint16_t)h->key_len);
    gk_store32(p + 44, 0);
    if (offs != h->piece_offs)
        memmove(offs, h->piece_offs, 8ull * (h->npieces - 1));
    uint8_t *end = names + h->ns_len + h->key_len;
    memcpy(names, h->ns, h->ns_len);
    memcpy(names + h->ns_len, h->key, h->key_len);
    memset(end, 0, (size_t)(p + h->head_len - end));
    gk_store64(p + 16, head_checksum(p, h->head_len, off));
    gk_store64(p, HEAD_MAGIC);
}

static uint64_t piece_checksum(const uint8_t *piece, uint64_t off)
{
    return gk_hash64(piece + 16, 16, off);
}

void persist_write_piece(uint8_t *pool, uint64_t off, uint64_t head_off, uint32_t index)
{
    uint8_t *p = pool + off;
    gk_store64(p + 16, head_off);
    gk_store32(p + 24, index);
    gk_store32(p + 28, 0);
    gk_store64(p + 8, piece_checksum(p, off));
    gk_store64(p, PIECE_MAGIC);
}

/* Atomic so that no compiler splits the store, and release so that the
 * header and value bytes written before it are visible to whatever sees it. */
void persist_commit(uint8_t *pool, uint64_t head_off, uint64_t seq)
{
    __atomic_store_n((uint64_t *)(pool + head_off + 8), (seq << 1) | 1, __ATOMIC_RELEASE);
}

void persist_uncommit(uint8_t *pool, uint64_t head_off)
{
    __atomic_store_n((uint64_t *)(pool + head_off + 8), 0, __ATOMIC_RELEASE);
}

void persist_forget(uint8_t *pool, uint64_t head_off) { gk_store64(pool + head_off, 0); }

void persist_seal_value(uint8_t *pool, uint64_t head_off, uint32_t sum)
{
    uint8_t *p = pool + head_off;
    gk_store32(p + 44, sum);
    gk_store64(p + 16, head_checksum(p, gk_load32(p + 32), head_off));
}

uint32_t persist_value_sum(const uint8_t *pool, uint64_t head_off)
{
    return gk_load32(pool + head_off + 44);
}

int persist_is_head(const uint8_t *pool, uint64_t off)
{
    return gk_load64(pool + off) == HEAD_MAGIC;
}

void persist_head_at(const uint8_t *pool, uint64_t off, struct persist_head *h)
{
    const uint8_t *p = pool + off;
    h->seq = gk_load64(p + 8) >> 1;
    h->size = gk_load64(p + 24);
    h->head_len = gk_load32(p + 32);
    h->npieces = gk_load32(p + 36);
    h->ns_len = gk_load16(p + 40);
    h->key_len = gk_load16(p + 42);
    h->piece_offs = p + HEAD_FIXED;
    h->ns = h->piece_offs + 8ull * (h->npieces - 1);
    h->key = h->ns + h->ns_len;
}

int persist_read_head(const uint8_t *pool, uint64_t off, uint64_t room, struct persist_head *h)
{
    const uint8_t *p = pool + off;
    if (room < HEAD_FIXED || gk_load64(p) != HEAD_MAGIC || !(gk_load64(p + 8) & 1))
        return 0;
    persist_head_at(pool, off, h);
    return h->npieces > 0 && h->npieces <= room / 8 &&
           h->head_len == persist_head_len(h->ns_len, h->key_len, h->npieces) &&
           h->head_len <= room && gk_load64(p + 16) == head_checksum(p, h->head_len, off);
}

int persist_piece_ok(const uint8_t *pool, uint64_t off, uint64_t head_off, uint32_t index)
{
    const uint8_t *p = pool + off;
    return gk_load64(p) == PIECE_MAGIC && gk_load64(p + 8) == piece_checksum(p, off) &&
           gk_load64(p + 16) == head_off && gk_load32(p + 24) == index;
}
