/*
 * test_index.c - the hash index: insert, find, remove, incremental growth
 * with tens of thousands of keys, 4096-byte keys that differ in one byte,
 * and namespace isolation.
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "store/index.h"
#include "common/protocol.h"

struct item {
    struct index_node node;
    uint8_t key[GK_MAX_KEY_LEN];
};

static void item_set(const struct index *ix, struct item *it, uint64_t ns_id, const void *key,
                     uint32_t len)
{
    memcpy(it->key, key, len);
    it->node.key = it->key;
    it->node.key_len = len;
    it->node.ns_id = ns_id;
    it->node.hash = index_hash(ix, ns_id, it->key, len);
}

static struct index_node *find(const struct index *ix, uint64_t ns_id, const void *key, uint32_t len)
{
    return index_find(ix, index_hash(ix, ns_id, key, len), ns_id, key, len);
}

static int found(const struct index *ix, const struct item *it)
{
    return find(ix, it->node.ns_id, it->key, it->node.key_len) == &it->node;
}

static uint32_t numbered_key(char *buf, size_t cap, int i)
{
    return (uint32_t)snprintf(buf, cap, "sha256:%08x-page-%d", (unsigned)(i * 2654435761u), i);
}

/* Many keys from the smallest table: growth happens several times and
 * every key stays findable at every step, while the old table drains. */
static void test_grow_keeps_every_key(void)
{
    enum { N = 50000 };
    static struct item items[N];
    struct index ix;
    CHECK(index_init(&ix, 0) == 0, "init");
    CHECK_EQ(ix.cur.mask + 1, 16);
    char key[64];
    for (int i = 0; i < N; i++) {
        item_set(&ix, &items[i], 1, key, numbered_key(key, sizeof key, i));
        CHECK(!find(&ix, 1, key, items[i].node.key_len), "key %d present before insert", i);
        index_insert(&ix, &items[i].node);
        CHECK(found(&ix, &items[i]), "key %d lost right after insert", i);
        CHECK(found(&ix, &items[i / 2]), "key %d lost while inserting %d", i / 2, i);
        CHECK(found(&ix, &items[i * 7 / 8]), "key %d lost while inserting %d", i * 7 / 8, i);
    }
    CHECK_EQ(ix.count, N);
    CHECK(ix.cur.mask + 1 >= N, "table did not grow: %llu buckets", (unsigned long long)ix.cur.mask + 1);
    for (int i = 0; i < N; i++)
        CHECK(found(&ix, &items[i]), "key %d lost after growth", i);
    CHECK(!find(&ix, 1, "absent", 6), "absent key found");
    index_destroy(&ix);
}

/* Removes while the table grows, then reinserts: removed keys are gone,
 * the others stay. */
static void test_remove_and_reinsert(void)
{
    enum { N = 20000 };
    static struct item items[N];
    struct index ix;
    CHECK(index_init(&ix, 0) == 0, "init");
    char key[64];
    for (int i = 0; i < N; i++) {
        item_set(&ix, &items[i], 7, key, numbered_key(key, sizeof key, i));
        index_insert(&ix, &items[i].node);
        if (i % 2 == 1)
            index_remove(&ix, &items[i - 1].node);
    }
    CHECK_EQ(ix.count, N / 2);
    for (int i = 0; i < N; i++)
        CHECK(found(&ix, &items[i]) == (i % 2 == 1), "key %d wrongly %s", i,
              i % 2 ? "missing" : "present");
    for (int i = 0; i < N; i += 2)
        index_insert(&ix, &items[i].node);
    for (int i = 1; i < N; i += 2)
        index_remove(&ix, &items[i].node);
    CHECK_EQ(ix.count, N / 2);
    for (int i = 0; i < N; i++)
        CHECK(found(&ix, &items[i]) == (i % 2 == 0), "key %d wrongly %s after reinsert", i,
              i % 2 ? "present" : "missing");
    for (int i = 0; i < N; i += 2)
        index_remove(&ix, &items[i].node);
    CHECK_EQ(ix.count, 0);
    index_destroy(&ix);
}

/* Maximum-length keys that differ in a single byte (first, last, or inside
 * an 8-byte word the hash consumes whole), and a key that is a prefix of
 * another, are all distinct. */
