/*
 * store.c - the hot path: objects, namespaces, pins, eviction and the
 * batch calls that read, write and delete them (see store.h). Opening and
 * closing the store is lifecycle.c's, a restart's objects reattach.c's,
 * the disk tier's demotion and promotion tiering.c's: they call in here
 * (store_state.h), never the other way.
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
 * list at all. A read's move to the head is deferred (below). Over a disk
 * tier, eviction prefers objects with a copy on disk, and under the
 * throttle policy takes no other: a batch that finds no room so waits for
 * the demoter (store_reserve_batch_or_wait, tiering.c).
 *
 * A pool file (persist.h) adds headers in the pool: written at
 * reservation, marked by commit, unmarked by unlink, and read back by
 * reattach.c after a restart. Without one, headers take no room.
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
 * don't move their objects. Functions named do_* are the steps other
 * files take too with the lock held alone (store_state.h); every batch
 * call finds its keys through lookup.h.
 */
#include "store_state.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "disk.h"
#include "gdrkv.h"
#include "lookup.h"
#include "persist.h"

/* Bigger clean-ups than a batch's (STORE_EVICT_SCAN_PER_CALL) are the
 * background's (store_maintain), which lets go of the lock every
 * STORE_EVICT_ROUND objects looked at. */
#define STORE_EVICT_ROUND 1024
#define STORE_EVICT_ROUNDS_PER_CALL 256

/* ------------------------------------------------------------ touch log */

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

/* ------------------------------------------------------------ namespaces */

struct store_ns *store_ns_find(struct store *s, const struct gk_ns *name)
{
    /* The default namespace may come with a NULL name; memcmp wants a pointer. */
    const uint8_t *bytes = store_ns_bytes(name);
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
    o->disk_retry_ns = 0;
    o->unverified = 0;
    o->state = OBJ_RESERVED;
    return o;
}

uint64_t store_obj_head_off(const struct store_obj *o) { return o->chunks[0].off - o->head_len; }

uint32_t store_value_sum(const struct store *s, const struct store_obj *o)
{
    uint32_t n;
    const struct store_chunk *c = store_obj_chunks(o, &n);
    uint64_t h = o->size;
    for (uint32_t k = 0; k < n; k++)
        h = gk_checksum64(s->pool.base + c[k].off, c[k].len, h);
    return (uint32_t)(h ^ (h >> 32));
}

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

/* Makes a reserved object readable (in memory: the caller marks a pool
 * file's head). */
void do_obj_commit(struct store *s, struct store_obj *o)
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
void do_obj_unlink_dropping_ns(struct store *s, struct store_obj *o)
{
    struct store_ns *ns = o->ns;
    obj_unlink(s, o);
    store_ns_drop_if_empty(s, ns);
}

/* ------------------------------------------------------------------ pins
 * Under the exclusive lock; the shared lock's are obj_pin_first and
 * obj_unpin_last (store_state.h), counted once per batch. */

void do_obj_pin(struct store *s, struct store_obj *o)
{
    s->st.pinned_objects += (uint64_t)obj_pin_first(o);
}

void do_obj_unpin(struct store *s, struct store_obj *o)
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
void do_evict(struct store *s, struct store_obj *o)
{
    s->st.evictions++;
    s->st.evicted_bytes += o->size;
    if (s->disk && o->on_disk) {
        s->st.demotions++;
        s->st.demoted_bytes += o->size;
    } else if (s->disk) {
        s->st.evicted_not_on_disk++;
    }
    do_obj_unlink_dropping_ns(s, o);
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
    store_wake_demoter(s);
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
            do_evict(s, clean);
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
        do_evict(s, o);
        return 1;
    }
    return 0;
}

/* A pool file's headers of a reserved object that has all its chunks:
 * the pieces', then the head that lists them (uncommitted). */
