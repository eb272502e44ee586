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