static void test_long_keys_differ_in_one_byte(void)
{
    static const uint32_t positions[] = {0, 1, 7, 8, 63, 2048, 4088, 4094, 4095};
    enum { NVAR = sizeof positions / sizeof positions[0] };
    static struct item items[NVAR + 2];
    static uint8_t base[GK_MAX_KEY_LEN], probe[GK_MAX_KEY_LEN];
    uint64_t seed = 7;
    for (int i = 0; i < GK_MAX_KEY_LEN; i++)
        base[i] = (uint8_t)check_rand(&seed);

    struct index ix;
    CHECK(index_init(&ix, 0) == 0, "init");
    item_set(&ix, &items[0], 1, base, GK_MAX_KEY_LEN);
    item_set(&ix, &items[1], 1, base, GK_MAX_KEY_LEN - 1);
    for (uint32_t v = 0; v < NVAR; v++) {
        memcpy(probe, base, sizeof probe);
        probe[positions[v]] ^= 0x01;
        item_set(&ix, &items[v + 2], 1, probe, GK_MAX_KEY_LEN);
    }
    for (uint32_t i = 0; i < NVAR + 2; i++)
        index_insert(&ix, &items[i].node);
    for (uint32_t i = 0; i < NVAR + 2; i++)
        CHECK(found(&ix, &items[i]), "long key %u not found as itself", i);

    memcpy(probe, base, sizeof probe);
    probe[100] ^= 0x80;
    CHECK(!find(&ix, 1, probe, GK_MAX_KEY_LEN), "a key never inserted was found");
    CHECK(!find(&ix, 1, base, GK_MAX_KEY_LEN - 2), "a shorter prefix was found");

    index_remove(&ix, &items[0].node);
    CHECK(!found(&ix, &items[0]), "removed long key still found");
    for (uint32_t i = 1; i < NVAR + 2; i++)
        CHECK(found(&ix, &items[i]), "neighbour %u lost by a remove", i);
    index_destroy(&ix);
}

static void test_namespaces_isolated(void)
{
    static struct item a, b;
    struct index ix;
    CHECK(index_init(&ix, 0) == 0, "init");
    item_set(&ix, &a, 1, "same-key", 8);
    item_set(&ix, &b, 2, "same-key", 8);
    index_insert(&ix, &a.node);
    CHECK(!find(&ix, 2, "same-key", 8), "namespace 2 sees namespace 1's key");
    index_insert(&ix, &b.node);
    CHECK(found(&ix, &a) && found(&ix, &b), "both namespaces find their own node");
    index_remove(&ix, &a.node);
    CHECK(!find(&ix, 1, "same-key", 8) && found(&ix, &b), "remove touched the other namespace");
    index_destroy(&ix);
}

/* Two indexes hash the same key differently (a per-index random seed), so
 * a client can't precompute keys that collide in every server. */
static void test_hash_is_seeded(void)
{
    struct index x, y;
    CHECK(index_init(&x, 0) == 0 && index_init(&y, 0) == 0, "init");
    const uint8_t key[] = "page-0";
    /* A function of the bytes, not of where they are; every byte counts. */
    uint8_t copy[6], other[6];
    memcpy(copy, key, 6);
    memcpy(other, key, 6);
    other[5] = '1';
    CHECK_EQ(index_hash(&x, 1, key, 6), index_hash(&x, 1, copy, 6));
    CHECK(index_hash(&x, 1, key, 6) != index_hash(&x, 1, other, 6), "last byte not in the hash");
    CHECK(index_hash(&x, 1, key, 6) != index_hash(&y, 1, key, 6), "seeds are equal");
    CHECK(index_hash(&x, 1, key, 6) != index_hash(&x, 2, key, 6), "namespace not in the hash");
    index_destroy(&x);
    index_destroy(&y);
}

int main(void)
{
    RUN(test_grow_keeps_every_key);
    RUN(test_remove_and_reinsert);
    RUN(test_long_keys_differ_in_one_byte);
    RUN(test_namespaces_isolated);
    RUN(test_hash_is_seeded);
    return check_done("test_index");
}