void store_write_headers(struct store *s, const struct store_obj *o)
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
    lookups_begin(s, &l, ns, e, n, LOOKUP_SHARED);
    for (uint32_t i = 0; i < n; i++) {
        struct store_obj *o;
        status[i] = lookups_find(s, &l, e, i, n, &o);
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
    if (s->restored_unverified)
        store_verify_restored(s, objs, n, status, sizes);
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
    uint32_t found = 0;
    lookups_begin(s, &l, ns, e, n, LOOKUP_SHARED);
    for (uint32_t i = 0; i < n; i++) {
        struct store_obj *o;
        status[i] = lookups_find(s, &l, e, i, n, &o);
        sizes[i] = o ? o->size : 0;
        if (status[i] == GDRKV_E_NOT_FOUND && s->disk && store_ns_name_ok(ns) &&
            disk_contains(s->disk, store_ns_bytes(ns), ns->len, e[i].key, e[i].key_len, &sizes[i]))
            status[i] = 0;
        found += status[i] == 0;
    }
    /* Apart from hits and misses: an engine asks, then reads what it was
     * told is there, and one page would count twice. */
    __atomic_add_fetch(&s->st.exists_hits, found, __ATOMIC_RELAXED);
    __atomic_add_fetch(&s->st.exists_misses, n - found, __ATOMIC_RELAXED);
    store_unlock(s);
}

/* ----------------------------------------------------------- write path */

/* Whether o was reserved by one of the batch's first n entries. */
static int reserved_by(struct store_obj *const *objs, uint32_t n, const struct store_obj *o)
{
    for (uint32_t i = 0; i < n; i++) {
        if (objs[i] == o)
            return 1;
    }
    return 0;
}

/* Reserves entry i of a batch into objs[i]. *space is the batch's
 * namespace, created on first use and reset to NULL when a failure dropped
 * it. Evicts within *scan_left (only objects on disk with clean_only:
 * evict_lru). key_hash is index_key_hash of e's key; *mem, when not NULL,
 * is memory for the object (obj_bytes), allocated before the lock was
 * taken: NULL once it is used. A PUT's counters are its caller's. */
int32_t do_reserve_one(struct store *s, const struct gk_ns *ns, struct store_ns **space,
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
        return GDRKV_E_NO_SPACE;
    }
    objs[i] = o;
    return 0;
}

/* The objects' memory for a batch of reservations, allocated before the
 * lock is taken (what a key already stored leaves unused is freed after),
 * so that the lock covers the index and the allocator alone. */
static void alloc_objects(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                          uint32_t n, struct store_obj **mem)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t head_len;
        int ok = store_key_ok(&e[i]) && e[i].size <= GK_MAX_OBJECT;
        /* NULL (out of memory) is allocated again under the lock */
        mem[i] = ok ? malloc(obj_bytes(store_obj_cut(s, ns->len, &e[i], &head_len),
                                       e[i].key_len))
                    : NULL;
    }
}

/* Takes back the first n reservations of a batch that must wait for room
 * (store_reserve_batch_or_wait), has the demoter make some, and counts the
 * wait: under the lock. */
static void throttle(struct store *s, struct store_obj **objs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (objs[i])
            do_obj_unlink_dropping_ns(s, objs[i]);
    }
    s->room_wanted = 1;
    s->st.put_throttled++;
    store_wake_demoter(s);
}

/* store_reserve_batch, or with may_wait store_reserve_batch_or_wait. */
static int reserve_batch(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                         uint32_t n, struct store_obj **objs, int32_t *status, int may_wait)
{
    uint32_t scan_left = STORE_EVICT_SCAN_PER_CALL, i;
    int name_ok = store_ns_name_ok(ns), waits = 0;
    struct store_obj *mem[GK_MAX_KEYS];
    struct lookups l;
    if (name_ok)
        alloc_objects(s, ns, e, n, mem);
    lookups_begin(s, &l, ns, e, n, LOOKUP_EXCLUSIVE);
    int clean_only = store_writes_keep_undemoted(s);
    may_wait &= clean_only && !s->disk_failing;
    for (i = 0; i < n && !waits; i++) {
        lookups_prefetch(s, &l, i, n);
        objs[i] = NULL;
        status[i] = name_ok ? do_reserve_one(s, ns, &l.space, &e[i], l.key_hash[i], &mem[i],
                                             objs, i, &scan_left, clean_only)
                            : GDRKV_E_INVALID;
        waits = may_wait && status[i] == GDRKV_E_NO_SPACE;
    }
    if (waits) {
        throttle(s, objs, i);
        memset(objs, 0, n * sizeof *objs);
    } else {
        for (i = 0; i < n; i++) {
            s->st.put_dedup += status[i] == STORE_PRESENT;
            s->st.put_no_space += status[i] == GDRKV_E_NO_SPACE;
        }
    }
    store_unlock(s);
    for (i = 0; name_ok && i < n; i++)
        free(mem[i]);
    if (waits)
        return 1;
    /* Outside the lock: a reservation is its writer's alone (nothing evicts
     * or frees it), and nobody reads headers but a restart. */
    for (i = 0; s->piece_hdr && i < n; i++) {
        if (objs[i])
            store_write_headers(s, objs[i]);
    }
    return 0;
}

