/*
 * store.c - objects, namespaces, pins and eviction (see store.h).
 *
 * An object is RESERVED (in the index so nobody else writes the key, but
 * invisible to readers and never evicted), then COMMITTED (readable, on the
 * LRU), then UNLINKED (out of the index, LRU and namespace; freed as soon as
 * its last pin goes, kept on the zombie list until then). Object metadata,
 * key copy and chunk list live in one heap block; the store never touches
 * the bytes in the pool.
 *
 * Eviction is a global LRU list (not CLOCK) of committed objects, most
 * recent at the head. Reservations evict from the tail when the allocator is
 * out of room; store_maintain() does the same in the background between two
 * watermarks. Pinned objects are skipped, and reserved ones are not on the
 * list at all. A read's move to the head is deferred (below).
 *
 * A pool file (persist.h) adds headers in the pool: written at
 * reservation, marked by commit, unmarked by unlink, and read back by
 * store_open after a restart. Without one, headers take no room.
 *
 * Locking: one reader-writer lock for the whole store, taken once per batch
 * call. A batch carries up to GK_MAX_KEYS keys, so the lock is paid once per
 * batch rather than per key, and what it covers is pointer and counter
 * updates only: the transports copy object bytes outside it, under a pin or
 * a reservation. Reads (EXISTS, pins, unpins) share it, so the workers'
 * lookups run side by side; everything that links, unlinks, evicts or
 * frees holds it alone (store_lock). Under the shared lock an object's pins
 * and the read counters change atomically, and nothing is unlinked or
 * freed: an unpin that leaves an unlinked object unpinned has it freed
 * under the exclusive lock after (reap_zombies). A read's LRU move needs
 * the list: it goes into a log instead (the touch log), which the next
 * exclusive holder replays before anything else, so every object in the
 * log is still alive then, and eviction sees the order reads made. When
 * reads outrun the log between two exclusive holds, the excess reads just
 * don't move their objects.
 */
#include "store_state.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "common/grow.h"
#include "common/log.h"
#include "disk.h"
#include "gdrkv.h"
#include "persist.h"
#include "uring.h"

/* Objects one batch of reservations may look at while evicting, over all
 * its keys and under one hold of the lock: two per key of the largest
 * batch, about a millisecond of work, so a pool full of pinned or tiny
 * objects can't stall every other client behind the lock; the keys that
 * find no room fail with NO_SPACE. Bigger clean-ups are the background's
 * (store_maintain), which lets go of the lock every STORE_EVICT_ROUND. */
#define STORE_EVICT_SCAN_PER_CALL (2 * GK_MAX_KEYS)
#define STORE_EVICT_ROUND 1024
#define STORE_EVICT_ROUNDS_PER_CALL 256
#define STORE_INDEX_BUCKETS 4096
/* The demoter's batches: one disk write each, at most this much. */
#define DEMOTE_BATCH_OBJECTS 256
#define DEMOTE_BATCH_BYTES (64ull << 20)
#define DEMOTE_SCAN 4096
#define DEMOTE_IDLE_MS 100
/* How long a batch of promotions waits, over all its keys, for another
 * reader's promotion of the same key to commit or for room. */
#define PROMOTE_WAIT_MS 5000

/* The disk tier's half (below), used from the lifecycle and write path. */
static void *demoter_main(void *arg);
static void flush_to_disk(struct store *s);
static void delete_from_disk(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                             uint32_t n, int32_t *status);

/* ----------------------------------------------------------------- locks */

/* Takes the lock alone, and replays the reads' LRU moves first. */
static void store_lock(struct store *s)
{
    pthread_rwlock_wrlock(&s->lock);
    uint32_t n = GK_MIN(s->ntouched, (uint32_t)STORE_TOUCH_LOG);
    for (uint32_t i = 0; i < n; i++)
        dlink_move_head(&s->lru, &s->touched[i]->lru);
    s->ntouched = 0;
}

static void store_lock_shared(struct store *s) { pthread_rwlock_rdlock(&s->lock); }

static void store_unlock(struct store *s) { pthread_rwlock_unlock(&s->lock); }

/* A batch's LRU moves, under the shared lock: into the touch log, whose
 * count is the one word every reader writes, so once per batch. objs[i]
 * may be NULL (a miss). */
static void touch_shared(struct store *s, struct store_obj *const *objs, uint32_t n,
                         uint32_t hits)
{
    uint32_t at = __atomic_fetch_add(&s->ntouched, hits, __ATOMIC_RELAXED);
    if (at >= STORE_TOUCH_LOG || hits > STORE_TOUCH_LOG - at) {
        /* full: the count must not wrap back into the log */
        __atomic_store_n(&s->ntouched, STORE_TOUCH_LOG, __ATOMIC_RELAXED);
        if (at >= STORE_TOUCH_LOG)
            return;
    }
    for (uint32_t i = 0; i < n && at < STORE_TOUCH_LOG; i++) {
        if (objs[i])
            s->touched[at++] = objs[i];
    }
}

/* Wakes the demoter (any lock may be held). */
static void wake_demoter(struct store *s)
{
    pthread_mutex_lock(&s->demote_lock);
    s->demote_kick = 1;
    pthread_cond_signal(&s->demote_wake);
    pthread_mutex_unlock(&s->demote_lock);
}

/* The demoter's sleep, holding no store lock: until woken, or ms. */
static void demoter_sleep(struct store *s, long ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += ms * 1000000l;
    until.tv_sec += until.tv_nsec / 1000000000l;
    until.tv_nsec %= 1000000000l;
    pthread_mutex_lock(&s->demote_lock);
    if (!s->demote_kick)
        pthread_cond_timedwait(&s->demote_wake, &s->demote_lock, &until);
    s->demote_kick = 0;
    pthread_mutex_unlock(&s->demote_lock);
}

/* ------------------------------------------------------------ namespaces */

/* Nothing can be stored under a bad name: reads of it miss, writes to it
 * are invalid. */
int store_ns_name_ok(const struct gk_ns *name)
{
    return name->len <= GK_MAX_NS_LEN && (name->len == 0 || name->name);
}

/* The name bytes of a request's namespace (the default one may come NULL). */
static const uint8_t *ns_bytes(const struct gk_ns *ns)
{
    return ns->len ? ns->name : (const uint8_t *)"";
}

struct store_ns *store_ns_find(struct store *s, const struct gk_ns *name)
{
    /* The default namespace may come with a NULL name; memcmp wants a pointer. */
    const uint8_t *bytes = ns_bytes(name);
    uint64_t hash = index_hash(&s->namespaces, 0, bytes, name->len);
    struct index_node *n = index_find(&s->namespaces, hash, 0, bytes, name->len);
    return n ? CONTAINER_OF(n, struct store_ns, node) : NULL;
}

