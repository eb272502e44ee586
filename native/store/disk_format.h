/*
 * disk_format.h - the bytes of a disk tier file (disk.h).
 *
 *   [0, 4 KiB)                          superblock: format version and geometry
 *   [4 KiB + i * DISK_REGION_BYTES, ..) region i: records, 64-byte aligned,
 *                                       written in batches padded to 4 KiB
 *
 * A record (little-endian):
 *    0  u64  magic "gdkvdrec"
 *    8  u64  seq: the tier's write order, increasing within a region
 *   16  u64  dead word: 0 while the record is live, else deleted
 *   24  u64  header checksum: gk_hash64 of bytes [32, hdr_len), seeded
 *            with the record's file offset (a stale copy elsewhere fails)
 *   32  u64  value size
 *   40  u64  value checksum: gk_checksum64 of the value, seeded with seq
 *   48  u16  namespace length
 *   50  u16  key length
 *   52  u32  hdr_len: 64 + namespace + key, rounded up to 64
 *   56  u64  0
 *   64       namespace, key, zeros to hdr_len; then the value, zeros to 64
 *
 * The dead word is outside the header checksum: deleting rewrites it alone.
 */
#ifndef GDRKV_DISK_FORMAT_H
#define GDRKV_DISK_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#define DISK_VERSION 1
#define DISK_BLOCK 4096u            /* O_DIRECT alignment of offsets, lengths, buffers */
#define DISK_SUPER_BYTES DISK_BLOCK
#define DISK_RECORD_ALIGN 64u
#define DISK_RECORD_FIXED 64u
#define DISK_DEAD_OFF 16u

static inline uint64_t disk_round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

/* Bytes of a record's header and of the whole record. */
uint32_t disk_record_hdr_len(uint32_t ns_len, uint32_t key_len);
uint64_t disk_record_len(uint32_t hdr_len, uint64_t size);

/* What a record header says; ns and key point into the bytes parsed. */
struct disk_record {
    uint64_t seq, size, value_sum;
    uint32_t hdr_len, ns_len, key_len;
    int dead;
    const uint8_t *ns, *key;
};

/* Writes the header of a record at file offset off into buf (hdr_len
 * bytes); the value goes at buf + hdr_len. */
void disk_record_write(uint8_t *buf, uint64_t off, uint64_t seq, const uint8_t *ns,
                       uint32_t ns_len, const uint8_t *key, uint32_t key_len, uint64_t size,
                       uint64_t value_sum);
/* Whether buf (room bytes, from file offset off) starts with an untorn
 * record header whose record fits in room_record bytes; fills *r. */
int disk_record_parse(const uint8_t *buf, uint64_t room, uint64_t off, uint64_t room_record,
                      struct disk_record *r);

/* The superblock of a file of nregions regions. */
void disk_super_write(uint8_t *buf, uint64_t nregions);
int disk_super_check(const uint8_t *buf, uint64_t nregions);

#endif
