/*
 * index.h - hash table from (namespace id, key bytes) to a node embedded in
 * the caller's own structure (intrusive, as memcached's items carry their
 * h_next): inserting never allocates, so it never fails.
 *
 * Chained buckets, doubled when the table holds as many nodes as buckets.
 * Growth is incremental, as in Redis's dict: the old table is drained a few
 * buckets per insert or remove, so no single call rehashes millions of
 * nodes while the store's lock is held.
 *
 * Not thread-safe: the store's lock covers it.
 */
#ifndef GDRKV_INDEX_H
#define GDRKV_INDEX_H

#include <stdint.h>

struct index_node {
    struct index_node *next;    /* bucket chain */
    uint64_t hash;              /* index_hash() of ns_id and key */
    uint64_t ns_id;
    const uint8_t *key;         /* owned by the node's container */
    uint32_t key_len;
};

struct index_table {
    struct index_node **buckets;
    uint64_t mask;              /* bucket count - 1; counts are powers of two */
};

struct index {
    struct index_table cur;
    struct index_table old;     /* being drained into cur; buckets NULL otherwise */
    uint64_t drained;           /* old buckets below this one are empty */
    uint64_t count;
    uint64_t seed;              /* random per index: clients can't aim keys at one chain */
};

/* 0, or -1 when the first table can't be allocated. */
int index_init(struct index *ix, uint64_t min_buckets);
/* Frees the tables; the nodes belong to the caller. */
void index_destroy(struct index *ix);

uint64_t index_hash(const struct index *ix, uint64_t ns_id, const uint8_t *key, uint32_t key_len);
/* index_hash in two steps, so that the costly one (over the key bytes)
 * can run before a lock is taken: index_hash == index_hash_in_ns of
 * index_key_hash. */
uint64_t index_key_hash(const struct index *ix, const uint8_t *key, uint32_t key_len);
static inline uint64_t index_hash_in_ns(uint64_t key_hash, uint64_t ns_id)
{
    return key_hash ^ (ns_id * 0x9e3779b97f4a7c15ull);
}
/* Starts fetching the bucket a lookup of hash will read. */
void index_prefetch(const struct index *ix, uint64_t hash);
/* Starts fetching the first node of that bucket: reads the bucket, so
 * index_prefetch it a while before. */
void index_prefetch_chain(const struct index *ix, uint64_t hash);
struct index_node *index_find(const struct index *ix, uint64_t hash, uint64_t ns_id,
                              const uint8_t *key, uint32_t key_len);
/* n->hash, ns_id, key and key_len must be set and the key absent. */
void index_insert(struct index *ix, struct index_node *n);
/* n must be in the index. */
void index_remove(struct index *ix, struct index_node *n);

/* Filling a table just sized by index_init from several threads at once:
 * the buckets are cut into nshares contiguous ranges, a thread inserts
 * (index_insert_in_share) only nodes of its own share and finds only
 * there, and nothing grows or counts meanwhile; index_add_count then
 * counts what was inserted. */
uint32_t index_share_of(const struct index *ix, uint64_t hash, uint32_t nshares);
void index_insert_in_share(struct index *ix, struct index_node *n);
void index_add_count(struct index *ix, uint64_t n);

#endif