struct store_ns *store_ns_create(struct store *s, const struct gk_ns *name)
{
    struct store_ns *ns = calloc(1, sizeof *ns + name->len);
    if (!ns)
        return NULL;
    if (name->len)
        memcpy(ns->name, name->name, name->len);
    ns->id = ++s->last_ns_id;
    ns->node.ns_id = 0;
    ns->node.key = ns->name;
    ns->node.key_len = name->len;
    ns->node.hash = index_hash(&s->namespaces, 0, ns->name, name->len);
    index_insert(&s->namespaces, &ns->node);
    dlink_push_head(&s->ns_list, &ns->all);
    dlink_init(&ns->objs);
    s->st.namespaces++;
    return ns;
}

/* A namespace lives exactly as long as it has objects, so client-chosen
 * names can't pile up. Returns whether ns was freed. */
int store_ns_drop_if_empty(struct store *s, struct store_ns *ns)
{
    if (!dlink_empty(&ns->objs))
        return 0;
    index_remove(&s->namespaces, &ns->node);
    dlink_remove(&ns->all);
    free(ns);
    s->st.namespaces--;
    return 1;
}

/* --------------------------------------------------------------- objects */

int store_key_ok(const struct gk_entry *e)
{
    return e->key && e->key_len >= 1 && e->key_len <= GK_MAX_KEY_LEN;
}

/* How many chunks an object of e's size takes, and its head's length (0
 * without a pool file, whose heads hold the piece list, so each depends on
 * the other: the loop settles in two or three rounds). */
uint32_t store_obj_cut(const struct store *s, uint32_t ns_len, const struct gk_entry *e,
                       uint32_t *head_len)
{
    uint32_t n = 1, prev;
    *head_len = 0;
    if (!s->piece_hdr)
        return alloc_nchunks(e->size, 0, 0);
    do {
        prev = n;
        *head_len = persist_head_len(ns_len, e->key_len, n);
        n = alloc_nchunks(e->size, *head_len, s->piece_hdr);
    } while (n != prev);
    return n;
}

uint32_t store_chunk_hdr(const struct store *s, const struct store_obj *o, uint32_t i)
{
    return i == 0 ? o->head_len : s->piece_hdr;
}

static size_t obj_bytes(uint32_t nchunks, uint32_t key_len)
{
    return sizeof(struct store_obj) + nchunks * sizeof(struct store_chunk) + key_len;
}

struct store_obj *store_obj_new(struct store *s, struct store_ns *ns, const struct gk_entry *e,
                                uint32_t nchunks, uint32_t head_len, uint64_t key_hash,
                                struct store_obj *mem)
{
    struct store_obj *o = mem ? mem : malloc(obj_bytes(nchunks, e->key_len));
    if (!o)
        return NULL;
    uint8_t *key = (uint8_t *)(o->chunks + nchunks);
    memcpy(key, e->key, e->key_len);
    o->node.key = key;
    o->node.key_len = e->key_len;
    o->node.ns_id = ns->id;
    o->node.hash = index_hash_in_ns(key_hash, ns->id);
    dlink_init(&o->lru);
    dlink_init(&o->ns_link);
    o->ns = ns;
    o->size = e->size;
    o->pins = 0;
    o->nchunks = 0;
    o->head_len = head_len;
    o->on_disk = 0;
    o->state = OBJ_RESERVED;
    return o;
}

uint64_t store_obj_head_off(const struct store_obj *o) { return o->chunks[0].off - o->head_len; }

static void obj_free(struct store *s, struct store_obj *o)
{
    /* A pool file's head goes with its object, so a restart counts only
     * the writes a kill cut short as dropped. */
    if (s->piece_hdr && o->nchunks)
        persist_forget(s->pool.base, store_obj_head_off(o));
    for (uint32_t i = 0; i < o->nchunks; i++)
        alloc_put(&s->alloc, o->chunks[i].off - store_chunk_hdr(s, o, i));
    free(o);
}

/* The object under e's key in ns; key_hash is index_key_hash of the key. */
static struct store_obj *obj_find(struct store *s, const struct store_ns *ns,
                                  const struct gk_entry *e, uint64_t key_hash)
{
    struct index_node *n = index_find(&s->objects, index_hash_in_ns(key_hash, ns->id), ns->id,
                                      e->key, e->key_len);
    return n ? CONTAINER_OF(n, struct store_obj, node) : NULL;
}

/* The committed object under e's key: 0, GDRKV_E_NOT_FOUND (absent, or
 * still being written) or GDRKV_E_INVALID (bad key). ns may be NULL. */
