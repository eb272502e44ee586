/*
 * disk_format.c - see disk_format.h.
 */
#include "disk_format.h"

#include <string.h>

#include "common/common.h"
#include "disk.h"

#define RECORD_MAGIC 0x63657264766b6467ull  /* "gdkvdrec" */
#define SUPER_MAGIC "gdrkvdk"               /* 8 bytes with its NUL */
#define SUPER_LEN 40u

uint32_t disk_record_hdr_len(uint32_t ns_len, uint32_t key_len)
{
    return (uint32_t)disk_round_up(DISK_RECORD_FIXED + ns_len + key_len, DISK_RECORD_ALIGN);
}

uint64_t disk_record_len(uint32_t hdr_len, uint64_t size)
{
    return hdr_len + disk_round_up(size, DISK_RECORD_ALIGN);
}

static uint64_t header_sum(const uint8_t *buf, uint32_t hdr_len, uint64_t off)
{
    return gk_hash64(buf + 32, hdr_len - 32, off);
}

void disk_record_write(uint8_t *buf, uint64_t off, uint64_t seq, const uint8_t *ns,
                       uint32_t ns_len, const uint8_t *key, uint32_t key_len, uint64_t size,
                       uint64_t value_sum)
{
    uint32_t hdr_len = disk_record_hdr_len(ns_len, key_len);
    memset(buf, 0, hdr_len);
    gk_store64(buf, RECORD_MAGIC);
    gk_store64(buf + 8, seq);
    gk_store64(buf + 32, size);
    gk_store64(buf + 40, value_sum);
    gk_store16(buf + 48, (uint16_t)ns_len);
    gk_store16(buf + 50, (uint16_t)key_len);
    gk_store32(buf + 52, hdr_len);
    memcpy(buf + DISK_RECORD_FIXED, ns, ns_len);
    memcpy(buf + DISK_RECORD_FIXED + ns_len, key, key_len);
    gk_store64(buf + 24, header_sum(buf, hdr_len, off));
}

int disk_record_parse(const uint8_t *buf, uint64_t room, uint64_t off, uint64_t room_record,
                      struct disk_record *r)
{
    if (room < DISK_RECORD_FIXED || gk_load64(buf) != RECORD_MAGIC)
        return 0;
    uint32_t ns_len = gk_load16(buf + 48), key_len = gk_load16(buf + 50);
    uint32_t hdr_len = gk_load32(buf + 52);
    if (hdr_len != disk_record_hdr_len(ns_len, key_len) || hdr_len > room ||
        gk_load64(buf + 24) != header_sum(buf, hdr_len, off))
        return 0;
    r->seq = gk_load64(buf + 8);
    r->dead = gk_load64(buf + DISK_DEAD_OFF) != 0;
    r->size = gk_load64(buf + 32);
    r->value_sum = gk_load64(buf + 40);
    r->hdr_len = hdr_len;
    r->ns_len = ns_len;
    r->key_len = key_len;
    r->ns = buf + DISK_RECORD_FIXED;
    r->key = r->ns + ns_len;
    return r->size <= room_record && disk_record_len(hdr_len, r->size) <= room_record;
}

/* Superblock: magic[8], u32 version, u32 block, u64 region bytes,
 * u64 nregions, u64 checksum of the 32 bytes before. */
void disk_super_write(uint8_t *buf, uint64_t nregions)
{
    memset(buf, 0, DISK_SUPER_BYTES);
    memcpy(buf, SUPER_MAGIC, 8);
    gk_store32(buf + 8, DISK_VERSION);
    gk_store32(buf + 12, DISK_BLOCK);
    gk_store64(buf + 16, DISK_REGION_BYTES);
    gk_store64(buf + 24, nregions);
    gk_store64(buf + 32, gk_hash64(buf, 32, 0));
}

int disk_super_check(const uint8_t *buf, uint64_t nregions)
{
    uint8_t want[DISK_SUPER_BYTES];
    disk_super_write(want, nregions);
    return memcmp(buf, want, SUPER_LEN) == 0;
}
