/*
 * tiering.c - the pool's traffic with the disk tier (disk.h) under it:
 * demotion, which writes cold objects to disk before they leave the pool,
 * and promotion, which reads a reader's keys back into the pool.
 *
 * The demoter thread keeps the pool between its watermarks when there is a
 * disk tier: it pins a batch of the coldest objects, writes them to disk
 * outside the lock (their bytes can't change: committed objects are
 * immutable and pinned ones stay put), then evicts those nobody pinned
 * meanwhile. An object already on disk (promoted earlier) is evicted
 * without a write. Under the throttle policy a reservation that finds the
 * pool full evicts only objects on disk, and when there are too few, the
 * writer waits for the demoter (store.h store_reserve_batch_or_wait),
 * which then writes every object not on disk yet, hot ones too, and calls
 * the room hook after each batch. Under the drop policy reservations evict
 * at once, and what they evict before the demoter reached it is lost
 * (evicted_not_on_disk).
 *
 * A failing disk (full, EIO) must not make the demoter spin: after a
 * failed write it writes nothing for DEMOTE_BACKOFF_MIN_MS, doubled per
 * failure in a row up to DEMOTE_BACKOFF_MAX_MS, and the objects whose
 * write failed are left alone as long; what is on disk already is still
 * evicted meanwhile. disk.c logs the failures at a bounded rate.
 *
 * A promotion reserves room in the pool as a PUT does (do_reserve_one),
 * evicting only objects that are on disk too, reads the record into the
 * reservation outside the lock, and commits it if the key was not deleted
 * from disk meanwhile.
 *
 * Locking: the store's lock (store.c "Locking") covers every object and
 * list here, and is never held across disk I/O: the demoter pins what it
 * writes, a promotion holds its reservation and its disk record
 * (disk_lookup ... disk_release). The demoter sleeps on demote_lock and
 * demote_wake, which cover demote_kick alone; anyone wakes it
 * (store_wake_demoter) under any lock. This file calls store.c's steps
 * (store_state.h), never the other way.
 */
#include "store_state.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "common/grow.h"
#include "common/log.h"
#include "disk.h"
#include "gdrkv.h"
#include "lookup.h"
#include "persist.h"
#include "uring.h"

/* The demoter's batches: one disk write each, at most this much. */
#define DEMOTE_BATCH_OBJECTS 256
#define DEMOTE_BATCH_BYTES (64ull << 20)
#define DEMOTE_SCAN 4096
#define DEMOTE_IDLE_MS 100
/* The wait after a failed write: doubled per failure in a row, capped so a
 * disk that is back is written to again within a second. */
#define DEMOTE_BACKOFF_MIN_MS 10
#define DEMOTE_BACKOFF_MAX_MS 1000
/* How long a batch of promotions waits, over all its keys, for another
 * reader's promotion of the same key to commit or for room. */
#define PROMOTE_WAIT_MS 5000

/* -------------------------------------------------------------- demotion */

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
 * without losing them; all of them while a writer waits for room. Picks
 * nothing to write during a failed write's back-off, nor an object whose
 * own write failed before its retry time. */
static void pick_cold(struct store *s, struct demotion *b, int draining, uint64_t now)
{
    uint64_t bytes = 0, seen = 0;
    int writing = now >= s->disk_retry_ns;
    uint64_t window = draining || s->room_wanted ? UINT64_MAX
                                                 : alloc_capacity(&s->alloc) - s->low_bytes;
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
                do_evict(s, o);
            continue;
        }
        if (!writing || now < o->disk_retry_ns)
            continue;
        do_obj_pin(s, o);
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

/* A restored value not checked yet (reattach.c, "Restored values") is
 * checked before it goes to disk, whose record would vouch for it: one
 * that changed is dropped and leaves the batch, whose last object takes
 * its place. Without the lock; the batch is described. */
