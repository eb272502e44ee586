/*
 * store.h - the object store: a pool of memory (pool.c), size-class
 * allocation inside it (alloc.c), a hash index over (namespace, key)
 * (index.c), objects with pins, commit state and eviction (store.c),
 * opened and closed by lifecycle.c, and optionally a disk tier under the
 * pool (disk.c) that objects move to and from (tiering.c). store_state.h
 * maps the files.
 *
 * Objects are immutable once committed. An object's bytes live in one or
 * more chunks of the pool (objects larger than a slab page are chained over
 * several chunks, as memcached does with large items); readers get the
 * chunks as pool offsets so any transport (socket writev, shm copy, RDMA
 * READ) can move them without a copy.
 *
 * Thread safety: every function may be called from any thread; the store
 * takes its own lock, once per batch call.
 */
#ifndef GDRKV_STORE_H
#define GDRKV_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "common/protocol.h"

struct store;
struct store_obj;

struct store_opts {
    uint64_t memory_bytes;  /* pool size; rounded down to whole slab pages */
    int hugepages;          /* -1 try, 0 never, 1 require */
    int pretouch;           /* fault every page at open */
    double high_watermark;  /* store_maintain() evicts when pool use is above... */
    double low_watermark;   /* ...down to this */
    int writable_share;     /* local clients may map the pool writable (pool.h) */
    const char *pool_file;  /* back the pool by this file and re-attach the objects
                               it holds (persist.h); NULL = a memfd */
    int reset_pool_file;    /* start that file empty whatever it holds */
    const char *const *disk_paths;  /* directories of the disk tier (disk.h); none: no tier */
    uint32_t disk_npaths;
    uint64_t disk_bytes_per_path;
    int reset_disk;         /* start the disk files empty whatever they hold */
    int disk_full_drop;     /* with a disk tier, a write that finds the pool full of
                               objects not on disk yet evicts them (drop) instead of
                               waiting for the demoter (throttle: store_reserve_batch_or_wait) */
};

/* One contiguous piece of an object inside the pool. */
struct store_chunk {
    uint64_t off;           /* offset from store_base() */
    uint64_t len;
};

/* The store's figures, X(name, GAUGE or COUNTER, what it is): one list
 * declares the struct and prints the stats lines and the metrics
 * (server_stats.c, server_metrics.c). */
#define STORE_STATS(X)                                                               \
    X(pool_bytes, GAUGE, "capacity")                                                 \
    X(pool_used_bytes, GAUGE, "bytes in chunks handed out (incl. class rounding)")   \
    X(objects, GAUGE, "committed objects")                                           \
    X(object_bytes, GAUGE, "sum of committed object sizes")                          \
    X(reserved_objects, GAUGE, "uncommitted allocations (writes in flight)")         \
    X(pinned_objects, GAUGE, "objects with at least one pin")                        \
    X(hits, COUNTER, "keys looked up for reading and found")                         \
    X(misses, COUNTER, "keys looked up for reading and not found")                   \
    X(exists_hits, COUNTER, "keys asked about (EXISTS) and found")                   \
    X(exists_misses, COUNTER, "keys asked about (EXISTS) and not found")             \
    X(puts, COUNTER, "committed puts")                                               \
    X(put_dedup, COUNTER, "puts of keys already present")                            \
    X(put_no_space, COUNTER, "reservations refused for lack of space")               \
    X(evictions, COUNTER, "objects evicted")                                         \
    X(evicted_bytes, COUNTER, "bytes of the objects evicted")                        \
    X(deletes, COUNTER, "objects deleted")                                           \
    X(namespaces, GAUGE, "namespaces with objects")                                  \
    X(hugepages, GAUGE, "whether the pool got hugepages (0 or 1)")                   \
    X(pool_file, GAUGE, "whether the pool is a file that outlives the server (0 or 1)") \
    X(restored_objects, GAUGE, "objects re-attached from the pool file at start")    \
    X(restore_dropped, GAUGE, "heads in the pool file not served: uncommitted or torn") \
    X(restore_bad_values, COUNTER, "restored objects whose value failed its checksum on " \
      "their first read: dropped, a miss")                                           \
    X(demotions, COUNTER, "objects evicted from memory with a copy on disk")         \
    X(demoted_bytes, COUNTER, "bytes of the objects demoted")                        \
    X(promotions, COUNTER, "objects read back from disk into memory for a reader")  \
    X(promoted_bytes, COUNTER, "bytes of the objects promoted")                      \
    X(evicted_not_on_disk, COUNTER, "objects a disk tier could not keep: evicted before " \
      "their demotion, or their write failed")                                        \
    X(put_throttled, COUNTER, "write batches that found no room but objects not on disk " \
      "yet, and waited for the demoter (disk_full_policy throttle)")                 \
    X(disk_backoff_ms, GAUGE, "how long the demoter waits after its last failed disk " \
      "write before it writes again (0: the last write succeeded)")                 \
    STORE_DISK_STATS(X)