static int32_t find_committed_hashed(struct store *s, const struct store_ns *ns,
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

static int32_t find_committed(struct store *s, const struct store_ns *ns,
                              const struct gk_entry *e, struct store_obj **out)
{
    uint64_t key_hash = store_key_ok(e) ? index_key_hash(&s->objects, e->key, e->key_len) : 0;
    return find_committed_hashed(s, ns, e, key_hash, out);
}

/* A batch of reads' keys hashed before the lock is taken (the namespace's
 * part, known only under it, is mixed in there), so that the lock covers
 * the lookups alone and each bucket is fetched a few keys ahead of its
 * lookup: with millions of objects, every lookup is a cache miss. */
#define LOOKUP_AHEAD 8
struct lookups {
    uint64_t key_hash[GK_MAX_KEYS];
};

static void hash_keys(struct store *s, struct lookups *l, const struct gk_entry *e, uint32_t n)
{
    assert(n <= GK_MAX_KEYS);       /* a frame's, which the server checked */
    for (uint32_t i = 0; i < n; i++)
        l->key_hash[i] = store_key_ok(&e[i]) ? index_key_hash(&s->objects, e[i].key,
                                                              e[i].key_len) : 0;
}

/* While key i of a batch is looked up, fetches the bucket of key i +
 * LOOKUP_AHEAD and the first node in the bucket of key i + LOOKUP_AHEAD /
 * 2 (fetched that many keys ago): with millions of objects each is a
 * cache miss: a PUT of 256 x 4 KiB into a store of 2 million objects
 * took 369-400 us without these fetches and 233-276 us with them, the
 * same 205 us either way into an empty store (2-core VM,
 * docs/benchmarks.md, session 15). */
static void prefetch_ahead(struct store *s, const struct store_ns *ns, const uint64_t *key_hash,
                           uint32_t i, uint32_t n)
{
    if (!ns)
        return;
    if (i + LOOKUP_AHEAD < n)
        index_prefetch(&s->objects, index_hash_in_ns(key_hash[i + LOOKUP_AHEAD], ns->id));
    if (i + LOOKUP_AHEAD / 2 < n)
        index_prefetch_chain(&s->objects,
                             index_hash_in_ns(key_hash[i + LOOKUP_AHEAD / 2], ns->id));
}

/* find_committed of key i of the batch, fetching ahead meanwhile. */
static int32_t find_hashed(struct store *s, const struct store_ns *ns, const struct lookups *l,
                           const struct gk_entry *e, uint32_t i, uint32_t n,
                           struct store_obj **out)
{
    prefetch_ahead(s, ns, l->key_hash, i, n);
    return find_committed_hashed(s, ns, &e[i], l->key_hash[i], out);
}

/* Makes a reserved object readable (in memory: the caller marks a pool
 * file's head). */
static void obj_commit(struct store *s, struct store_obj *o)
{
    assert(o->state == OBJ_RESERVED);
    o->state = OBJ_COMMITTED;
    dlink_push_head(&s->lru, &o->lru);
    o->ns->objects++;
    o->ns->bytes += o->size;
    s->st.reserved_objects--;
    s->st.objects++;
    s->st.object_bytes += o->size;
}

/* Takes o out of the index, the LRU and its namespace, and frees it unless
 * it is pinned. The namespace is left for the caller to drop, since callers
 * walking a namespace still need it. */
static void obj_unlink(struct store *s, struct store_obj *o)
{
    assert(o->state != OBJ_UNLINKED);
    index_remove(&s->objects, &o->node);
    dlink_remove(&o->ns_link);
    if (o->state == OBJ_COMMITTED) {
        /* Before anything else may reuse the key or the chunks. */
        if (s->piece_hdr)
            persist_uncommit(s->pool.base, store_obj_head_off(o));
        dlink_remove(&o->lru);
        o->ns->objects--;
        o->ns->bytes -= o->size;
        s->st.objects--;
        s->st.object_bytes -= o->size;
    } else {
        s->st.reserved_objects--;
    }
    o->state = OBJ_UNLINKED;
    o->ns = NULL;
    if (o->pins)
        dlink_push_head(&s->zombies, &o->ns_link);
    else
        obj_free(s, o);
}

/* Unlinks o and drops its namespace if that emptied it. */
static void obj_unlink_dropping_ns(struct store *s, struct store_obj *o)
{
    struct store_ns *ns = o->ns;
    obj_unlink(s, o);
    store_ns_drop_if_empty(s, ns);
}

/* Pins o (under either lock): whether it was unpinned. Callers under the
 * shared lock count those into st.pinned_objects once per batch: a word
 * every reader wrote per key would cost more than the lookups. */
static int obj_pin_first(struct store_obj *o)
{
    return __atomic_fetch_add(&o->pins, 1, __ATOMIC_RELAXED) == 0;
}

/* Lets a pin go (under either lock): whether it was the last. */
static int obj_unpin_last(struct store_obj *o)
{
    uint32_t left = __atomic_sub_fetch(&o->pins, 1, __ATOMIC_RELAXED);
    assert(left != UINT32_MAX);
    return left == 0;
}

/* Under the exclusive lock. */
static void obj_pin(struct store *s, struct store_obj *o)
{
    s->st.pinned_objects += (uint64_t)obj_pin_first(o);
}

static void obj_unpin(struct store *s, struct store_obj *o)
{
    if (!obj_unpin_last(o))
        return;
    s->st.pinned_objects--;
    if (o->state == OBJ_UNLINKED) {
        dlink_remove(&o->ns_link);
        obj_free(s, o);
    }
}

/* Frees the unlinked objects whose last pin went under the shared lock:
 * under the exclusive lock. */
static void reap_zombies(struct store *s)
{
    for (struct dlink *l = s->zombies.next, *next; l != &s->zombies; l = next) {
        next = l->next;
        struct store_obj *o = CONTAINER_OF(l, struct store_obj, ns_link);
        if (o->pins == 0) {
            dlink_remove(l);
            obj_free(s, o);
        }
    }
}

/* -------------------------------------------------------------- eviction */

/* Evicts an unpinned committed object; with a disk tier, counts whether it
 * has a copy there. */
static void evict(struct store *s, struct store_obj *o)
{
    s->st.evictions++;
    s->st.evicted_bytes += o->size;
    if (s->disk && o->on_disk) {
        s->st.demotions++;
        s->st.demoted_bytes += o->size;
    } else if (s->disk) {
        s->st.evicted_not_on_disk++;
    }
    obj_unlink_dropping_ns(s, o);
}

/* With a disk tier, the coldest unpinned object that has a copy on disk,
 * among the CLEAN_SCAN coldest: evicting it loses nothing. NULL when there
 * is none; the demoter is then woken to write some. */
#define CLEAN_SCAN 64
static struct store_obj *coldest_clean(struct store *s, uint32_t *scan_left, uint32_t scan)
{
    struct dlink *l = s->lru.prev;
    for (uint32_t i = 0; i < scan && *scan_left > 0 && l != &s->lru; i++, l = l->prev) {
        (*scan_left)--;
        struct store_obj *o = CONTAINER_OF(l, struct store_obj, lru);
        if (!o->pins && o->on_disk)
            return o;
    }
    wake_demoter(s);
    return NULL;
}

/*
 * Evicts the least recently used unpinned object, looking at no more than
 * *scan_left objects over the caller's whole run. A pinned object found at
 * the tail is being read right now, which is a use: it moves to the head so
 * later scans don't trip over it again. Returns whether one was evicted.
 * clean_only (a promotion's room): only an object with a copy on disk,
 * sought over the whole budget; a read never costs another object its bytes.
 */
static int evict_lru(struct store *s, uint32_t *scan_left, int clean_only)
{
    struct store_obj *clean =
        s->disk ? coldest_clean(s, scan_left, clean_only ? *scan_left : CLEAN_SCAN) : NULL;
    if (clean || clean_only) {
        if (clean)
            evict(s, clean);
        return clean != NULL;
    }
    /* The LRU holds exactly the st.objects committed objects: once that
     * many were skipped, every one of them is pinned. */
    uint64_t skipped = 0;
    while (*scan_left > 0 && skipped < s->st.objects) {
        (*scan_left)--;
        struct dlink *tail = s->lru.prev;
        struct store_obj *o = CONTAINER_OF(tail, struct store_obj, lru);
        if (o->pins) {
            dlink_move_head(&s->lru, tail);
            skipped++;
            continue;
        }
        evict(s, o);
        return 1;
    }
    return 0;
}

/* A pool file's headers of a reserved object that has all its chunks:
 * the pieces', then the head that lists them (uncommitted). */
static void write_headers(struct store *s, const struct store_obj *o)
{
    uint8_t *pool = s->pool.base;
    uint64_t head = store_obj_head_off(o);
    uint8_t *offs = persist_head_offsets(pool, head);
    for (uint32_t i = 1; i < o->nchunks; i++) {
        uint64_t piece = o->chunks[i].off - s->piece_hdr;
        persist_write_piece(pool, piece, head, i);
        gk_store64(offs + 8ull * (i - 1), piece);
    }
    struct persist_head h = {
        .size = o->size, .head_len = o->head_len, .npieces = o->nchunks,
        .ns = o->ns->name, .ns_len = o->ns->node.key_len,
        .key = o->node.key, .key_len = o->node.key_len,
        .piece_offs = offs,
    };
    persist_write_head(pool, head, &h);
}

/* Gives o all its chunks, evicting while the allocator is out of room,
 * within the batch's *scan_left. On failure o keeps the chunks it got
 * (o->nchunks) for obj_unlink to free. */
static int fill_chunks(struct store *s, struct store_obj *o, uint32_t *scan_left, int clean_only)
{
    uint32_t want = alloc_nchunks(o->size, o->head_len, s->piece_hdr);
    while (o->nchunks < want) {
        uint32_t hdr = store_chunk_hdr(s, o, o->nchunks);
        uint64_t len = alloc_piece_len(o->size, o->head_len, s->piece_hdr, o->nchunks), off;
        if (alloc_get(&s->alloc, hdr + len, &off) == 0)
            o->chunks[o->nchunks++] = (struct store_chunk){off + hdr, len};
        else if (!evict_lru(s, scan_left, clean_only))
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------------- lifecycle */

static int open_disk(struct store *s, const struct store_opts *opts, char *err, size_t errlen)
{
    struct disk_opts o = {.paths = opts->disk_paths, .npaths = opts->disk_npaths,
                          .bytes_per_path = opts->disk_bytes_per_path, .reset = opts->reset_disk};
    if (disk_open(&s->disk, &o, err, errlen) != 0)
        return -1;
    int rc = pthread_create(&s->demoter, NULL, demoter_main, s);
    if (rc) {
        snprintf(err, errlen, "cannot start the disk tier's demoter: %s", strerror(rc));
        return -1;
    }
    s->demoter_running = 1;
    return 0;
}


int store_open(struct store **out, const struct store_opts *opts, char *err, size_t errlen)
{
    *out = NULL;
    uint64_t capacity = opts->memory_bytes / ALLOC_PAGE_SIZE * ALLOC_PAGE_SIZE;
    if (capacity == 0) {
        snprintf(err, errlen, "pool memory must be at least %u MiB", ALLOC_PAGE_SIZE >> 20);
        return GDRKV_E_INVALID;
    }
    /* Written so that NaN fails too. */
    if (!(opts->low_watermark > 0 && opts->low_watermark <= opts->high_watermark &&
          opts->high_watermark <= 1)) {
        snprintf(err, errlen, "watermarks must satisfy 0 < low (%g) <= high (%g) <= 1",
                 opts->low_watermark, opts->high_watermark);
        return GDRKV_E_INVALID;
    }

    struct store *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return GDRKV_E_INTERNAL;
    }
    /* Writers first: a steady stream of reads must not starve them. */
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&s->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    pthread_mutex_init(&s->demote_lock, NULL);
    pthread_cond_init(&s->demote_wake, NULL);
    dlink_init(&s->ns_list);
    dlink_init(&s->lru);
    dlink_init(&s->zombies);
    s->pool.fd = s->pool.share_fd = -1;
    s->touched = malloc(STORE_TOUCH_LOG * sizeof *s->touched);
    if (!s->touched || alloc_init(&s->alloc, capacity) != 0 ||
        index_init(&s->objects, STORE_INDEX_BUCKETS) != 0 ||
        index_init(&s->namespaces, 0) != 0) {
        snprintf(err, errlen, "out of memory for the store's bookkeeping");
        store_close(s);
        return GDRKV_E_INTERNAL;
    }
    struct pool_opts po = {
        .size = capacity,
        .path = opts->pool_file,
        .file_len = persist_meta_off(capacity) + persist_meta_len(capacity),
        .reset = opts->reset_pool_file,
        .hugepages = opts->hugepages,
        .pretouch = opts->pretouch,
        .writable_share = opts->writable_share,
    };
    if (pool_open(&s->pool, &po, err, errlen) != 0 ||
        (opts->pool_file && store_attach_pool_file(s, opts->pool_file, err, errlen) != 0)) {
        store_close(s);
        return GDRKV_E_INTERNAL;
    }
    s->high_bytes = (uint64_t)(opts->high_watermark * (double)capacity);
    s->low_bytes = (uint64_t)(opts->low_watermark * (double)capacity);
    s->st.pool_bytes = capacity;
    s->st.hugepages = s->pool.hugepages;
    if (opts->disk_npaths && open_disk(s, opts, err, errlen) != 0) {
        store_close(s);
        return GDRKV_E_INVALID;
    }
    *out = s;
    return 0;
}

/* Frees the objects of a list linked through ns_link, without giving their
 * chunks back: the allocator and the pool go next. */
static void free_obj_list(struct dlink *list)
{
    while (!dlink_empty(list)) {
        struct dlink *l = list->next;
        dlink_remove(l);
        free(CONTAINER_OF(l, struct store_obj, ns_link));
    }
}

/* Frees everything, pinned objects included. */
void store_close(struct store *s)
{
    if (!s)
        return;
    if (s->demoter_running) {
        store_lock(s);
        s->stopping = 1;
        store_unlock(s);
        wake_demoter(s);
        pthread_join(s->demoter, NULL);
        flush_to_disk(s);
    }
    disk_close(s->disk);
    while (!dlink_empty(&s->ns_list)) {
        struct store_ns *ns = CONTAINER_OF(s->ns_list.next, struct store_ns, all);
        free_obj_list(&ns->objs);
        dlink_remove(&ns->all);
        free(ns);
    }
    free_obj_list(&s->zombies);
    index_destroy(&s->objects);
    index_destroy(&s->namespaces);
    alloc_destroy(&s->alloc);
    pool_close(&s->pool);
    free(s->touched);
    pthread_cond_destroy(&s->demote_wake);
    pthread_mutex_destroy(&s->demote_lock);
    pthread_rwlock_destroy(&s->lock);
    free(s);
}

uint8_t *store_base(struct store *s) { return s->pool.base; }
uint64_t store_capacity(struct store *s) { return alloc_capacity(&s->alloc); }
uint64_t store_page_size(void) { return ALLOC_PAGE_SIZE; }
int store_pool_fd(struct store *s) { return s->pool.share_fd; }

const struct store_chunk *store_obj_chunks(const struct store_obj *o, uint32_t *nchunks)
{
    /* An empty object in a pool file has a chunk for its head alone. */
    *nchunks = o->size ? o->nchunks : 0;
    return o->chunks;
}

uint64_t store_obj_size(const struct store_obj *o) { return o->size; }

/* ------------------------------------------------------------ read path */

void store_pin_batch(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                     uint32_t n, int touch, struct store_obj **objs, int32_t *status,
                     uint64_t *sizes)
{
    struct lookups l;
    uint32_t hits = 0, first_pins = 0;
    hash_keys(s, &l, e, n);
    store_lock_shared(s);
    struct store_ns *space = store_ns_name_ok(ns) ? store_ns_find(s, ns) : NULL;
    for (uint32_t i = 0; i < n; i++) {
        struct store_obj *o;
        status[i] = find_hashed(s, space, &l, e, i, n, &o);
        objs[i] = o;
        sizes[i] = o ? o->size : 0;
        if (!o)
            continue;
        hits++;
        first_pins += (uint32_t)obj_pin_first(o);
    }
    if (touch && hits)
        touch_shared(s, objs, n, hits);
    __atomic_add_fetch(&s->st.pinned_objects, first_pins, __ATOMIC_RELAXED);
    __atomic_add_fetch(&s->st.hits, hits, __ATOMIC_RELAXED);
    __atomic_add_fetch(&s->st.misses, n - hits, __ATOMIC_RELAXED);
    store_unlock(s);
}

void store_unpin_batch(struct store *s, struct store_obj **objs, uint32_t n)
{
    int reap = 0;
    uint32_t last_pins = 0;
    store_lock_shared(s);
    for (uint32_t i = 0; i < n; i++) {
        if (objs[i] && obj_unpin_last(objs[i])) {
            last_pins++;
            reap |= objs[i]->state == OBJ_UNLINKED;
        }
    }
    __atomic_sub_fetch(&s->st.pinned_objects, last_pins, __ATOMIC_RELAXED);
    store_unlock(s);
    if (reap) {
        store_lock(s);
        reap_zombies(s);
        store_unlock(s);
    }
}

void store_exists_batch(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                        uint32_t n, int32_t *status, uint64_t *sizes)
{
    struct lookups l;
    hash_keys(s, &l, e, n);
    store_lock_shared(s);
    struct store_ns *space = store_ns_name_ok(ns) ? store_ns_find(s, ns) : NULL;
    for (uint32_t i = 0; i < n; i++) {
        struct store_obj *o;
        status[i] = find_hashed(s, space, &l, e, i, n, &o);
        sizes[i] = o ? o->size : 0;
        if (status[i] == GDRKV_E_NOT_FOUND && s->disk && store_ns_name_ok(ns) &&
            disk_contains(s->disk, ns_bytes(ns), ns->len, e[i].key, e[i].key_len, &sizes[i]))
            status[i] = 0;
    }
    store_unlock(s);
}

/* ----------------------------------------------------------- write path */

/* One entry of store_reserve_batch. *space is the batch's namespace, created
 * on first use and reset to NULL when a failure dropped it. */
/* Whether o was reserved by one of the batch's first n entries. */
static int reserved_by(struct store_obj *const *objs, uint32_t n, const struct store_obj *o)
{
    for (uint32_t i = 0; i < n; i++) {
        if (objs[i] == o)
            return 1;
    }
    return 0;
}

/* Reserves entry i of a batch into objs[i], evicting within *scan_left
 * (only objects on disk with clean_only: evict_lru). key_hash is
 * index_key_hash of e's key; *mem, when not NULL, is memory for the object
 * (obj_bytes), allocated before the lock was taken: NULL once it is used. */
static int32_t reserve_one(struct store *s, const struct gk_ns *ns, struct store_ns **space,
                           const struct gk_entry *e, uint64_t key_hash, struct store_obj **mem,
                           struct store_obj **objs, uint32_t i, uint32_t *scan_left,
                           int clean_only)
{
    struct store_obj *found;

    uint32_t head_len, nchunks;

    if (!store_key_ok(e))
        return GDRKV_E_INVALID;
    if (e->size > GK_MAX_OBJECT)
        return GDRKV_E_TOO_LARGE;
    nchunks = store_obj_cut(s, ns->len, e, &head_len);
    if (alloc_footprint(&s->alloc, e->size, head_len, s->piece_hdr) > alloc_capacity(&s->alloc))
        return GDRKV_E_TOO_LARGE;
    if (!*space && !(*space = store_ns_create(s, ns)))
        return GDRKV_E_INTERNAL;
    if ((found = obj_find(s, *space, e, key_hash))) {
        /* Another writer's reservation is not a stored object yet: that
         * writer may still abort, so only its own batch may count it. */
        if (found->state == OBJ_RESERVED && !reserved_by(objs, i, found))
            return GDRKV_E_BUSY;
        if (!clean_only)            /* a promotion is no PUT */
            s->st.put_dedup++;
        return STORE_PRESENT;
    }

    struct store_obj *o = store_obj_new(s, *space, e, nchunks, head_len, key_hash, *mem);
    *mem = NULL;
    if (!o) {
        if (store_ns_drop_if_empty(s, *space))
            *space = NULL;
        return GDRKV_E_INTERNAL;
    }
    /* Linked before any eviction runs, so the key is taken and the
     * namespace can't be emptied and freed under us. */
    index_insert(&s->objects, &o->node);
    dlink_push_head(&(*space)->objs, &o->ns_link);
    s->st.reserved_objects++;
    if (fill_chunks(s, o, scan_left, clean_only) != 0) {
        obj_unlink(s, o);
        if (store_ns_drop_if_empty(s, *space))
            *space = NULL;
        if (!clean_only)            /* a promotion is no PUT */
            s->st.put_no_space++;
        return GDRKV_E_NO_SPACE;
    }
    objs[i] = o;
    return 0;
}

/* What a batch of reservations can do before the lock is taken: hash the
 * keys and allocate the objects' memory (what a key already stored leaves
 * unused is freed after), so that the lock covers the index and the
 * allocator alone. */
struct reserve_prep {
    uint64_t key_hash[GK_MAX_KEYS];
    struct store_obj *mem[GK_MAX_KEYS];
};

static void prepare_reserve(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                            uint32_t n, struct reserve_prep *p)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t head_len;
        int ok = store_key_ok(&e[i]) && e[i].size <= GK_MAX_OBJECT;
        p->key_hash[i] = ok ? index_key_hash(&s->objects, e[i].key, e[i].key_len) : 0;
        /* NULL (out of memory) is allocated again under the lock */
        p->mem[i] = ok ? malloc(obj_bytes(store_obj_cut(s, ns->len, &e[i], &head_len),
                                          e[i].key_len))
                       : NULL;
    }
}