static void check_restored(struct store *s, struct demotion *b)
{
    for (uint32_t i = 0; i < b->n;) {
        struct store_obj *o = b->objs[i];
        if (!__atomic_load_n(&o->unverified, __ATOMIC_RELAXED) ||
            !store_drop_if_changed(s, o, 0)) {
            i++;
            continue;
        }
        uint32_t last = --b->n;
        b->objs[i] = b->objs[last];
        b->ns_len[i] = b->ns_len[last];
        memcpy(b->ns[i], b->ns[last], b->ns_len[last]);
        b->items[i] = b->items[last];
        b->items[i].ns = b->ns[i];
    }
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

/* After a batch's write, under lock: whether it failed, and the back-off
 * that follows (DEMOTE_BACKOFF_*), or its end. */
static void note_failures(struct store *s, const struct demotion *b, uint64_t now)
{
    int failed = 0;
    for (uint32_t i = 0; i < b->n; i++)
        failed |= b->status[i] != 0 && b->status[i] != GDRKV_E_TOO_LARGE;
    s->disk_failing = failed;
    s->disk_backoff_ms = !failed ? 0
                         : GK_MIN(GK_MAX(2 * s->disk_backoff_ms, DEMOTE_BACKOFF_MIN_MS),
                                  DEMOTE_BACKOFF_MAX_MS);
    s->disk_retry_ns = now + s->disk_backoff_ms * 1000000ull;
    s->st.disk_backoff_ms = s->disk_backoff_ms;
}

/* After the write, under lock: evicts what nobody else pinned meanwhile
 * (under the throttle policy, only what reached the disk), leaves what
 * failed alone until the back-off's end, and notes the objects deleted
 * during the write (b->dead). Returns how many objects it made clean or
 * evicted: room for waiting writers. */
static uint32_t settle(struct store *s, struct demotion *b)
{
    uint32_t room = 0;
    b->dead_len = 0;
    for (uint32_t i = 0; i < b->n; i++) {
        struct store_obj *o = b->objs[i];
        if (b->status[i] == 0)
            o->on_disk = 1;
        else
            o->disk_retry_ns = s->disk_retry_ns;
        room += b->status[i] == 0;
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
                   s->alloc.used_bytes > s->low_bytes &&
                   (o->on_disk || !store_writes_keep_undemoted(s));
        do_obj_unpin(s, o);
        if (cold)
            do_evict(s, o);
    }
    return room;
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

void *store_demoter_main(void *arg)
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
        uint64_t now = gk_now_ns();
        pick_cold(s, b, s->draining, now);
        if (b->n == 0) {
            /* Nothing to write: a writer waiting now finds room, or will
             * say it wants some again. */
            if (now >= s->disk_retry_ns)
                s->room_wanted = 0;
            uint64_t sleep_ms = now < s->disk_retry_ns
                                    ? (s->disk_retry_ns - now) / 1000000 + 1 : DEMOTE_IDLE_MS;
            store_unlock(s);
            demoter_sleep(s, (long)GK_MIN(sleep_ms, (uint64_t)DEMOTE_IDLE_MS));
            store_lock(s);
            continue;
        }
        int described = describe(s, b) == 0;
        store_unlock(s);
        if (described && s->restored_unverified)
            check_restored(s, b);
        if (described)
            disk_put_batch(s->disk, b->items, b->n, b->status);
        else
            for (uint32_t i = 0; i < b->n; i++)
                b->status[i] = GDRKV_E_INTERNAL;
        store_lock(s);
        note_failures(s, b, gk_now_ns());
        /* Under the lock, so that once store_set_room_hook returned the
         * old hook is never called again. */
        if (settle(s, b) && s->room_wanted && s->room_hook)
            s->room_hook(s->room_hook_arg);
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
void store_flush_to_disk(struct store *s)
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

/* ------------------------------------------------------------- promotion */

int store_has_disk(struct store *s) { return s->disk != NULL; }

int store_disk_reads_overlap(struct store *s) { return s->disk && uring_available(); }

int store_hold_batch(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                     uint32_t n, struct store_obj **held)
{
    int any = 0;
    uint32_t first_pins = 0;
    uint64_t size;
    struct lookups l;
    for (uint32_t i = 0; i < n; i++)
        held[i] = NULL;
    if (!s->disk || !store_ns_name_ok(ns))
        return 0;
    lookups_begin(s, &l, ns, e, n, LOOKUP_SHARED);
    for (uint32_t i = 0; i < n; i++) {
        if (lookups_find(s, &l, e, i, n, &held[i]) == 0)
            first_pins += (uint32_t)obj_pin_first(held[i]);
        else
            any |= store_key_ok(&e[i]) && disk_contains(s->disk, store_ns_bytes(ns), ns->len,
                                                        e[i].key, e[i].key_len, &size);
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
        do_obj_pin(s, o);
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
    if (disk_lookup(s->disk, store_ns_bytes(ns), ns->len, e->key, e->key_len, &p->loc) != 0)
        return -1;
    struct gk_entry entry = {.key = e->key, .key_len = e->key_len, .size = p->loc.size};
    int32_t st;
    /* Another reader promoting the same key (or a writer writing it) holds
     * a reservation: wait for its commit, so that this reader finds the
     * key too (two TP ranks read the same MLA page at once). No object in
     * the pool has a copy on disk to make room (a restart's pool file
     * holds none yet, a burst of writes is not written yet): wait for the
     * demoter to write some, unless the disk fails its writes. Anything
     * else (the key is back, or will never fit): nothing to do. */
    for (;;) {
        uint32_t scan_left = STORE_EVICT_SCAN_PER_CALL;
        store_lock(s);
        int failing = s->disk_failing;
        struct store_ns *space = store_ns_find(s, ns);
        struct store_obj *no_mem = NULL;
        uint64_t key_hash = index_key_hash(&s->objects, e->key, e->key_len);
        st = do_reserve_one(s, ns, &space, &entry, key_hash, &no_mem, &p->o, 0, &scan_left, 1);
        if (st == STORE_PRESENT)
            hold_present(s, ns, e, held);
        store_unlock(s);
        if ((st != GDRKV_E_BUSY && st != GDRKV_E_NO_SPACE) || gk_now_ns() >= deadline_ns ||
            (st == GDRKV_E_NO_SPACE && failing))
            break;
        if (st == GDRKV_E_NO_SPACE)
            store_wake_demoter(s);
        usleep(1000);
    }
    p->iov = st == 0 ? malloc((p->o->nchunks ? p->o->nchunks : 1) * sizeof *p->iov) : NULL;
    if (st == 0 && !p->iov) {
        store_lock(s);
        do_obj_unlink_dropping_ns(s, p->o);
        store_unlock(s);
    }
    if (!p->iov) {
        disk_release(s->disk, &p->loc);
        return -1;
    }
    if (s->piece_hdr)
        store_write_headers(s, p->o);
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
    /* Its value came back whole (the disk record's checksum held). */
    if (rc == 0 && s->piece_hdr)
        persist_seal_value(s->pool.base, store_obj_head_off(o), store_value_sum(s, o));
    store_lock(s);
    /* Deleted from disk while it was read: it stays deleted. */
    if (rc == 0 && disk_contains(s->disk, store_ns_bytes(ns), ns->len, e->key, e->key_len, &size)) {
        do_obj_commit(s, o);
        do_obj_pin(s, o);
        *held = o;
        o->on_disk = 1;
        if (s->piece_hdr)
            persist_commit(s->pool.base, store_obj_head_off(o), ++s->commit_seq);
        s->st.promotions++;
        s->st.promoted_bytes += o->size;
    } else {
        do_obj_unlink_dropping_ns(s, o);
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
        q[k] = (struct disk_read_req){.loc = &p[k].loc, .ns = store_ns_bytes(ns), .ns_len = ns->len,
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
