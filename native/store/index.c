/*
 * index.c - see index.h.
 *
 * While the table grows, a node lives in the old table if its old bucket
 * has not been drained yet, else in the new one; bucket_of() is the one
 * place that knows, and every operation goes through it.
 */
#include "index.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/common.h"

#define INDEX_MIN_BUCKETS 16
/* Old buckets moved per insert or remove. Any value >= 1 finishes a drain
 * before the new table fills up (that takes as many inserts as the old
 * table has buckets); a few more keeps the two-table phase short. */
#define INDEX_DRAIN_STEP 4

static int table_alloc(struct index_table *t, uint64_t nbuckets)
{
    t->buckets = calloc(nbuckets, sizeof *t->buckets);
    t->mask = nbuckets - 1;
    return t->buckets ? 0 : -1;
}

static uint64_t random_seed(void)
{
    uint64_t seed;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed)
        seed = gk_mix64(gk_now_ns());
    return seed;
}

int index_init(struct index *ix, uint64_t min_buckets)
{
    memset(ix, 0, sizeof *ix);
    uint64_t n = INDEX_MIN_BUCKETS;
    while (n < min_buckets)
        n *= 2;
    ix->seed = random_seed();
    return table_alloc(&ix->cur, n);
}

void index_destroy(struct index *ix)
{
    free(ix->cur.buckets);
    free(ix->old.buckets);
    ix->cur.buckets = ix->old.buckets = NULL;
}

uint64_t index_key_hash(const struct index *ix, const uint8_t *key, uint32_t key_len)
{
    return gk_hash64(key, key_len, ix->seed);
}

uint64_t index_hash(const struct index *ix, uint64_t ns_id, const uint8_t *key, uint32_t key_len)
{
    return index_hash_in_ns(index_key_hash(ix, key, key_len), ns_id);
}

static struct index_node **bucket_of(const struct index *ix, uint64_t hash)
{
    if (ix->old.buckets && (hash & ix->old.mask) >= ix->drained)
        return &ix->old.buckets[hash & ix->old.mask];
    return &ix->cur.buckets[hash & ix->cur.mask];
}

struct index_node *index_find(const struct index *ix, uint64_t hash, uint64_t ns_id,
                              const uint8_t *key, uint32_t key_len)
{
    for (struct index_node *n = *bucket_of(ix, hash); n; n = n->next) {
        if (n->hash == hash && n->ns_id == ns_id && n->key_len == key_len &&
            memcmp(n->key, key, key_len) == 0)
            return n;
    }
    return NULL;
}

static void drain(struct index *ix)
{
    for (int step = 0; step < INDEX_DRAIN_STEP && ix->old.buckets; step++) {
        struct index_node *n = ix->old.buckets[ix->drained];
        while (n) {
            struct index_node *next = n->next;
            struct index_node **b = &ix->cur.buckets[n->hash & ix->cur.mask];
            n->next = *b;
            *b = n;
            n = next;
        }
        if (++ix->drained > ix->old.mask) {
            free(ix->old.buckets);
            ix->old.buckets = NULL;
        }
    }
}

/* Starts doubling once the load reaches one node per bucket. If the bigger
 * table can't be allocated the chains just get longer; the next insert
 * tries again. */
static void maybe_grow(struct index *ix)
{
    if (ix->old.buckets || ix->count <= ix->cur.mask)
        return;
    struct index_table bigger;
    if (table_alloc(&bigger, (ix->cur.mask + 1) * 2) != 0)
        return;
    ix->old = ix->cur;
    ix->cur = bigger;
    ix->drained = 0;
}

void index_prefetch(const struct index *ix, uint64_t hash)
{
    __builtin_prefetch(bucket_of(ix, hash));
}

void index_prefetch_chain(const struct index *ix, uint64_t hash)
{
    const struct index_node *n = *bucket_of(ix, hash);
    if (n)
        __builtin_prefetch(n);
}

void index_insert(struct index *ix, struct index_node *n)
{
    maybe_grow(ix);
    drain(ix);
    struct index_node **b = bucket_of(ix, n->hash);
    n->next = *b;
    *b = n;
    ix->count++;
}

void index_remove(struct index *ix, struct index_node *n)
{
    drain(ix);
    struct index_node **p = bucket_of(ix, n->hash);
    while (*p != n) {
        assert(*p && "removing a node that is not in the index");
        p = &(*p)->next;
    }
    *p = n->next;
    n->next = NULL;
    ix->count--;
}

uint32_t index_share_of(const struct index *ix, uint64_t hash, uint32_t nshares)
{
    uint64_t nbuckets = ix->cur.mask + 1;
    return (uint32_t)((hash & ix->cur.mask) * nshares >> __builtin_ctzll(nbuckets));
}

void index_insert_in_share(struct index *ix, struct index_node *n)
{
    assert(!ix->old.buckets);
    struct index_node **b = &ix->cur.buckets[n->hash & ix->cur.mask];
    n->next = *b;
    *b = n;
}

void index_add_count(struct index *ix, uint64_t n) { ix->count += n; }
