/*
 * persist.h - the pool file's format: what lets a restarted server find the
 * objects a killed one left in a file-backed pool (--pool-file).
 *
 * The file is the pool's bytes, then a metadata area no client maps:
 *
 *   [0, capacity)            pages of objects (what clients map and rdma registers)
 *   [meta_off, +4 KiB)       superblock: format version and geometry
 *   [meta_off + 4 KiB, ...)  page table: one u32 per page, its size class + 1 (0 = free)
 *
 * Every piece of an object starts with a header the server writes before
 * the client may write a byte of the value: piece 0 with the object's head
 * (key, namespace, size, the other pieces' offsets, the value's checksum, a
 * checksum of the head), the others
 * with a short piece header naming their head. The head's commit word is
 * the one thing COMMIT writes: 0 while the value is being written or once
 * the object is deleted or evicted, (seq << 1) | 1 while it is readable.
 * It is one aligned 8-byte store, so a kill can't tear it, and it is
 * written only after the value is complete, so a committed head always
 * covers whole bytes. A torn head (a kill while the server wrote it) fails
 * its checksum.
 *
 * Why no client bytes can pose as a header at restart: the scan reads only
 * the chunk starts of pages the page table gives a class, and every chunk
 * start holds a header the server wrote or zeros (a page carved for a class
 * has its chunk starts wiped first, alloc.c). Values land after headers.
 *
 * The file outlives the process, not the machine: tmpfs and hugetlbfs lose
 * it at reboot, and nothing here flushes CPU caches for persistent memory.
 */
#ifndef GDRKV_PERSIST_H
#define GDRKV_PERSIST_H

#include <stddef.h>
#include <stdint.h>

#include "alloc.h"

#define PERSIST_VERSION 2           /* 2: heads carry the value's checksum */
#define PERSIST_ALIGN 64u            /* headers are padded to this: values stay 64-byte aligned */
#define PERSIST_PIECE_HDR 64u
#define PERSIST_SUPER_BYTES 4096u
#define PERSIST_META_ALIGN (2ull << 20) /* hugetlbfs maps whole 2 MiB pages */

/* Where the metadata area starts and how long it is, for a pool of
 * capacity bytes (whole alloc pages). */
uint64_t persist_meta_off(uint64_t capacity);
uint64_t persist_meta_len(uint64_t capacity);

/* A fresh file: writes the superblock and an empty page table at meta.
 * An existing one: 0 when its superblock matches this build's geometry,
 * else -1 with the reason in err. */
void persist_format(uint8_t *meta, uint64_t capacity, const struct alloc *a);
int persist_check(const uint8_t *meta, uint64_t capacity, const struct alloc *a, char *err,
                  size_t errlen);
uint32_t *persist_page_table(uint8_t *meta);

/* Head header bytes of an object: padded to PERSIST_ALIGN. */
uint32_t persist_head_len(uint32_t ns_len, uint32_t key_len, uint32_t npieces);

/* What a head says. */
struct persist_head {
    uint64_t seq;                   /* commit order */
    uint64_t size;
    uint32_t head_len, npieces;
    const uint8_t *ns, *key;
    uint32_t ns_len, key_len;
    const uint8_t *piece_offs;      /* npieces - 1 little-endian u64 offsets of pieces 1.. */
};

/* Writing a reserved (uncommitted) object's headers: its piece offsets go
 * to persist_head_offsets() (little-endian u64s), then persist_write_head
 * writes the rest of the head at pool + off (h->piece_offs pointing there),
 * and persist_write_piece each piece's header. */
uint8_t *persist_head_offsets(uint8_t *pool, uint64_t off);
void persist_write_head(uint8_t *pool, uint64_t off, const struct persist_head *h);
void persist_write_piece(uint8_t *pool, uint64_t off, uint64_t head_off, uint32_t index);

/* The value's checksum, in the head of a reserved object whose value is
 * complete (before persist_commit), and as a restart reads it back: a
 * restored object is served only once its bytes match (store.c,
 * "Restored values"). */
void persist_seal_value(uint8_t *pool, uint64_t head_off, uint32_t sum);
uint32_t persist_value_sum(const uint8_t *pool, uint64_t head_off);

/* The commit word: readable from now on, or never again. */
void persist_commit(uint8_t *pool, uint64_t head_off, uint64_t seq);
void persist_uncommit(uint8_t *pool, uint64_t head_off);
/* Unmarks a head as a head at all, as its chunks are freed. */
void persist_forget(uint8_t *pool, uint64_t head_off);

/* Whether the bytes at pool + off are a committed, untorn head that fits in
 * room bytes of its chunk; fills *h (pointing into the pool). */
int persist_read_head(const uint8_t *pool, uint64_t off, uint64_t room, struct persist_head *h);
/* The same without the checks, for a head persist_read_head passed. */
void persist_head_at(const uint8_t *pool, uint64_t off, struct persist_head *h);
/* Whether the bytes at pool + off begin a head (committed or not): a
 * restart counts the ones it could not use. */
int persist_is_head(const uint8_t *pool, uint64_t off);
/* Whether the bytes at pool + off are piece index of the head at head_off. */
int persist_piece_ok(const uint8_t *pool, uint64_t off, uint64_t head_off, uint32_t index);

#endif
