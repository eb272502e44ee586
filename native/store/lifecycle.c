/*
 * lifecycle.c - the store's birth and death: store_open makes the pool,
 * the allocator and the index, has a pool file's objects re-attached
 * (reattach.c) and starts the disk tier's demoter (tiering.c);
 * store_close stops the demoter, writes to disk what only the pool held
 * (no pool file: tiering.c), and frees everything.
 *
 * Locking: store_open runs before anyone else has the store, so it takes
 * no lock; store_close runs after every other caller has gone, and takes
 * the lock only to tell the demoter to stop.
 */
#include "store_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "disk.h"
#include "gdrkv.h"
#include "persist.h"

#define STORE_INDEX_BUCKETS 4096

static int open_disk(struct store *s, const struct store_opts *opts, char *err, size_t errlen)
{
    struct disk_opts o = {.paths = opts->disk_paths, .npaths = opts->disk_npaths,
                          .bytes_per_path = opts->disk_bytes_per_path, .reset = opts->reset_disk};
    if (disk_open(&s->disk, &o, err, errlen) != 0)
        return -1;
    int rc = pthread_create(&s->demoter, NULL, store_demoter_main, s);
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
    s->drop_undemoted = opts->disk_full_drop;
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
        store_wake_demoter(s);
        pthread_join(s->demoter, NULL);
        store_flush_to_disk(s);
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