void store_reserve_batch(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                         uint32_t n, struct store_obj **objs, int32_t *status)
{
    uint32_t scan_left = STORE_EVICT_SCAN_PER_CALL;
    int name_ok = store_ns_name_ok(ns);
    struct reserve_prep prep;
    if (name_ok)
        prepare_reserve(s, ns, e, n, &prep);
    store_lock(s);
    struct store_ns *space = name_ok ? store_ns_find(s, ns) : NULL;
    for (uint32_t i = 0; i < n; i++) {
        prefetch_ahead(s, space, prep.key_hash, i, n);
        objs[i] = NULL;
        status[i] = name_ok ? reserve_one(s, ns, &space, &e[i], prep.key_hash[i], &prep.mem[i],
                                          objs, i, &scan_left, 0)
                            : GDRKV_E_INVALID;
    }
    store_unlock(s);
    for (uint32_t i = 0; name_ok && i < n; i++)
        free(prep.mem[i]);
    /* Outside the lock: a reservation is its writer's alone (nothing evicts
     * or frees it), and nobody reads headers but a restart. */
    for (uint32_t i = 0; s->piece_hdr && i < n; i++) {
        if (objs[i])
            write_headers(s, objs[i]);
    }
}

void store_commit_batch(struct store *s, struct store_obj **objs, uint32_t n)
{
    store_lock(s);
    for (uint32_t i = 0; i < n; i++) {
        if (!objs[i])
            continue;
        obj_commit(s, objs[i]);
        if (s->piece_hdr)
            persist_commit(s->pool.base, store_obj_head_off(objs[i]), ++s->commit_seq);
        s->st.puts++;
    }
    store_unlock(s);
}

