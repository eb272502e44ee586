/*
 * store_state.h - the store's own structures, shared by the files of the
 * store wing and nobody else: the door is store.h.
 *
 * The store's files, and who calls whom (never back up this list):
 *   lifecycle.c  store_open/store_close: the pool, the allocator, the index,
 *                the demoter thread; calls reattach.c, tiering.c, store.c
 *   reattach.c   a pool file's objects back after a restart; calls store.c
 *   tiering.c    the disk tier's demotion and promotion; calls store.c
 *   store.c      the hot path: namespaces, objects, pins, eviction and the
 *                batch calls; calls only the files below
 *   lookup.h     the batch lookup, inline (store.c, tiering.c)
 *   alloc.c, index.c, pool.c, persist.c, disk.c, uring.c: the parts, which
 *                know nothing of the store
 */
#ifndef GDRKV_STORE_STATE_H
#define GDRKV_STORE_STATE_H

#include <assert.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "alloc.h"
#include "index.h"
#include "pool.h"
#include "store.h"

#define CONTAINER_OF(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))

/* Circular doubly-linked list; a list is its own sentinel link. */
struct dlink {
    struct dlink *prev, *next;
};

static inline void dlink_init(struct dlink *l) { l->prev = l->next = l; }
static inline int dlink_empty(const struct dlink *l) { return l->next == l; }

static inline void dlink_push_head(struct dlink *list, struct dlink *l)
{
    l->prev = list;
    l->next = list->next;
    list->next->prev = l;
    list->next = l;
}

static inline void dlink_remove(struct dlink *l)
{
    l->prev->next = l->next;
    l->next->prev = l->prev;
    dlink_init(l);
}

/* Moves every link of the list chain, in its order, to the head of list. */
static inline void dlink_splice_head(struct dlink *list, struct dlink *chain)
{
    if (dlink_empty(chain))
        return;
    struct dlink *first = chain->next, *last = chain->prev;
    last->next = list->next;
    list->next->prev = last;
    list->next = first;
    first->prev = list;
    dlink_init(chain);
}

static inline void dlink_move_head(struct dlink *list, struct dlink *l)
{
    dlink_remove(l);
    dlink_push_head(list, l);
}

enum obj_state { OBJ_RESERVED, OBJ_COMMITTED, OBJ_UNLINKED };

struct store_ns {
    struct index_node node;     /* in store.namespaces, keyed by name */
    struct dlink all;           /* in store.ns_list */
    struct dlink objs;          /* its reserved and committed objects */
    uint64_t id;                /* its objects' ns_id in the index; a new one per creation */
    uint64_t objects, bytes;    /* committed ones, for quotas */
    uint8_t name[];
};

struct store_obj {
    struct index_node node;     /* in store.objects */
    struct dlink lru;           /* committed: in store.lru */
    struct dlink ns_link;       /* in ns->objs; once unlinked, in store.zombies */
    struct store_ns *ns;        /* NULL once unlinked */
    uint64_t size;
    uint32_t pins;              /* atomic: readers pin under the shared lock */
    uint32_t nchunks;           /* chunks held; all of them once reserved */
    uint32_t head_len;          /* header bytes before chunks[0] (a pool file's) */
    int on_disk;                /* the disk tier holds a copy: evicting it loses nothing */
    uint64_t disk_retry_ns;     /* its write failed: the demoter leaves it until then */
    int unverified;             /* restored from a pool file and not read yet: its value
                                   is checked against its head's checksum first (atomic;
                                   store.c, "Restored values") */
    enum obj_state state;
    struct store_chunk chunks[]; /* value bytes, after the headers; then the key bytes */
};

/* Objects one batch of reservations may look at while evicting, over all
 * its keys and under one hold of the lock: two per key of the largest
 * batch, about a millisecond of work, so a pool full of pinned or tiny
 * objects can't stall every other client behind the lock; the keys that
 * find no room fail with NO_SPACE. */
#define STORE_EVICT_SCAN_PER_CALL (2 * GK_MAX_KEYS)