/* The disk tier's own figures (disk.h), part of the store's. */
#define STORE_DISK_STATS(X)                                                           \
    X(disk_bytes, GAUGE, "capacity of the disk tier")                               \
    X(disk_used_bytes, GAUGE, "bytes of the disk tier's regions in use")            \
    X(disk_objects, GAUGE, "objects on disk")                                       \
    X(disk_object_bytes, GAUGE, "sum of the sizes of the objects on disk")          \
    X(disk_writes, COUNTER, "objects written to disk")                              \
    X(disk_written_bytes, COUNTER, "value bytes written to disk")                   \
    X(disk_reads, COUNTER, "objects read back from disk")                           \
    X(disk_read_bytes, COUNTER, "value bytes read back from disk")                  \
    X(disk_uring_reads, COUNTER, "of those, reads io_uring carried (several in flight)") \
    X(disk_write_ns, COUNTER, "time spent in disk writes, ns")                      \
    X(disk_read_ns, COUNTER, "time spent in disk reads, ns")                        \
    X(disk_evicted_regions, COUNTER, "regions the disk tier evicted")               \
    X(disk_evicted_objects, COUNTER, "objects dropped with their region")           \
    X(disk_errors, COUNTER, "failed disk reads and writes (each a miss or a write not done)") \
    X(disk_bad_records, COUNTER, "records whose bytes failed their checksum when read") \
    X(disk_restored_objects, GAUGE, "objects found in the disk files at start")

struct store_disk_stats {
#define STORE_STATS_FIELD(name, kind, help) uint64_t name;
    STORE_DISK_STATS(STORE_STATS_FIELD)
#undef STORE_STATS_FIELD
};

struct store_stats {
#define STORE_STATS_FIELD(name, kind, help) uint64_t name;
    STORE_STATS(STORE_STATS_FIELD)
#undef STORE_STATS_FIELD
};

int store_open(struct store **out, const struct store_opts *opts, char *err, size_t errlen);
void store_close(struct store *s);

uint8_t *store_base(struct store *s);
uint64_t store_capacity(struct store *s);
/* The slab page: no chunk crosses a multiple of it, so the pool may be cut
 * there (rdma registers it in pieces of whole pages). */
uint64_t store_page_size(void);
/* The pool's memfd, read-only (writable under writable_share) and sealed
 * (pool.h), for local clients to map;
 * -1 when the pool can't be shared. */
int store_pool_fd(struct store *s);

/*
 * Read path. For each entry: if a committed object exists, pin it (it will
 * not be evicted or freed until unpinned), set objs[i] and sizes[i] and
 * status[i] = 0; else objs[i] = NULL, status[i] = GDRKV_E_NOT_FOUND.
 * When touch is set, hits move to the head of the LRU.
 */
void store_pin_batch(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                     uint32_t n, int touch, struct store_obj **objs, int32_t *status,
                     uint64_t *sizes);
/* Drops one pin from each non-NULL objs[i]. */
void store_unpin_batch(struct store *s, struct store_obj **objs, uint32_t n);

/* EXISTS: status[i] = 0 and sizes[i] = size for committed objects, else
 * GDRKV_E_NOT_FOUND. No pin, no LRU touch. */
void store_exists_batch(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                        uint32_t n, int32_t *status, uint64_t *sizes);

/*
 * Disk tier. A key absent from the pool may be on disk: EXISTS says so, and
 * a reader first has it promoted (read back into the pool), which costs
 * disk I/O and so runs off the network workers: store_hold_batch() pins
 * the batch's keys in the pool and says whether the others need it,
 * store_promote_batch() does it (blocking), then store_pin_batch() finds
 * the keys in the pool. The holds keep every key found there, before and
 * after the disk, from being evicted until the reader has its own pins.
 */
int store_has_disk(struct store *s);
/* Whether one store_promote_batch call keeps its keys' reads in flight side
 * by side (io_uring), so that a caller need not spread keys over threads. */
