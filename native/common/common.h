/*
 * common.h - small helpers every native file uses: clocks, little-endian
 * loads and stores (the wire format is little-endian and unaligned), and a
 * 64-bit hash for the index and for rendezvous routing.
 */
#ifndef GDRKV_COMMON_H
#define GDRKV_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define GK_MIN(a, b) ((a) < (b) ? (a) : (b))
#define GK_MAX(a, b) ((a) > (b) ? (a) : (b))
#define GK_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define GK_UNUSED(x) ((void)(x))

static inline uint64_t gk_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One beat of a spin-wait: tells the core (and its hyperthread sibling) so. */
static inline void gk_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static inline uint16_t gk_load16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t gk_load32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t gk_load64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void gk_store16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void gk_store32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void gk_store64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gdrkv's wire format is little-endian; big-endian hosts need byte swaps here"
#endif

/* Final avalanche of a 64-bit value (splitmix64's finaliser). */
static inline uint64_t gk_mix64(uint64_t x)
{
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* Seeded 64-bit hash of a byte string; stable across processes and builds
 * (routing depends on it), so never change the algorithm. */
uint64_t gk_hash64(const void *data, size_t len, uint64_t seed);

/* Seeded 64-bit checksum of large values (disk records), several times
 * faster than gk_hash64 on long inputs; just as stable. */
uint64_t gk_checksum64(const void *data, size_t len, uint64_t seed);

#endif
