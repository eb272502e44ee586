/*
 * lookup.h - how a batch finds its keys, written once for every batch that
 * looks keys up (store.c's pins, EXISTS, reservations and deletes,
 * tiering.c's holds). Inline: it is the hot path's inner loop.
 *
 * A batch's keys are hashed before the lock is taken (the namespace's
 * part, known only under it, is mixed in there), so that the lock covers
 * the lookups alone, and each bucket is fetched a few keys ahead of its
 * lookup: with millions of objects, every lookup is a cache miss.
 *
 * Locking: lookups_begin takes the store's lock, shared or exclusive as
 * the caller asks, and the caller lets it go (store_unlock). Everything
 * else here runs under that lock, either kind: a lookup only reads the
 * index and the namespaces.
 */
#ifndef GDRKV_STORE_LOOKUP_H
#define GDRKV_STORE_LOOKUP_H

#include <assert.h>

#include "gdrkv.h"
#include "store_state.h"

#define LOOKUP_AHEAD 8

/* A batch's lookups: its namespace, once the lock is held (NULL: none, so
 * every key misses; a reservation creates it and may drop it again), and
 * its keys' hashes. */
struct lookups {
    struct store_ns *space;
    uint64_t key_hash[GK_MAX_KEYS];
};

enum lookup_lock { LOOKUP_SHARED, LOOKUP_EXCLUSIVE };

/* The object under e's key in ns, any state; key_hash is index_key_hash
 * of the key. */
static inline struct store_obj *obj_find(struct store *s, const struct store_ns *ns,
                                         const struct gk_entry *e, uint64_t key_hash)
{
    struct index_node *n = index_find(&s->objects, index_hash_in_ns(key_hash, ns->id), ns->id,
                                      e->key, e->key_len);
    return n ? CONTAINER_OF(n, struct store_obj, node) : NULL;
}

/* The committed object under e's key: 0, GDRKV_E_NOT_FOUND (absent, or
 * still being written) or GDRKV_E_INVALID (bad key). ns may be NULL. */
static inline int32_t find_committed_hashed(struct store *s, const struct store_ns *ns,
                                            const struct gk_entry *e, uint64_t key_hash,
                                            struct store_obj **out)
{
    *out = NULL;
    if (!store_key_ok(e))
        return GDRKV_E_INVALID;
    struct store_obj *o = ns ? obj_find(s, ns, e, key_hash) : NULL;
    if (!o || o->state != OBJ_COMMITTED)
        return GDRKV_E_NOT_FOUND;
    *out = o;
    return 0;
}

/* find_committed_hashed of a single key, hashed under the lock. */
static inline int32_t find_committed(struct store *s, const struct store_ns *ns,
                                     const struct gk_entry *e, struct store_obj **out)
{
    uint64_t key_hash = store_key_ok(e) ? index_key_hash(&s->objects, e->key, e->key_len) : 0;
    return find_committed_hashed(s, ns, e, key_hash, out);
}

/* The batch's prologue: hashes e's n keys, takes the lock, finds the
 * namespace (none under a bad name). */
static inline void lookups_begin(struct store *s, struct lookups *l, const struct gk_ns *ns,
                                 const struct gk_entry *e, uint32_t n, enum lookup_lock lock)
{
    assert(n <= GK_MAX_KEYS);       /* a frame's, which the server checked */
    for (uint32_t i = 0; i < n; i++)
        l->key_hash[i] = store_key_ok(&e[i]) ? index_key_hash(&s->objects, e[i].key,
                                                              e[i].key_len) : 0;
    if (lock == LOOKUP_EXCLUSIVE)
        store_lock(s);
    else
        store_lock_shared(s);
    l->space = store_ns_name_ok(ns) ? store_ns_find(s, ns) : NULL;
}

/* While key i of a batch is looked up, fetches the bucket of key i +
 * LOOKUP_AHEAD and the first node in the bucket of key i + LOOKUP_AHEAD /
 * 2 (fetched that many keys ago): with millions of objects each is a
 * cache miss, which the fetches hide; into a store that fits the caches
 * they cost nothing (docs/benchmarks-log.md, "Where a small-page GPU
 * GET's time goes; planning once": lookups in a store of millions of
 * objects). */
static inline void lookups_prefetch(struct store *s, const struct lookups *l, uint32_t i,
                                    uint32_t n)
{
    if (!l->space)
        return;
    if (i + LOOKUP_AHEAD < n)
        index_prefetch(&s->objects,
                       index_hash_in_ns(l->key_hash[i + LOOKUP_AHEAD], l->space->id));
    if (i + LOOKUP_AHEAD / 2 < n)
        index_prefetch_chain(&s->objects,
                             index_hash_in_ns(l->key_hash[i + LOOKUP_AHEAD / 2], l->space->id));
}

/* Key i's committed object (find_committed_hashed), fetching ahead
 * meanwhile. */
static inline int32_t lookups_find(struct store *s, const struct lookups *l,
                                   const struct gk_entry *e, uint32_t i, uint32_t n,
                                   struct store_obj **out)
{
    lookups_prefetch(s, l, i, n);
    return find_committed_hashed(s, l->space, &e[i], l->key_hash[i], out);
}

#endif