/* Reads' LRU moves, deferred (store.c "Locking"). */
#define STORE_TOUCH_LOG 65536

struct store {
    pthread_rwlock_t lock;
    struct pool pool;
    struct alloc alloc;
    struct index objects;
    struct index namespaces;
    struct dlink ns_list;
    struct dlink lru;           /* head = most recently used */
    struct dlink zombies;       /* unlinked objects still pinned */
    struct store_obj **touched; /* STORE_TOUCH_LOG: objects read since the last exclusive hold */
    uint32_t ntouched;          /* atomic; may run past STORE_TOUCH_LOG (the rest is dropped) */
    uint64_t last_ns_id;
    uint64_t high_bytes, low_bytes;
    int draining;               /* above high, not yet back to low */
    uint32_t piece_hdr;         /* header bytes before chunks[1..]: 0 without a pool file */
    int restored_unverified;    /* the restart found objects: reads check them first */
    uint64_t commit_seq;        /* a pool file's last commit */
    struct store_stats st;      /* pool_* and hugepages filled in on read */
    struct disk_tier *disk;     /* NULL without a disk tier */
    pthread_t demoter;          /* writes cold objects to disk, then evicts them */
    pthread_mutex_t demote_lock; /* with demote_wake and demote_kick only */
    pthread_cond_t demote_wake;
    int demote_kick;            /* work for the demoter: a wake-up not yet seen */
    int demoter_running, stopping;
    /* Under the lock: */
    int drop_undemoted;         /* store_opts.disk_full_drop */
    int room_wanted;            /* a writer waits for room: the demoter writes every object
                                   not on disk, however recently used */
    int disk_failing;           /* the demoter's last write failed */
    uint64_t disk_retry_ns;     /* ...so it writes nothing before then */
    uint32_t disk_backoff_ms;   /* that wait, doubled per failure up to a cap */
    void (*room_hook)(void *);  /* store_set_room_hook */
    void *room_hook_arg;
};

/* ----------------------------------------------------------------- locks
 * What each covers is store.c's "Locking"; the demoter's is tiering.c's. */

/* Takes the lock alone, and replays the reads' LRU moves first. */
static inline void store_lock(struct store *s)
{
    pthread_rwlock_wrlock(&s->lock);
    uint32_t n = GK_MIN(s->ntouched, (uint32_t)STORE_TOUCH_LOG);
    for (uint32_t i = 0; i < n; i++)
        dlink_move_head(&s->lru, &s->touched[i]->lru);
    s->ntouched = 0;
}

static inline void store_lock_shared(struct store *s) { pthread_rwlock_rdlock(&s->lock); }

static inline void store_unlock(struct store *s) { pthread_rwlock_unlock(&s->lock); }

/* Wakes the demoter (tiering.c); any lock may be held. */
static inline void store_wake_demoter(struct store *s)
{
    pthread_mutex_lock(&s->demote_lock);
    s->demote_kick = 1;
    pthread_cond_signal(&s->demote_wake);
    pthread_mutex_unlock(&s->demote_lock);
}

/* -------------------------------------------------------- names and keys */

/* Nothing can be stored under a bad name: reads of it miss, writes to it
 * are invalid. */
static inline int store_ns_name_ok(const struct gk_ns *name)
{
    return name->len <= GK_MAX_NS_LEN && (name->len == 0 || name->name);
}

/* The name bytes of a request's namespace (the default one may come NULL). */
static inline const uint8_t *store_ns_bytes(const struct gk_ns *ns)
{
    return ns->len ? ns->name : (const uint8_t *)"";
}

static inline int store_key_ok(const struct gk_entry *e)
{
    return e->key && e->key_len >= 1 && e->key_len <= GK_MAX_KEY_LEN;
}

/* ------------------------------------------------------------------ pins */

/* Pins o (under either lock): whether it was unpinned. Callers under the
 * shared lock count those into st.pinned_objects once per batch: a word
 * every reader wrote per key would cost more than the lookups. */
