/*
 * fuzz_driver.h - what the fuzz targets share: the invariant check, and
 * (without libFuzzer) the driver that feeds LLVMFuzzerTestOneInput random
 * bytes and mutations of well-formed inputs for a bounded time, from a
 * seed it prints so a failure can be replayed:
 *
 *   ./build/fuzz_X [SECONDS [SEED]]
 *
 * With clang -fsanitize=fuzzer -DGK_LIBFUZZER, libFuzzer drives the target
 * instead. A target defines FUZZ_NAME, LLVMFuzzerTestOneInput, and for the
 * driver make_valid(buf, cap) and mutate_once(buf, len, cap): its own
 * mutations, falling back to mutate_bytes for the generic ones.
 */
#ifndef GDRKV_FUZZ_DRIVER_H
#define GDRKV_FUZZ_DRIVER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/common.h"

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, FUZZ_NAME ": invariant broken: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifndef GK_LIBFUZZER

/* xorshift64*: reproducible from the seed printed at start. */
static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static size_t make_valid(uint8_t *buf, size_t cap);
static size_t mutate_once(uint8_t *buf, size_t len, size_t cap);

/* The mutations any byte stream gets: flip a byte, truncate, append. */
static size_t mutate_bytes(uint8_t *buf, size_t len, size_t cap)
{
    switch (rnd() % 3) {
    case 0:
        if (len)
            buf[rnd() % len] ^= (uint8_t)(1 + rnd() % 255);
        break;
    case 1:
        if (len)
            len = rnd() % len;
        break;
    default:
        while (len < cap && rnd() % 8)
            buf[len++] = (uint8_t)rnd();
        break;
    }
    return len;
}

static size_t mutate(uint8_t *buf, size_t len, size_t cap)
{
    for (int rounds = 1 + (int)(rnd() % 4); rounds > 0; rounds--)
        len = mutate_once(buf, len, cap);
    return len;
}

/* One input in eight is random bytes; the others are well formed, and
 * mutated with odds mutate_in (1 in mutate_in is left intact). */
static int fuzz_main(int argc, char **argv, uint8_t *buf, size_t cap, uint64_t mutate_in)
{
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : gk_now_ns();
    uint64_t deadline = gk_now_ns() + (uint64_t)(seconds * 1e9), runs = 0;

    rng_state = seed | 1;
    printf(FUZZ_NAME ": seed %llu, %.1f s\n", (unsigned long long)seed, seconds);
    while (gk_now_ns() < deadline) {
        for (int i = 0; i < 1000; i++, runs++) {
            size_t len;
            if (rnd() % 8 == 0) {
                len = rnd() % 512;
                for (size_t j = 0; j < len; j++)
                    buf[j] = (uint8_t)rnd();
            } else {
                len = make_valid(buf, cap);
                if (rnd() % mutate_in)
                    len = mutate(buf, len, cap);
            }
            LLVMFuzzerTestOneInput(buf, len);
        }
    }
    printf(FUZZ_NAME ": %llu inputs, no invariant broken\n", (unsigned long long)runs);
    return 0;
}

#endif
#endif
