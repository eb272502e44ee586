/*
 * hash.c - gk_hash64: a simple, fast, process-independent hash. Keys are
 * SHA-256 hex digests or similar, so quality needs are modest; speed on
 * 64..1024-byte keys and stability across builds are what matter.
 */
#include "common.h"

uint64_t gk_hash64(const void *data, size_t len, uint64_t seed)
{
    const uint8_t *p = data;
    uint64_t h = seed ^ (0x9e3779b97f4a7c15ull * (len + 1));
    while (len >= 8) {
        h = gk_mix64(h ^ gk_load64(p)) * 0x9e3779b97f4a7c15ull;
        p += 8;
        len -= 8;
    }
    uint64_t tail = 0;
    for (size_t i = 0; i < len; i++)
        tail |= (uint64_t)p[i] << (8 * i);
    return gk_mix64(h ^ tail ^ ((uint64_t)len << 56));
}
