/*
 * client_gpu.c - see client_gpu.h.
 */
#include "client_gpu.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/copy.h"
#include "client_state.h"
#include "common/common.h"
#include "gdrkv.h"
#include "common/log.h"

/* Smallest staging buffer a connection allocates: pinned allocation is
 * slow, so buffers only grow, geometrically. */
#define GPU_STAGING_MIN (4ull << 20)

/* ------------------------------------------------------------ connections */

struct gpu_staging {
    uint8_t *buf;           /* pinned, mapped */
    uint64_t cap;
};

struct gpu_conn {
    struct gpu_list list;
    struct gpu_slot slots[2];
    struct gpu_staging staging[2];
    int next;               /* the slot the next socket GET frame uses */
    int frame_slot;         /* the slot of the GET frame being received */
    /* The socket frame's table (gpu_conn_start): by the call's segment
     * index, where the socket moves each of the frame's segments. The
     * call's own pointers are never rewritten. */
    uint64_t *frame_ptrs;
    uint64_t frame_ptrs_cap;
    struct gpu_held held;   /* the pool slices its shared copies hold */
};

static struct gpu_conn *conn_get(struct gpu_conn **gc)
{
    if (!*gc)
        *gc = calloc(1, sizeof **gc);
    return *gc;
}

struct gpu_held *gpu_conn_held(struct gpu_conn *gc)
{
    return &gc->held;
}

/* The slices held for copies that are over (or never launched). */
static void held_release(struct gpu_held *h)
{
    for (uint32_t i = 0; i < h->count; i++)
        gpu_slices_unhold(h->slices, h->index[i]);
    h->count = 0;
}

static int held_add(struct gpu_held *h, struct gpu_slices *s, uint32_t slice)
{
    if (h->count && h->slices != s)
        held_release(h);        /* another mapping's (a restarted server's) */
    h->slices = s;
    if (h->count == h->cap) {
        uint32_t cap = h->cap ? 2 * h->cap : 16;
        uint32_t *p = realloc(h->index, cap * sizeof *p);
        if (!p) {
            gpu_slices_unhold(s, slice);
            return GDRKV_E_INTERNAL;
        }
        h->index = p;
        h->cap = cap;
    }
    h->index[h->count++] = slice;
    return 0;
}

/* Whether addr lies in the slice held last: pieces in a row mostly share
 * one, and need not hold it again. */
static int held_last(const struct gpu_held *h, const struct gpu_slices *s, uint64_t addr)
{
    return h->count && h->slices == s &&
           h->index[h->count - 1] == (addr - (uint64_t)(uintptr_t)s->base) >> s->slice_shift;
}

struct gpu_list *gpu_conn_list(struct gpu_conn **gc)
{
    struct gpu_conn *g = conn_get(gc);
    return g ? &g->list : NULL;
}

/* Staging slot `slot` with room for bytes; its last launch must be over. */
static int staging_reserve(struct gpu_conn *g, int slot, uint64_t bytes)
{
    struct gpu_staging *st = &g->staging[slot];
    if (bytes <= st->cap)
        return 0;
    uint64_t cap = GK_MAX(GK_MAX(bytes, 2 * st->cap), GPU_STAGING_MIN);
    gpu_host_free(st->buf);
    st->buf = gpu_host_alloc(cap);
    st->cap = st->buf ? cap : 0;
    return st->buf ? 0 : GDRKV_E_INTERNAL;
}

/* The segments of the key at position p: [*first, *first + count). */
static uint32_t key_segments(const struct client_batch *b, uint32_t p, uint64_t *first)
{
    *first = b->first_seg[p];
    return b->seg_counts[b->index[p]];
}