void store_abort_batch(struct store *s, struct store_obj **objs, uint32_t n)
{
    store_lock(s);
    for (uint32_t i = 0; i < n; i++) {
        if (!objs[i])
            continue;
        assert(objs[i]->state == OBJ_RESERVED);
        obj_unlink_dropping_ns(s, objs[i]);
    }
    store_unlock(s);
}

void store_delete_batch(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                        uint32_t n, int32_t *status)
{
    /* Hashed before the lock and fetched ahead, as reads are: a server
     * churning 4 KiB PUTs and deletes spent 13.8% of its CPU in the
     * deletes' lookups (docs/benchmarks.md, session 17). */
    struct lookups l;
    hash_keys(s, &l, e, n);
    store_lock(s);
    struct store_ns *space = store_ns_name_ok(ns) ? store_ns_find(s, ns) : NULL;
    for (uint32_t i = 0; i < n; i++) {
        struct store_obj *o;
        status[i] = find_hashed(s, space, &l, e, i, n, &o);
        if (o) {
            obj_unlink(s, o);
            s->st.deletes++;
        }
    }
    if (space)
        store_ns_drop_if_empty(s, space);
    store_unlock(s);
    delete_from_disk(s, ns, e, n, status);
}

uint64_t store_clear_ns(struct store *s, const struct gk_ns *ns)
{
    uint64_t cleared = 0;
    store_lock(s);
    struct store_ns *space = store_ns_name_ok(ns) ? store_ns_find(s, ns) : NULL;
    if (space) {
        struct dlink *l = space->objs.next;
        while (l != &space->objs) {
            struct store_obj *o = CONTAINER_OF(l, struct store_obj, ns_link);
            l = l->next;
            if (o->state == OBJ_COMMITTED) {
                /* one on disk too is counted there */
                cleared += !(s->disk && o->on_disk);
                obj_unlink(s, o);
            }
        }
        s->st.deletes += cleared;
        store_ns_drop_if_empty(s, space);
    }
    store_unlock(s);
    if (s->disk && store_ns_name_ok(ns)) {
        uint64_t on_disk = disk_clear_ns(s->disk, ns_bytes(ns), ns->len);
        store_lock(s);
        s->st.deletes += on_disk;
        wake_demoter(s);
        store_unlock(s);
        cleared += on_disk;
    }
    return cleared;
}

