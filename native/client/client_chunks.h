/*
 * client_chunks.h - a LEASE or RESERVE answer's chunk lists laid over the
 * caller's segments: each object's chunks (pool offsets) and its segments
 * (caller addresses) cut into the pieces where they meet. shm copies the
 * pieces out of its mapping; rdma turns them into READs or WRITEs.
 */
#ifndef GDRKV_CLIENT_CHUNKS_H
#define GDRKV_CLIENT_CHUNKS_H

#include <stddef.h>
#include <stdint.h>

#include "client_state.h"

/* One piece: len bytes of key position p, at seg_off in segment seg (an
 * index into b->seg_ptrs/seg_lens) and pool_off in the pool. Returns 0, or
 * non-zero to stop. */
typedef int (*client_chunk_fn)(void *arg, uint32_t p, uint64_t seg, uint64_t seg_off,
                               uint64_t pool_off, uint64_t len);

/* Walks the lists (len bytes) of keys [first, first + count) of b: a key
 * has a list when listed[k] is set (listed NULL: when its result is not an
 * error), and its chunks must add up to obj_lens[p]. Every offset and
 * length is checked against pool_size and the segments first. Returns 0,
 * GDRKV_E_PROTOCOL (malformed) or GDRKV_E_INTERNAL (fn refused). */
int client_chunks_walk(const uint8_t *lists, size_t len, uint64_t pool_size,
                       const struct client_batch *b, uint32_t first, uint32_t count,
                       const uint8_t *listed, const uint64_t *obj_lens, client_chunk_fn fn,
                       void *arg);

#endif