/* Bytes of the frame's segments in GPU memory. */
static uint64_t frame_gpu_bytes(const struct client_batch *b, const struct client_frame *f)
{
    uint64_t bytes = 0;
    for (uint32_t p = f->first; p < f->first + f->count; p++) {
        uint64_t s;
        uint32_t n = key_segments(b, p, &s);
        for (uint64_t e = s + n; s < e; s++)
            if (gpu_seg_device(b->gpu, s) >= 0)
                bytes += b->seg_lens[s];
    }
    return bytes;
}

/* The socket frame's table: where the socket moves each of its segments
 * from or to (the caller's address, or its GPU segments' place in staging
 * slot `slot`), by the call's segment index; with gather, lists the copies
 * that fill staging from the GPU segments. */
static int fill_frame_ptrs(struct gpu_conn *g, int slot, const struct client_batch *b,
                           const struct client_frame *f, int gather)
{
    const struct gpu_call *gc = b->gpu;
    uint64_t off = 0;
    uint8_t *base = g->staging[slot].buf;

    gpu_list_reset(&g->list);
    for (uint32_t p = f->first; p < f->first + f->count; p++) {
        uint64_t s;
        uint32_t n = key_segments(b, p, &s);
        for (uint64_t e = s + n; s < e; s++) {
            int dev = gpu_seg_device(gc, s);
            if (dev < 0) {
                g->frame_ptrs[s] = b->seg_ptrs[s];
                continue;
            }
            uint64_t at = (uint64_t)(uintptr_t)(base + off);
            g->frame_ptrs[s] = at;
            if (gather && gpu_list_add(&g->list, dev, at, b->seg_ptrs[s], b->seg_lens[s]))
                return GDRKV_E_INTERNAL;
            off += b->seg_lens[s];
        }
    }
    return 0;
}

/* Room in the table for every segment of the call; it only grows. */
static int frame_ptrs_reserve(struct gpu_conn *g, uint64_t nsegs)
{
    if (nsegs <= g->frame_ptrs_cap)
        return 0;
    uint64_t cap = GK_MAX(nsegs, 2 * g->frame_ptrs_cap);
    uint64_t *p = realloc(g->frame_ptrs, cap * sizeof *p);
    if (!p)
        return GDRKV_E_INTERNAL;
    g->frame_ptrs = p;
    g->frame_ptrs_cap = cap;
    return 0;
}

int gpu_conn_start(struct gpu_conn **gcp, struct client_batch *b, const struct client_frame *f,
                   const uint64_t **seg_ptrs)
{
    int put = b->opcode == GK_OP_PUT;
    uint64_t bytes = frame_gpu_bytes(b, f);
    if (bytes == 0)
        return 0;
    struct gpu_conn *g = conn_get(gcp);
    if (!g)
        return GDRKV_E_INTERNAL;
    int slot = put ? 0 : g->next;
    int rc = gpu_slot_wait(&g->slots[slot]);
    if (!rc)
        rc = staging_reserve(g, slot, bytes);
    if (!rc)
        rc = frame_ptrs_reserve(g, b->gpu->nsegs);
    if (!rc)
        rc = fill_frame_ptrs(g, slot, b, f, put);
    if (rc)
        return rc;
    *seg_ptrs = g->frame_ptrs;
    if (put) {
        /* The values must be in staging before the first byte is sent. */
        rc = gpu_slot_launch(&g->slots[0], &g->list, b->gpu->mode, b->gpu->stream,
                             b->gpu->serial, &b->gpu->stats);
        return rc ? rc : gpu_slot_wait(&g->slots[0]);
    }
    g->frame_slot = slot;
    g->next = slot ^ 1;
    return 0;
}