void store_reserve_batch(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                         uint32_t n, struct store_obj **objs, int32_t *status)
{
    reserve_batch(s, ns, e, n, objs, status, 0);
}

int store_reserve_batch_or_wait(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                                uint32_t n, struct store_obj **objs, int32_t *status)
{
    return reserve_batch(s, ns, e, n, objs, status, 1);
}

void store_set_room_hook(struct store *s, void (*fn)(void *arg), void *arg)
{
    store_lock(s);
    s->room_hook = fn;
    s->room_hook_arg = arg;
    store_unlock(s);
}

void store_commit_batch(struct store *s, struct store_obj **objs, uint32_t n)
{
    /* A pool file's heads get their values' checksums, read outside the
     * lock: the objects are still this caller's reservations. */
    for (uint32_t i = 0; s->piece_hdr && i < n; i++)
        if (objs[i])
            persist_seal_value(s->pool.base, store_obj_head_off(objs[i]),
                               store_value_sum(s, objs[i]));
    store_lock(s);
    for (uint32_t i = 0; i < n; i++) {
        if (!objs[i])
            continue;
        do_obj_commit(s, objs[i]);
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
        do_obj_unlink_dropping_ns(s, objs[i]);
    }
    store_unlock(s);
}

/* Deletes keys from disk too, for status[i] not yet 0: out of the disk's
 * index now, marked dead in their files by the demoter (woken here). */
static void delete_from_disk(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                             uint32_t n, int32_t *status)
{
    uint64_t deleted = 0;
    for (uint32_t i = 0; s->disk && store_ns_name_ok(ns) && i < n; i++) {
        if (store_key_ok(&e[i]) &&
            disk_delete(s->disk, store_ns_bytes(ns), ns->len, e[i].key, e[i].key_len) == 0 &&
            status[i] != 0) {
            status[i] = 0;
            deleted++;
        }
    }
    if (deleted) {
        store_lock(s);
        s->st.deletes += deleted;
        store_wake_demoter(s);
        store_unlock(s);
    }
}

void store_delete_batch(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                        uint32_t n, int32_t *status)
{
    /* Hashed before the lock and fetched ahead, as reads are: most of a
     * churning server's lookup time went to its deletes' lookups
     * (docs/benchmarks-log.md, "Planning a small-page GPU GET in fewer
     * passes; deletes fetched ahead"). */
    struct lookups l;
    lookups_begin(s, &l, ns, e, n, LOOKUP_EXCLUSIVE);
    for (uint32_t i = 0; i < n; i++) {
        struct store_obj *o;
        status[i] = lookups_find(s, &l, e, i, n, &o);
        if (o) {
            obj_unlink(s, o);
            s->st.deletes++;
        }
    }
    if (l.space)
        store_ns_drop_if_empty(s, l.space);
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
        uint64_t on_disk = disk_clear_ns(s->disk, store_ns_bytes(ns), ns->len);
        store_lock(s);
        s->st.deletes += on_disk;
        store_wake_demoter(s);
        store_unlock(s);
        cleared += on_disk;
    }
    return cleared;
}

/* ----------------------------------------------------------- background */

uint64_t store_maintain(struct store *s)
{
    uint64_t evicted = 0;
    int more = 1;
    if (s->disk) {
        store_wake_demoter(s);
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