/* ------------------------------------------------------------ disk tier
 *
 * The demoter thread keeps the pool between its watermarks when there is a
 * disk tier: it pins a batch of the coldest objects, writes them to disk
 * outside the lock (their bytes can't change: committed objects are
 * immutable and pinned ones stay put), then evicts those nobody pinned
 * meanwhile. An object already on disk (promoted earlier) is evicted
 * without a write. Reservations that find the pool full still evict at
 * once, and what they evict before the demoter reached it is lost
 * (evicted_not_on_disk).
 */

/* A demotion batch: the objects, and copies of their namespaces' names
 * (a namespace may be freed while the write runs, its objects deleted). */
struct demotion {
    struct store_obj *objs[DEMOTE_BATCH_OBJECTS];
    uint8_t ns[DEMOTE_BATCH_OBJECTS][GK_MAX_NS_LEN];
    uint32_t ns_len[DEMOTE_BATCH_OBJECTS];
    struct disk_item items[DEMOTE_BATCH_OBJECTS];
    int32_t status[DEMOTE_BATCH_OBJECTS];
    struct iovec *iov;
    uint32_t iov_cap;
    uint32_t n;
    int evicting;               /* the batch is evicted once written (draining) */
    /* Objects deleted while their write ran: u32 ns_len, ns, u32 key_len,
     * key, back to back; their copies on disk go too. */
    uint8_t *dead;
    size_t dead_cap, dead_len;
};

/* Adds o to the batch, with a copy of its namespace's name. */
static void batch_add(struct demotion *b, struct store_obj *o)
{
    b->ns_len[b->n] = o->ns->node.key_len;
    memcpy(b->ns[b->n], o->ns->name, o->ns->node.key_len);
    b->objs[b->n++] = o;
}

/* Takes the batch from the LRU's cold end, under lock. Draining (above the
 * high watermark, down to the low one), objects on disk already (or too
 * big for it) are evicted at once and the others pinned for the write;
 * otherwise the coldest (capacity - low watermark) bytes are cleaned:
 * written to disk and kept, so that a burst of writes can evict them
 * without losing them. */
static void pick_cold(struct store *s, struct demotion *b, int draining)
{
    uint64_t bytes = 0, seen = 0;
    uint64_t window = draining ? UINT64_MAX : alloc_capacity(&s->alloc) - s->low_bytes;
    uint32_t scanned = 0;
    struct dlink *l = s->lru.prev;
    b->n = 0;
    b->evicting = draining;
    while (l != &s->lru && scanned++ < DEMOTE_SCAN && b->n < DEMOTE_BATCH_OBJECTS &&
           bytes < DEMOTE_BATCH_BYTES && seen < window &&
           (!draining || s->alloc.used_bytes - bytes > s->low_bytes)) {
        struct store_obj *o = CONTAINER_OF(l, struct store_obj, lru);
        l = l->prev;
        seen += o->size;
        if (o->pins)
            continue;
        if (o->on_disk || o->size > disk_max_value(s->disk)) {
            if (draining)
                evict(s, o);
            continue;
        }
        obj_pin(s, o);
        batch_add(b, o);
        bytes += o->size;
    }
}

/* Fills iov with where o's value bytes are in the pool; returns how many
 * pieces (store_obj_chunks' count: none for an empty value). */
static uint32_t obj_iov(const struct store *s, const struct store_obj *o, struct iovec *iov)
{
    uint32_t n;
    const struct store_chunk *c = store_obj_chunks(o, &n);
    for (uint32_t k = 0; k < n; k++)
        iov[k] = (struct iovec){s->pool.base + c[k].off, c[k].len};
    return n;
}

/* The batch's disk items, pointing at the objects' chunks in the pool. */
static int describe(struct store *s, struct demotion *b)
{
    uint32_t pieces = 0;
    for (uint32_t i = 0; i < b->n; i++)
        pieces += b->objs[i]->nchunks;
    if (gk_grow(&b->iov, &b->iov_cap, pieces, sizeof *b->iov, 1024) != 0)
        return -1;
    struct iovec *iov = b->iov;
    for (uint32_t i = 0; i < b->n; i++) {
        struct store_obj *o = b->objs[i];
        uint32_t n = obj_iov(s, o, iov);
        b->items[i] = (struct disk_item){.ns = b->ns[i], .ns_len = b->ns_len[i],
                                         .key = o->node.key, .key_len = o->node.key_len,
                                         .iov = iov, .iovcnt = n, .size = o->size};
        iov += n;
    }
    return 0;
}