int store_disk_reads_overlap(struct store *s);
/* Pins the keys in the pool into held[i] (NULL for the others, and for
 * all without a disk tier): whether any of the others is on disk. */
int store_hold_batch(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                     uint32_t n, struct store_obj **held);
/* Returns how many keys it brought into the pool. held[i] is key i's
 * object, pinned (brought back, or in the pool already), or NULL: the
 * caller pins the keys again for its read, then lets these pins go
 * (store_unpin_batch), so nothing evicts a key in between. */
uint32_t store_promote_batch(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                             uint32_t n, struct store_obj **held);

/* The chunks of a pinned or reserved object, in order; their lens sum to the
 * object size. Valid while the pin or reservation is held. */
const struct store_chunk *store_obj_chunks(const struct store_obj *o, uint32_t *nchunks);
uint64_t store_obj_size(const struct store_obj *o);

/*
 * Write path, two phases so the bytes can land straight in the pool:
 * reserve -> caller fills the chunks -> commit (or abort).
 * status[i]: 0 = reserved (objs[i] set; invisible to readers, not evictable),
 *            1 = already present, or reserved by an earlier entry of this
 *                same batch (objs[i] NULL; the caller discards the bytes and
 *                reports success: put-if-absent),
 *            GDRKV_E_BUSY = being written by another writer, which may still
 *                fail: the caller reports the key as not stored,
 *            GDRKV_E_NO_SPACE / GDRKV_E_TOO_LARGE (objs[i] NULL).
 * Reservation evicts unpinned committed objects (LRU first) as needed.
 */
#define STORE_PRESENT 1
void store_reserve_batch(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                         uint32_t n, struct store_obj **objs, int32_t *status);
/*
 * The same for a writer that can wait (dirty throttling, as the kernel's
 * page cache does it). Under the throttle policy (a disk tier, not
 * disk_full_drop) no write evicts an object that is not on disk yet; when
 * the pool has no room for the whole batch otherwise, this reserves
 * nothing, has the demoter write objects to disk so that they may go, and
 * returns 1: the caller waits (without holding anything of the store) for
 * store_set_room_hook's call or a while, and tries again, until a bound of
 * its own; then store_reserve_batch, whose keys without room get
 * GDRKV_E_NO_SPACE. While the disk's writes fail, it never returns 1: a
 * failing disk makes no room. Returns 0 when it ran as store_reserve_batch.
 */
int store_reserve_batch_or_wait(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                                uint32_t n, struct store_obj **objs, int32_t *status);
/* fn(arg) is called from the demoter, under the store's lock (so fn must be
 * quick and must not call the store), whenever it may have made room for
 * writers that wait; once this returns, the hook set before is never
 * called again (NULL: none). */
void store_set_room_hook(struct store *s, void (*fn)(void *arg), void *arg);
/* Makes reserved objects visible; NULL entries skipped. */
void store_commit_batch(struct store *s, struct store_obj **objs, uint32_t n);
/* Frees reserved objects that will never be committed; NULL entries skipped. */
void store_abort_batch(struct store *s, struct store_obj **objs, uint32_t n);

/* DELETE: unlinks committed objects (status 0) or GDRKV_E_NOT_FOUND. A
 * pinned object is freed when its last pin goes. */
void store_delete_batch(struct store *s, const struct gk_ns *ns, const struct gk_entry *e,
                        uint32_t n, int32_t *status);

/* CLEAR: unlinks every committed object of the namespace; returns how many. */
uint64_t store_clear_ns(struct store *s, const struct gk_ns *ns);

/* Background eviction: when pool use is above the high watermark, evict
 * unpinned committed objects (LRU first) until it is below the low one.
 * Returns the number evicted. Called periodically by the server. With a
 * disk tier the store's demoter thread does this instead, writing each
 * object to disk before it leaves the pool; here it is only woken. */
uint64_t store_maintain(struct store *s);

/* Calls fn for each namespace with committed objects, at most max of
 * them, under the store's lock (fn must be quick: every batch waits for
 * it): its name, objects and bytes. Returns how many it visited. */
typedef void store_ns_fn(void *arg, const uint8_t *name, uint32_t len, uint64_t objects,
                         uint64_t bytes);
uint32_t store_each_namespace(struct store *s, uint32_t max, store_ns_fn *fn, void *arg);

void store_get_stats(struct store *s, struct store_stats *out);

#endif
