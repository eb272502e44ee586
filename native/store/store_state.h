/*
 * store_state.h - the store's own structures, shared by the files of the
 * store wing (store.c, reattach.c) and nobody else: the door is store.h.
 */
#ifndef GDRKV_STORE_STATE_H
#define GDRKV_STORE_STATE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

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
    enum obj_state state;
    struct store_chunk chunks[]; /* value bytes, after the headers; then the key bytes */
};

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
    uint64_t commit_seq;        /* a pool file's last commit */
    struct store_stats st;      /* pool_* and hugepages filled in on read */
    struct disk_tier *disk;     /* NULL without a disk tier */
    pthread_t demoter;          /* writes cold objects to disk, then evicts them */
    pthread_mutex_t demote_lock; /* with demote_wake and demote_kick only */
    pthread_cond_t demote_wake;
    int demote_kick;            /* work for the demoter: a wake-up not yet seen */
    int demoter_running, stopping;
};

/* Namespaces and objects (store.c); the caller holds the lock, or is the
 * restart's rebuild (reattach.c), which says how it shares them. */
int store_ns_name_ok(const struct gk_ns *name);
struct store_ns *store_ns_find(struct store *s, const struct gk_ns *name);
struct store_ns *store_ns_create(struct store *s, const struct gk_ns *name);
int store_ns_drop_if_empty(struct store *s, struct store_ns *ns);
int store_key_ok(const struct gk_entry *e);
uint32_t store_obj_cut(const struct store *s, uint32_t ns_len, const struct gk_entry *e,
                       uint32_t *head_len);
uint32_t store_chunk_hdr(const struct store *s, const struct store_obj *o, uint32_t i);
/* key_hash: index_key_hash of e's key; mem: the object's memory, or NULL
 * to allocate it. */
struct store_obj *store_obj_new(struct store *s, struct store_ns *ns, const struct gk_entry *e,
                                uint32_t nchunks, uint32_t head_len, uint64_t key_hash,
                                struct store_obj *mem);
uint64_t store_obj_head_off(const struct store_obj *o);

/* A pool file's objects back after a restart (reattach.c): formats a
 * fresh file, or checks an existing one and rebuilds index, allocator and
 * LRU from its heads. */
int store_attach_pool_file(struct store *s, const char *path, char *err, size_t errlen);

#endif