static inline int obj_pin_first(struct store_obj *o)
{
    return __atomic_fetch_add(&o->pins, 1, __ATOMIC_RELAXED) == 0;
}

/* Lets a pin go (under either lock): whether it was the last. */
static inline int obj_unpin_last(struct store_obj *o)
{
    uint32_t left = __atomic_sub_fetch(&o->pins, 1, __ATOMIC_RELAXED);
    assert(left != UINT32_MAX);
    return left == 0;
}

/* ----------------------------------------------- store.c, for the others */

/* Namespaces and objects; the caller holds the lock, or is the restart's
 * rebuild (reattach.c), which says how it shares them. */
struct store_ns *store_ns_find(struct store *s, const struct gk_ns *name);
struct store_ns *store_ns_create(struct store *s, const struct gk_ns *name);
int store_ns_drop_if_empty(struct store *s, struct store_ns *ns);
uint32_t store_obj_cut(const struct store *s, uint32_t ns_len, const struct gk_entry *e,
                       uint32_t *head_len);
uint32_t store_chunk_hdr(const struct store *s, const struct store_obj *o, uint32_t i);
/* key_hash: index_key_hash of e's key; mem: the object's memory, or NULL
 * to allocate it. */
struct store_obj *store_obj_new(struct store *s, struct store_ns *ns, const struct gk_entry *e,
                                uint32_t nchunks, uint32_t head_len, uint64_t key_hash,
                                struct store_obj *mem);
uint64_t store_obj_head_off(const struct store_obj *o);
/* The checksum of o's value bytes a pool file's head keeps (persist.h). */
uint32_t store_value_sum(const struct store *s, const struct store_obj *o);
/* A read's pinned objects restored from a pool file and not checked yet
 * are checked now (reattach.c, "Restored values"); one whose value
 * changed is let go, dropped and answered NOT_FOUND. */
void store_verify_restored(struct store *s, struct store_obj **objs, uint32_t n,
                           int32_t *status, uint64_t *sizes);
/* The same for one pinned unverified object, without the lock: 0 when its
 * value matched (it is checked from now on), else 1 once it is dropped and
 * its pin let go; reading: the check is a read's, whose hit becomes a miss. */
int store_drop_if_changed(struct store *s, struct store_obj *o, int reading);

/* The hot path's steps that promotion and demotion (tiering.c) take too:
 * the caller holds the lock alone. */
void do_obj_commit(struct store *s, struct store_obj *o);
void do_obj_unlink_dropping_ns(struct store *s, struct store_obj *o);
void do_obj_pin(struct store *s, struct store_obj *o);
void do_obj_unpin(struct store *s, struct store_obj *o);
void do_evict(struct store *s, struct store_obj *o);
int32_t do_reserve_one(struct store *s, const struct gk_ns *ns, struct store_ns **space,
                       const struct gk_entry *e, uint64_t key_hash, struct store_obj **mem,
                       struct store_obj **objs, uint32_t i, uint32_t *scan_left,
                       int clean_only);
/* Whether writes evict only objects that are on disk (the throttle
 * policy, store.h store_reserve_batch_or_wait). */
static inline int store_writes_keep_undemoted(const struct store *s)
{
    return s->disk && !s->drop_undemoted;
}
/* A reservation's pool file headers: no lock (the reservation is its
 * writer's alone). */
void store_write_headers(struct store *s, const struct store_obj *o);

/* -------------------------------------------- tiering.c, for lifecycle.c */

/* The demoter thread's body; arg is the store. */
void *store_demoter_main(void *arg);
/* At close, the demoter stopped: writes what is not on disk yet. */
void store_flush_to_disk(struct store *s);

/* ------------------------------------------- reattach.c, for lifecycle.c */

/* A pool file's objects back after a restart (reattach.c): formats a
 * fresh file, or checks an existing one and rebuilds index, allocator and
 * LRU from its heads. */
int store_attach_pool_file(struct store *s, const char *path, char *err, size_t errlen);

#endif
