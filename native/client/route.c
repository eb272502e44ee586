/*
 * route.c - see route.h.
 */
#include "route.h"

#include <string.h>

#include "common/common.h"

/* Part of the routing function: changing it moves keys between servers. */
#define ROUTE_HASH_SEED 0

uint64_t route_server_seed(const char *name)
{
    return gk_hash64(name, strlen(name), ROUTE_HASH_SEED);
}

uint64_t route_key_hash(const void *key, size_t len)
{
    return gk_hash64(key, len, ROUTE_HASH_SEED);
}

uint32_t route_pick(uint64_t key_hash, const uint64_t *seeds, uint32_t nservers)
{
    uint32_t best = 0;
    uint64_t best_score = gk_mix64(key_hash ^ seeds[0]);
    for (uint32_t i = 1; i < nservers; i++) {
        uint64_t score = gk_mix64(key_hash ^ seeds[i]);
        /* Ties (practically never) go to the larger seed, so the order in
         * which the servers are listed never matters. */
        if (score > best_score || (score == best_score && seeds[i] > seeds[best])) {
            best = i;
            best_score = score;
        }
    }
    return best;
}