int gpu_conn_received(struct gpu_conn *g, struct client_batch *b, const struct client_frame *f)
{
    struct gpu_call *gc = b->gpu;
    if (!g)
        return 0;           /* the frame had no GPU segment */
    gpu_list_reset(&g->list);
    for (uint32_t p = f->first; p < f->first + f->count; p++) {
        uint64_t left = b->got[p], s;
        uint32_t n = key_segments(b, p, &s);
        for (uint64_t e = s + n; s < e && left; s++) {
            uint64_t len = GK_MIN(b->seg_lens[s], left);
            left -= len;
            int dev = gpu_seg_device(gc, s);
            /* A segment without bytes may not be in the table: a frame
             * whose GPU segments are all empty did not fill it. */
            if (dev >= 0 && len &&
                gpu_list_add(&g->list, dev, b->seg_ptrs[s], g->frame_ptrs[s], len))
                return GDRKV_E_INTERNAL;
        }
    }
    if (!g->list.count)
        return 0;
    return gpu_slot_launch(&g->slots[g->frame_slot], &g->list, gc->mode, gc->stream, gc->serial,
                           &gc->stats);
}

/* ------------------------------------------------------------ shared mappings */

static pthread_mutex_t register_lock = PTHREAD_MUTEX_INITIALIZER;

/* Registers a connection's staging memfd with CUDA on its first GPU copy:
 * 1 when the GPU reaches it directly (*dptr), 0 when it could not be
 * registered (*state remembers either). */
static int staging_mapped(const void *base, size_t len, int *state, uint64_t *dptr)
{
    int now = __atomic_load_n(state, __ATOMIC_ACQUIRE);
    if (now == 0) {
        pthread_mutex_lock(&register_lock);
        if (*state == 0) {
            CUdeviceptr d = 0;
            now = gpu_register_shared(base, len, 0, &d) ? -1 : 1;
            *dptr = d;
            __atomic_store_n(state, now, __ATOMIC_RELEASE);
        }
        now = *state;
        pthread_mutex_unlock(&register_lock);
    }
    return now == 1;
}

/* The pool's slices, set up on its first GPU copy (which registers
 * nothing itself: the slices' thread does), or NULL when they can't be. */
static struct gpu_slices *pool_slices(struct client_pool *pool, int dev)
{
    struct gpu_slices *s = __atomic_load_n(&pool->gpu_slices, __ATOMIC_ACQUIRE);
    if (s || __atomic_load_n(&pool->gpu_failed, __ATOMIC_RELAXED))
        return s;
    pthread_mutex_lock(&register_lock);
    if (!pool->gpu_slices && !pool->gpu_failed) {
        struct client_gpu_pins *pins = pool->gpu_pins;
        struct gpu_slices_ops ops = gpu_slices_cuda_ops(dev);
        s = calloc(1, sizeof *s);
        if (s && gpu_slices_init(s, pool->base, pool->map_len, !pool->writable, 0, pins->limit,
                                 pins->ahead, &ops, &pins->stats) == 0) {
            __atomic_store_n(&pool->gpu_slices, s, __ATOMIC_RELEASE);
        } else {
            free(s);
            __atomic_store_n(&pool->gpu_failed, 1, __ATOMIC_RELAXED);
        }
    }
    s = pool->gpu_slices;
    pthread_mutex_unlock(&register_lock);
    return s;
}

void gpu_pool_release(struct client_pool *pool)
{
    if (pool->gpu_slices) {
        gpu_slices_destroy(pool->gpu_slices);
        free(pool->gpu_slices);
    }
    pool->gpu_slices = NULL;
    pool->gpu_failed = 0;
}

void gpu_staging_release(struct client_staging *st)
{
    if (st->gpu_state == 1)
        gpu_unregister(st->base);
    st->gpu_state = 0;
}

/* How much of a connection's staging memfd is registered with CUDA: the
 * registration pins (and so allocates) every page of it, on every
 * connection that puts GPU values, and shm PUT frames are cut to the
 * host's frame size (client.c) but for a single larger object
 * (client_call.c). Such an object's frame, when it outgrows this, is
 * copied by the copy engines into unregistered staging (the driver pins
 * what it needs itself). */
#define GPU_STAGING_REGISTERED (8ull << 20)