/* After the write, under lock: evicts what nobody else pinned meanwhile,
 * and notes the objects deleted during the write (b->dead). */
static void settle(struct store *s, struct demotion *b)
{
    b->dead_len = 0;
    for (uint32_t i = 0; i < b->n; i++) {
        struct store_obj *o = b->objs[i];
        if (b->status[i] == 0)
            o->on_disk = 1;
        uint32_t key_len = o->node.key_len;
        size_t need = b->dead_len + 8 + b->ns_len[i] + key_len;
        if (o->state == OBJ_UNLINKED && b->status[i] == 0 &&
            gk_buf_reserve(&b->dead, &b->dead_cap, need) == 0) {
            uint8_t *p = b->dead + b->dead_len;
            gk_store32(p, b->ns_len[i]);
            memcpy(p + 4, b->ns[i], b->ns_len[i]);
            gk_store32(p + 4 + b->ns_len[i], key_len);
            memcpy(p + 8 + b->ns_len[i], o->node.key, key_len);
            b->dead_len = need;
        }
        int cold = b->evicting && o->state == OBJ_COMMITTED && o->pins == 1 &&
                   s->alloc.used_bytes > s->low_bytes;
        obj_unpin(s, o);
        if (cold)
            evict(s, o);
    }
}

static void delete_dead(struct store *s, const struct demotion *b)
{
    for (size_t at = 0; at < b->dead_len;) {
        const uint8_t *p = b->dead + at;
        uint32_t ns_len = gk_load32(p), key_len = gk_load32(p + 4 + ns_len);
        disk_delete(s->disk, p + 4, ns_len, p + 8 + ns_len, key_len);
        at += 8 + ns_len + key_len;
    }
}

static void *demoter_main(void *arg)
{
    struct store *s = arg;
    struct demotion *b = calloc(1, sizeof *b);
    store_lock(s);
    while (b && !s->stopping) {
        /* Deletes first: their records must not outlive a restart. */
        store_unlock(s);
        disk_bury(s->disk);
        store_lock(s);
        if (s->alloc.used_bytes > s->high_bytes)
            s->draining = 1;
        if (s->alloc.used_bytes <= s->low_bytes)
            s->draining = 0;
        pick_cold(s, b, s->draining);
        if (b->n == 0) {
            store_unlock(s);
            demoter_sleep(s, DEMOTE_IDLE_MS);
            store_lock(s);
            continue;
        }
        int described = describe(s, b) == 0;
        store_unlock(s);
        if (described)
            disk_put_batch(s->disk, b->items, b->n, b->status);
        else
            for (uint32_t i = 0; i < b->n; i++)
                b->status[i] = GDRKV_E_INTERNAL;
        store_lock(s);
        settle(s, b);
        if (b->dead_len) {
            store_unlock(s);
            delete_dead(s, b);
            store_lock(s);
        }
    }
    store_unlock(s);
    if (b) {
        free(b->iov);
        free(b->dead);
    }
    free(b);
    return NULL;
}

/* At close, without a pool file to keep them: every object not on disk
 * yet is written there, so a stopped server's successor finds the whole
 * cache (a killed one's finds what was on disk). */
static void flush_to_disk(struct store *s)
{
    struct demotion *b = calloc(1, sizeof *b);
    uint64_t start = gk_now_ns(), written = 0;
    if (!b || s->piece_hdr) {
        free(b);
        return;
    }
    for (;;) {
        b->n = 0;
        b->evicting = 0;
        for (struct dlink *l = s->lru.prev; l != &s->lru && b->n < DEMOTE_BATCH_OBJECTS;
             l = l->prev) {
            struct store_obj *o = CONTAINER_OF(l, struct store_obj, lru);
            if (o->on_disk || o->size > disk_max_value(s->disk))
                continue;
            o->on_disk = 1;     /* picked: not again, whatever the write does */
            batch_add(b, o);
        }
        if (b->n == 0 || describe(s, b) != 0)
            break;
        disk_put_batch(s->disk, b->items, b->n, b->status);
        for (uint32_t i = 0; i < b->n; i++)
            written += b->status[i] == 0;
    }
    if (written)
        GK_INFO("disk: %llu objects written at close in %llu ms", (unsigned long long)written,
                (unsigned long long)((gk_now_ns() - start) / 1000000));
    free(b->iov);
    free(b->dead);
    free(b);
}

int store_has_disk(struct store *s) { return s->disk != NULL; }

int store_disk_reads_overlap(struct store *s) { return s->disk && uring_available(); }

int store_hold_batch(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                     uint32_t n, struct store_obj **held)
{
    int any = 0;
    uint32_t first_pins = 0;
    uint64_t size;
    for (uint32_t i = 0; i < n; i++)
        held[i] = NULL;
    if (!s->disk || !store_ns_name_ok(ns))
        return 0;
    store_lock_shared(s);
    struct store_ns *space = store_ns_find(s, ns);
    for (uint32_t i = 0; i < n; i++) {
        if (find_committed(s, space, &e[i], &held[i]) == 0)
            first_pins += (uint32_t)obj_pin_first(held[i]);
        else
            any |= store_key_ok(&e[i]) &&
                   disk_contains(s->disk, ns_bytes(ns), ns->len, e[i].key, e[i].key_len, &size);
    }
    __atomic_add_fetch(&s->st.pinned_objects, first_pins, __ATOMIC_RELAXED);
    store_unlock(s);
    return any;
}

/* A key being promoted: where it is on disk, the reservation it is read
 * into, and that reservation's chunks. */
struct promotion {
    struct disk_loc loc;
    struct store_obj *o;
    struct iovec *iov;
};

/* Pins e's committed object into *held, if the pool has it: under lock. */
static void hold_present(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                         struct store_obj **held)
{
    struct store_obj *o;
    if (find_committed(s, store_ns_find(s, ns), e, &o) == 0) {
        obj_pin(s, o);
        *held = o;
    }
}

/* Holds e's record on disk and reserves room for it in the pool (only by
 * evicting objects that are on disk too): 0, or -1 with nothing held (and
 * the key pinned into *held if another reader brought it back first). */
