/*
 * placement.c - see placement.h.
 */
#include "placement.h"

#include "common/common.h"

uint64_t placement_neg_log2(uint64_t h)
{
    if (h == 0)
        h = 1;
    uint32_t k = 63u - (uint32_t)__builtin_clzll(h);    /* floor(log2 h) */
    /* h / 2^k in [1, 2) as Q1.31 (the top 32 bits of h): truncating is
     * monotone, and 32 bits are ample where a member's share is concerned. */
    uint64_t x = (h << (63 - k)) >> 32;
    uint64_t frac = 0;
    /* One bit of log2(x) per squaring: x^2 >= 2 means the next bit is 1
     * (then halve x). x < 2^32, so x*x fits in 64 bits. Each step is
     * monotone in x, hence so is the result. */
    for (int bit = 31; bit >= 0; bit--) {
        x = (x * x) >> 31;
        if (x >= (1ull << 32)) {
            x >>= 1;
            frac |= 1ull << bit;
        }
    }
    return (64ull << 32) - (((uint64_t)k << 32) | frac);
}

/* Whether member a outranks member b for the key; h[] are the members'
 * hashes, l[] their -log2 (when weighted). */
static int better(const struct placement_member *m, const uint64_t *h, const uint64_t *l,
                  int uniform, uint32_t a, uint32_t b)
{
    if (!uniform) {
        /* w_a / L_a > w_b / L_b, in integers: L >= 1, w < 2^64, L < 2^39. */
        unsigned __int128 sa = (unsigned __int128)m[a].weight * l[b];
        unsigned __int128 sb = (unsigned __int128)m[b].weight * l[a];
        if (sa != sb)
            return sa > sb;
    }
    if (h[a] != h[b])
        return h[a] > h[b];
    /* Ties (practically never) go to the larger seed, so the order in which
     * the members are listed never matters. */
    return m[a].seed > m[b].seed;
}

uint32_t placement_rank(uint64_t key_hash, const struct placement_member *m, uint32_t n,
                        int uniform, uint32_t want, int skip_leaving, uint64_t *scratch,
                        uint32_t *out)
{
    /* scratch: hashes; their logs follow in the upper half when weighted
     * (the caller gives 2n). */
    uint64_t *h = scratch, *l = uniform ? NULL : scratch + n;
    uint32_t got = 0;

    for (uint32_t i = 0; i < n; i++) {
        h[i] = gk_mix64(key_hash ^ m[i].seed);
        if (l)
            l[i] = placement_neg_log2(h[i]);
    }
    want = GK_MIN(want, n);
    /* Pass 0: one member per failure domain; pass 1: any member left. A
     * selection of `want` out of n by repeated scans: want is small. */
    for (int pass = 0; pass < 2 && got < want; pass++) {
        while (got < want) {
            uint32_t best = UINT32_MAX;
            for (uint32_t i = 0; i < n; i++) {
                if (skip_leaving && m[i].leaving)
                    continue;
                int unusable = 0;
                for (uint32_t j = 0; j < got && !unusable; j++)
                    unusable = out[j] == i || (pass == 0 && m[out[j]].domain == m[i].domain);
                if (!unusable && (best == UINT32_MAX || better(m, h, l, uniform, i, best)))
                    best = i;
            }
            if (best == UINT32_MAX)
                break;
            out[got++] = best;
        }
    }
    return got;
}