void gpu_reach_resolve(struct gpu_reach *r, const struct gpu_call *g, int dev)
{
    r->resolved = 1;
    r->mode = g->mode;
    if (r->pool) {
        r->base = (uint64_t)(uintptr_t)r->pool->base;
        r->slices = pool_slices(r->pool, dev);
        r->now_ns = gk_now_ns();
        if (!r->slices)
            r->mode = GPU_MODE_COPY_ENGINE;
        return;
    }
    struct client_staging *st = r->staging;
    uint64_t len = GK_MIN(st->len, GPU_STAGING_REGISTERED);
    /* staging_mapped sets the device address before it says mapped: read
     * it after. */
    int mapped = r->frame_bytes <= len && staging_mapped(st->base, len, &st->gpu_state,
                                                         &st->gpu_dptr);
    r->base = mapped ? st->gpu_dptr : (uint64_t)(uintptr_t)st->base;
    r->mode = mapped ? g->mode : GPU_MODE_COPY_ENGINE;
}

int gpu_reach_add(struct gpu_reach *r, struct gpu_list *list, int dev, uint64_t caller,
                  uint64_t off, uint64_t len, int to_caller)
{
    struct gpu_slices *s = r->slices;
    while (len) {
        uint64_t host = r->base + off, part = len, shared = host;
        if (s) {
            /* Pool chunks never cross a slice border (slices are whole
             * allocation pages), but two may meet at one: the list must
             * not merge them. */
            uint64_t border = gpu_slices_border(s, host);
            part = GK_MIN(len, border - host);
            list->apart = (off & (s->slice_bytes - 1)) == 0;
            /* Where slices may be evicted, only a held one is reached. */
            uint32_t slice;
            int reached = !gpu_slices_evicts(s) ? gpu_slices_reach(s, host, part)
                          : r->held && (held_last(r->held, s, host) ||
                                        (gpu_slices_hold(s, host, r->now_ns, &slice) &&
                                         held_add(r->held, s, slice) == 0));
            if (reached)
                shared = gpu_slices_dptr(s, host);
            else
                r->mode = GPU_MODE_COPY_ENGINE;
        }
        int rc = to_caller ? gpu_list_add(list, dev, caller, shared, part)
                           : gpu_list_add(list, dev, shared, caller, part);
        if (rc)
            return rc;
        caller += part;
        off += part;
        len -= part;
    }
    return 0;
}

int gpu_conn_copy_shared(struct gpu_conn *g, struct client_batch *b, int mode,
                         const struct gk_copy_list *host, struct gk_copier *copier)
{
    struct gpu_call *gc = b->gpu;
    int launched = g->list.count > 0;
    int rc = 0;
    if (launched)
        rc = gpu_slot_launch(&g->slots[0], &g->list, mode, gc->stream, gc->serial, &gc->stats);
    if (host->count)
        gk_copy_run(copier, host);
    gpu_list_reset(&g->list);
    if (rc || !launched)
        held_release(&g->held);     /* nothing of it runs on the GPU */
    return rc ? rc : launched;
}

int gpu_conn_copy_done(struct gpu_conn *g)
{
    int rc = gpu_slot_poll(&g->slots[0]);
    if (rc)
        held_release(&g->held);
    return rc;
}

int gpu_conn_drain(struct gpu_conn *g)
{
    if (!g)
        return 0;
    int rc0 = gpu_slot_wait(&g->slots[0]);
    int rc1 = gpu_slot_wait(&g->slots[1]);
    held_release(&g->held);
    return rc0 ? rc0 : rc1;
}

void gpu_conn_free(struct gpu_conn *g)
{
    if (!g)
        return;
    for (int i = 0; i < 2; i++) {
        gpu_slot_free(&g->slots[i]);
        gpu_host_free(g->staging[i].buf);
    }
    held_release(&g->held);
    free(g->held.index);
    gpu_list_free(&g->list);
    free(g->frame_ptrs);
    free(g);
}