static int promote_start(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                         struct promotion *p, struct store_obj **held, uint64_t deadline_ns)
{
    p->o = NULL;
    if (disk_lookup(s->disk, ns_bytes(ns), ns->len, e->key, e->key_len, &p->loc) != 0)
        return -1;
    struct gk_entry entry = {.key = e->key, .key_len = e->key_len, .size = p->loc.size};
    int32_t st;
    /* Another reader promoting the same key (or a writer writing it) holds
     * a reservation: wait for its commit, so that this reader finds the
     * key too (two TP ranks read the same MLA page at once). No object in
     * the pool has a copy on disk to make room (a restart's pool file
     * holds none yet, a burst of writes is not written yet): wait for the
     * demoter to write some. Anything else (the key is back, or will
     * never fit): nothing to do. */
    for (;;) {
        uint32_t scan_left = STORE_EVICT_SCAN_PER_CALL;
        store_lock(s);
        struct store_ns *space = store_ns_find(s, ns);
        struct store_obj *no_mem = NULL;
        st = reserve_one(s, ns, &space, &entry, index_key_hash(&s->objects, e->key, e->key_len),
                         &no_mem, &p->o, 0, &scan_left, 1);
        if (st == STORE_PRESENT)
            hold_present(s, ns, e, held);
        store_unlock(s);
        if ((st != GDRKV_E_BUSY && st != GDRKV_E_NO_SPACE) || gk_now_ns() >= deadline_ns)
            break;
        if (st == GDRKV_E_NO_SPACE)
            wake_demoter(s);
        usleep(1000);
    }
    p->iov = st == 0 ? malloc((p->o->nchunks ? p->o->nchunks : 1) * sizeof *p->iov) : NULL;
    if (st == 0 && !p->iov) {
        store_lock(s);
        obj_unlink_dropping_ns(s, p->o);
        store_unlock(s);
    }
    if (!p->iov) {
        disk_release(s->disk, &p->loc);
        return -1;
    }
    if (s->piece_hdr)
        write_headers(s, p->o);
    return 0;
}

/* Commits a promotion whose read succeeded (rc 0), pinned into *held,
 * else takes its reservation back: whether the object is in the pool now. */
static int promote_finish(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                          struct promotion *p, int rc, struct store_obj **held)
{
    struct store_obj *o = p->o;
    uint64_t size;
    disk_release(s->disk, &p->loc);
    free(p->iov);
    store_lock(s);
    /* Deleted from disk while it was read: it stays deleted. */
    if (rc == 0 && disk_contains(s->disk, ns_bytes(ns), ns->len, e->key, e->key_len, &size)) {
        obj_commit(s, o);
        obj_pin(s, o);
        *held = o;
        o->on_disk = 1;
        if (s->piece_hdr)
            persist_commit(s->pool.base, store_obj_head_off(o), ++s->commit_seq);
        s->st.promotions++;
        s->st.promoted_bytes += o->size;
    } else {
        obj_unlink_dropping_ns(s, o);
        rc = GDRKV_E_NOT_FOUND;
    }
    store_unlock(s);
    return rc == 0;
}

/* The keys' records are read side by side (disk_read_batch), so a frame
 * of keys costs about one read's latency, not one per key. The keys in
 * the pool are pinned first, so that the promotions' evictions (or the
 * demoter's) can't take them before the reader comes back for them. */
uint32_t store_promote_batch(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                             uint32_t n, struct store_obj **held)
{
    uint32_t promoted = 0, k = 0;
    store_hold_batch(s, ns, e, n, held);
    if (!s->disk || !store_ns_name_ok(ns) || n == 0)
        return 0;
    struct promotion *p = calloc(n, sizeof *p);
    struct disk_read_req *q = calloc(n, sizeof *q);
    uint32_t *which = calloc(n, sizeof *which);
    int32_t *status = calloc(n, sizeof *status);
    uint64_t deadline_ns = gk_now_ns() + PROMOTE_WAIT_MS * 1000000ull;
    for (uint32_t i = 0; p && q && which && status && i < n; i++) {
        if (held[i] || !store_key_ok(&e[i]) ||
            promote_start(s, ns, &e[i], &p[k], &held[i], deadline_ns) != 0)
            continue;
        q[k] = (struct disk_read_req){.loc = &p[k].loc, .ns = ns_bytes(ns), .ns_len = ns->len,
                                      .key = e[i].key, .key_len = e[i].key_len,
                                      .dst = p[k].iov, .dstcnt = obj_iov(s, p[k].o, p[k].iov)};
        which[k++] = i;
    }
    if (k)
        disk_read_batch(s->disk, q, k, status);
    for (uint32_t j = 0; j < k; j++)
        promoted += (uint32_t)promote_finish(s, ns, &e[which[j]], &p[j], status[j],
                                             &held[which[j]]);
    free(p);
    free(q);
    free(which);
    free(status);
    return promoted;
}

/* Deletes keys from disk too, for status[i] not yet 0: out of the disk's
 * index now, marked dead in their files by the demoter (woken here). */
static void delete_from_disk(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                             uint32_t n, int32_t *status)
{
    uint64_t deleted = 0;
    for (uint32_t i = 0; s->disk && store_ns_name_ok(ns) && i < n; i++) {
        if (store_key_ok(&e[i]) &&
            disk_delete(s->disk, ns_bytes(ns), ns->len, e[i].key, e[i].key_len) == 0 &&
            status[i] != 0) {
            status[i] = 0;
            deleted++;
        }
    }
    if (deleted) {
        store_lock(s);
        s->st.deletes += deleted;
        wake_demoter(s);
        store_unlock(s);
    }
}

/* ----------------------------------------------------------- background */

uint64_t store_maintain(struct store *s)
{
    uint64_t evicted = 0;
    int more = 1;
    if (s->disk) {
        wake_demoter(s);
        return 0;
    }
    /* In rounds, letting go of the lock in between: the clients' batches
     * get in while the background drains a pool down to low_bytes. */
    for (int round = 0; more && round < STORE_EVICT_ROUNDS_PER_CALL; round++) {
        uint32_t scan_left = STORE_EVICT_ROUND;
        store_lock(s);
        if (s->alloc.used_bytes > s->high_bytes)
            s->draining = 1;
        while (s->draining && s->alloc.used_bytes > s->low_bytes && evict_lru(s, &scan_left, 0))
            evicted++;
        if (s->alloc.used_bytes <= s->low_bytes)
            s->draining = 0;
        more = s->draining && scan_left == 0;
        store_unlock(s);
    }
    return evicted;
}

uint32_t store_each_namespace(struct store *s, uint32_t max, store_ns_fn *fn, void *arg)
{
    uint32_t n = 0;
    store_lock(s);
    for (struct dlink *l = s->ns_list.next; l != &s->ns_list && n < max; l = l->next) {
        const struct store_ns *ns = CONTAINER_OF(l, struct store_ns, all);
        if (ns->objects) {
            fn(arg, ns->name, ns->node.key_len, ns->objects, ns->bytes);
            n++;
        }
    }
    store_unlock(s);
    return n;
}

void store_get_stats(struct store *s, struct store_stats *out)
{
    store_lock(s);
    *out = s->st;
    out->pool_used_bytes = s->alloc.used_bytes;
    store_unlock(s);
    if (s->disk) {
        struct store_disk_stats d;
        disk_get_stats(s->disk, &d);
#define STORE_DISK_COPY(name, kind, help) out->name = d.name;
        STORE_DISK_STATS(STORE_DISK_COPY)
#undef STORE_DISK_COPY
    }
}
