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

/* Four independent lanes of 8 bytes, so the multiplies of one lane hide
 * behind the others' (xxHash64's structure): about three times gk_hash64's
 * rate, whose one chain of multiplies waits on each step. */
static inline uint64_t lane(uint64_t acc, uint64_t v)
{
    acc += v * 0xc2b2ae3d27d4eb4full;
    acc = (acc << 31) | (acc >> 33);
    return acc * 0x9e3779b185ebca87ull;
}

uint64_t gk_checksum64(const void *data, size_t len, uint64_t seed)
{
    const uint8_t *p = data;
    uint64_t a = seed + 1, b = seed + 2, c = seed + 3, d = seed + 4;
    size_t whole = len & ~(size_t)31;
    for (size_t i = 0; i < whole; i += 32) {
        a = lane(a, gk_load64(p + i));
        b = lane(b, gk_load64(p + i + 8));
        c = lane(c, gk_load64(p + i + 16));
        d = lane(d, gk_load64(p + i + 24));
    }
    uint64_t h = gk_mix64(a) ^ gk_mix64(b + 1) ^ gk_mix64(c + 2) ^ gk_mix64(d + 3);
    return gk_hash64(p + whole, len - whole, h ^ len);
}
