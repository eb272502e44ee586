/*
 * client_gpu.c - see client_gpu.h.
 *
 * Segment classes are decided once per call, from a snapshot of the
 * registered ranges: a GPU range is checked to still be the allocation it
 * was at registration (CUDA's buffer id) before any byte goes near it, so
 * memory freed under a registration is refused (GDRKV_E_INVALID) instead
 * of faulting the GPU context. An unregistered segment is asked about
 * only when the process has the CUDA driver loaded: a GPU address there
 * is refused too, since the CPU can't touch it.
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

/* ------------------------------------------------------------ registration */

int gpu_probe_region(uint64_t ptr, uint64_t len, int *device, uint64_t *buffer_id)
{
    const struct gk_cuda *cu = gk_cuda_if_loaded();
    int first = -1, last = -1;

    *device = -1;
    *buffer_id = 0;
    if (!cu || len == 0)
        return 0;
    int is_gpu = gk_cuda_pointer_device(ptr, &first);
    int end_gpu = gk_cuda_pointer_device(ptr + len - 1, &last);
    if (is_gpu < 0 || end_gpu < 0)
        return GDRKV_E_INTERNAL;
    if (!is_gpu && !end_gpu)
        return 0;
    if (!is_gpu || !end_gpu || first != last) {
        GK_WARN("register: [%#llx, +%llu) mixes host and GPU memory",
                (unsigned long long)ptr, (unsigned long long)len);
        return GDRKV_E_INVALID;
    }
    CUdeviceptr base = 0, end_base = 0;
    size_t size = 0, end_size = 0;
    if (cu->cuMemGetAddressRange(&base, &size, ptr) != GK_CUDA_SUCCESS ||
        cu->cuMemGetAddressRange(&end_base, &end_size, ptr + len - 1) != GK_CUDA_SUCCESS ||
        base != end_base) {
        GK_WARN("register: [%#llx, +%llu) spans more than one GPU allocation",
                (unsigned long long)ptr, (unsigned long long)len);
        return GDRKV_E_INVALID;
    }
    unsigned long long id = 0;
    if (cu->cuPointerGetAttribute(&id, GK_CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr) !=
        GK_CUDA_SUCCESS)
        return GDRKV_E_INVALID;
    *device = first;
    *buffer_id = id;
    return 1;
}

/* Whether a registered GPU range is still the allocation it was. */
static int region_alive(const struct gk_cuda *cu, const struct client_region *r)
{
    unsigned long long id = 0;
    return cu->cuPointerGetAttribute(&id, GK_CU_POINTER_ATTRIBUTE_BUFFER_ID, r->ptr) ==
               GK_CUDA_SUCCESS && id == r->buffer_id;
}

/* ------------------------------------------------------------ calls */

struct classifier {
    const struct gk_cuda *cu;
    struct client_region *regions;
    int8_t *alive;          /* per region: 0 unchecked, 1 alive, -1 gone */
    uint32_t nregions;
    uint32_t last;          /* the region the previous segment was in */
};

/* Whether GPU range i is still the allocation it was, asked once a call. */
static int still_alive(struct classifier *k, uint32_t i)
{
    if (!k->alive[i])
        k->alive[i] = region_alive(k->cu, &k->regions[i]) ? 1 : -1;
    return k->alive[i] > 0;
}

/* A segment's device (>= 0), -1 for host memory, or -2 when it is GPU
 * memory that can't be used. */
static int classify(struct classifier *k, uint64_t ptr, uint64_t len)
{
    if (len == 0)
        return -1;
    /* Segments mostly lie in the region of the one before. No division
     * per segment: with `(last + n) % nregions`, 4096 segments took 21 us
     * to classify on an H200 host, and 14 us without. */
    for (uint32_t n = 0, i = k->last; n < k->nregions; n++, i = i + 1 == k->nregions ? 0 : i + 1) {
        const struct client_region *r = &k->regions[i];
        if (ptr < r->ptr || ptr - r->ptr >= r->len)
            continue;
        k->last = i;
        if (r->device < 0)
            return -1;
        if (len > r->len - (ptr - r->ptr))
            return -2;      /* runs out of its GPU range */
        return still_alive(k, i) ? r->device : -2;
    }
    /* Unregistered: GPU memory (or memory CUDA can't tell about) is refused;
     * only what CUDA says is host memory may be copied by the CPU. */
    int dev;
    return gk_cuda_pointer_device(ptr, &dev) == 0 ? -1 : -2;
}

int gpu_call_order(const struct gpu_call *g)
{
    if (!g->seg_dev)
        return gpu_wait_stream(g->device, g->stream);
    uint32_t seen = 0;
    for (uint64_t s = 0; s < g->nsegs; s++) {
        int dev = g->seg_dev[s];
        if (dev < 0 || (seen & (1u << dev)))
            continue;
        seen |= 1u << dev;
        int rc = gpu_wait_stream(dev, g->stream);
        if (rc)
            return rc;
    }
    return 0;
}

void gpu_call_free(struct gpu_call *g)
{
    if (!g)
        return;
    free(g->ptrs);
    free(g->seg_dev);
    free(g->bad);
    free(g);
}

/* A CUDA stream belongs to one GPU's context: a call that passes one and
 * has GPU segments on several devices fails those keys (E_INVALID) rather
 * than queue copies on a stream of the wrong device. */
static void refuse_multi_gpu_stream(struct gpu_call *g, const struct client_keys *k)
{
    int first = -1, multi = 0;
    for (uint64_t s = 0; s < g->nsegs && g->stream && g->seg_dev; s++) {
        if (g->seg_dev[s] < 0)
            continue;
        if (first < 0)
            first = g->seg_dev[s];
        multi |= g->seg_dev[s] != first;
    }
    if (!multi)
        return;
    GK_WARN("a call with a CUDA stream has GPU segments on several GPUs: refused; pass no "
            "stream, or one call per GPU");
    uint64_t seg = 0;
    for (uint32_t i = 0; i < k->n; i++) {
        for (uint64_t s = seg; s < seg + k->seg_counts[i]; s++)
            if (g->seg_dev[s] >= 0 && !g->bad[i]) {
                g->bad[i] = 1;
                k->results[i] = GDRKV_E_INVALID;
            }
        seg += k->seg_counts[i];
    }
}

/* seg_dev: whether segments are classified one by one (else all are
 * on g->device). */
static struct gpu_call *call_alloc(const struct client_keys *k, uint64_t nsegs, int seg_dev)
{
    struct gpu_call *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->ptrs = malloc((nsegs ? nsegs : 1) * sizeof *g->ptrs);
    g->seg_dev = seg_dev ? malloc(nsegs ? nsegs : 1) : NULL;
    g->bad = seg_dev ? calloc(k->n ? k->n : 1, 1) : NULL;
    if (!g->ptrs || (seg_dev && (!g->seg_dev || !g->bad))) {
        gpu_call_free(g);
        return NULL;
    }
    if (nsegs)
        memcpy(g->ptrs, k->seg_ptrs, nsegs * sizeof *g->ptrs);
    g->orig = k->seg_ptrs;
    g->nsegs = nsegs;
    g->stream = k->stream;
    return g;
}

/* in_one_range: the segments are not all inside one registered range. */
#define ONE_RANGE_NO (-3)

/* Whether every segment with bytes lies inside one registered range that
 * holds: its GPU ordinal, -1 for a host range, else ONE_RANGE_NO (then
 * each segment is classified on its own). An engine's calls mostly read
 * and write one registered KV pool, and this is one pass of min and max:
 * a GET of 4096 GPU pages was classified 43 us into the call one segment
 * at a time, and 20 us in this way, of ~110 and ~75 us of planning on
 * H100 hosts (docs/benchmarks.md, session 18). */
static int in_one_range(struct classifier *cl, const struct client_keys *k, uint64_t nsegs)
{
    uint64_t lo = UINT64_MAX, hi = 0;
    int wraps = 0;
    for (uint64_t s = 0; s < nsegs; s++) {
        uint64_t ptr = k->seg_ptrs[s], len = k->seg_lens[s];
        wraps |= len > UINT64_MAX - ptr;
        lo = len && ptr < lo ? ptr : lo;
        hi = len && ptr + len > hi ? ptr + len : hi;
    }
    if (wraps || lo >= hi)
        return ONE_RANGE_NO;
    for (uint32_t i = 0; i < cl->nregions; i++) {
        const struct client_region *r = &cl->regions[i];
        if (lo < r->ptr || hi - r->ptr > r->len)
            continue;
        if (r->device < 0)
            return -1;
        return still_alive(cl, i) ? r->device : ONE_RANGE_NO;
    }
    return ONE_RANGE_NO;
}

struct gpu_call *gpu_call_prepare(struct client_regions *regions, int mode, uint8_t op,
                                  const struct client_keys *k, struct gpu_serial *put_streams,
                                  int *rc)
{
    struct classifier cl = {.cu = gk_cuda_if_loaded()};
    struct gpu_call *g = NULL;
    uint64_t nsegs = 0;

    *rc = 0;
    if ((op != GK_OP_GET && op != GK_OP_PUT) || !cl.cu)
        return NULL;
    for (uint32_t i = 0; i < k->n; i++)
        nsegs += k->seg_counts[i];
    if (client_regions_snapshot(regions, &cl.regions, &cl.nregions)) {
        *rc = GDRKV_E_INTERNAL;
        return NULL;
    }
    cl.alive = calloc(cl.nregions ? cl.nregions : 1, 1);
    int8_t *dev = NULL;
    int any = 0;
    if (!cl.alive) {
        *rc = GDRKV_E_INTERNAL;
        goto out;
    }
    int one = in_one_range(&cl, k, nsegs);
    if (one != ONE_RANGE_NO) {
        if (one >= 0 && !(g = call_alloc(k, nsegs, 0)))
            *rc = GDRKV_E_INTERNAL;
        if (g)
            g->device = one;
        goto done;
    }
    if (!(dev = malloc(nsegs ? nsegs : 1))) {
        *rc = GDRKV_E_INTERNAL;
        goto out;
    }
    uint64_t seg = 0;
    for (uint32_t i = 0; i < k->n; i++) {
        /* check_key refuses too many segments later; don't look at them. */
        uint64_t end = seg + k->seg_counts[i];
        int bad = 0;
        for (uint64_t s = seg; s < end; s++) {
            int d = k->seg_counts[i] > GK_MAX_SEGMENTS ? -1
                                                      : classify(&cl, k->seg_ptrs[s], k->seg_lens[s]);
            bad |= d == -2;
            dev[s] = (int8_t)(d == -2 ? -1 : d);
            any |= d != -1;
        }
        if (bad) {
            if (!g && !(g = call_alloc(k, nsegs, 1)))
                break;
            g->bad[i] = 1;
            k->results[i] = GDRKV_E_INVALID;
        }
        seg = end;
    }
    if (any && !g)
        g = call_alloc(k, nsegs, 1);
    if (any && !g) {
        *rc = GDRKV_E_INTERNAL;
        goto out;
    }
    if (g)
        memcpy(g->seg_dev, dev, nsegs);
done:
    if (g) {
        g->mode = mode;
        g->serial = op == GK_OP_PUT ? put_streams : NULL;
        refuse_multi_gpu_stream(g, k);
    }
out:
    free(dev);
    free(cl.alive);
    free(cl.regions);
    return g;
}

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
};

static struct gpu_conn *conn_get(struct gpu_conn **gc)
{
    if (!*gc)
        *gc = calloc(1, sizeof **gc);
    return *gc;
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

/* Points the frame's GPU segments into staging slot `slot`; with gather,
 * lists the copies that fill it from them. */
static int redirect(struct gpu_conn *g, int slot, struct client_batch *b,
                    const struct client_frame *f, int gather)
{
    struct gpu_call *gc = b->gpu;
    uint64_t off = 0;
    uint8_t *base = g->staging[slot].buf;

    gpu_list_reset(&g->list);
    for (uint32_t p = f->first; p < f->first + f->count; p++) {
        uint64_t s;
        uint32_t n = key_segments(b, p, &s);
        for (uint64_t e = s + n; s < e; s++) {
            int dev = gpu_seg_device(gc, s);
            if (dev < 0)
                continue;
            uint64_t at = (uint64_t)(uintptr_t)(base + off);
            gc->ptrs[s] = at;
            if (gather && gpu_list_add(&g->list, dev, at, gc->orig[s], b->seg_lens[s]))
                return GDRKV_E_INTERNAL;
            off += b->seg_lens[s];
        }
    }
    return 0;
}

int gpu_conn_start(struct gpu_conn **gcp, struct client_batch *b, const struct client_frame *f,
                   int get_over_socket)
{
    int put = b->opcode == GK_OP_PUT;
    if (!put && !get_over_socket)
        return 0;
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
        rc = redirect(g, slot, b, f, put);
    if (rc)
        return rc;
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
            if (dev >= 0 && gpu_list_add(&g->list, dev, gc->orig[s], gc->ptrs[s], len))
                return GDRKV_E_INTERNAL;
        }
    }
    if (!g->list.count)
        return 0;
    return gpu_slot_launch(&g->slots[g->frame_slot], &g->list, gc->mode, gc->stream, gc->serial,
                           &gc->stats);
}

/* ------------------------------------------------------------ shm pool */

static pthread_mutex_t register_lock = PTHREAD_MUTEX_INITIALIZER;

/* Registers a shared mapping (the pool, a staging memfd) with CUDA on its
 * first GPU copy: 1 when the GPU reaches it directly (*dptr), 0 when it
 * could not be registered (*state remembers either). */
static int shared_mapped(const void *base, size_t len, int readonly, int *state,
                         uint64_t *dptr)
{
    int now = __atomic_load_n(state, __ATOMIC_ACQUIRE);
    if (now == 0) {
        pthread_mutex_lock(&register_lock);
        if (*state == 0) {
            CUdeviceptr d = 0;
            now = gpu_register_shared(base, len, readonly, &d) ? -1 : 1;
            *dptr = d;
            __atomic_store_n(state, now, __ATOMIC_RELEASE);
        }
        now = *state;
        pthread_mutex_unlock(&register_lock);
    }
    return now == 1;
}

static int pool_mapped(struct client_pool *pool)
{
    return shared_mapped(pool->base, pool->map_len, !pool->writable, &pool->gpu_state,
                         &pool->gpu_dptr);
}

void gpu_pool_release(struct client_pool *pool)
{
    if (pool->gpu_state == 1)
        gpu_unregister(pool->base);
    pool->gpu_state = 0;
}

void gpu_staging_release(struct client_staging *st)
{
    if (st->gpu_state == 1)
        gpu_unregister(st->base);
    st->gpu_state = 0;
}

/* How much of a connection's staging memfd is registered with CUDA: the
 * registration pins (and so allocates) every page of it, on every
 * connection that puts GPU values, and shm PUT frames carry at most 1 MiB
 * but for a single larger object (client_call.c). Such an object's frame,
 * when it outgrows this, is copied by the copy engines into unregistered
 * staging (the driver pins what it needs itself). */
#define GPU_STAGING_REGISTERED (8ull << 20)

/* Whether every piece's destination lies in [base, base + len). */
static int dsts_within(const struct gpu_list *l, uint64_t base, uint64_t len)
{
    for (uint32_t i = 0; i < l->count; i++)
        if (l->pieces[i].dst < base || l->pieces[i].dst - base + l->pieces[i].len > len)
            return 0;
    return 1;
}

/* Moves the pieces of g->list (host addresses inside [base, base + len),
 * mapped as *dptr) to where the GPU reaches them, or returns the mode
 * that works without: the copy engines, which stage pageable memory
 * themselves. */
static int to_device(struct gpu_conn *g, int mode, int mapped, uint64_t base, uint64_t dptr,
                     int dst_side)
{
    if (!mapped)
        return GPU_MODE_COPY_ENGINE;
    for (uint32_t i = 0; i < g->list.count; i++) {
        uint64_t *at = dst_side ? &g->list.pieces[i].dst : &g->list.pieces[i].src;
        *at = dptr + (*at - base);
    }
    return mode;
}

/* Launches g->list, whose host side is [base, ...) mapped at dptr (or,
 * not mapped, left to the copy engines), while the CPU runs the host
 * copies. Callers find mapped before reading dptr: finding it sets it. */
static int launch_beside_host(struct gpu_conn *g, struct gpu_call *gc, int mapped,
                              uint64_t base, uint64_t dptr, int dst_side,
                              const struct gk_copy_list *host, struct gk_copier *copier)
{
    int rc = 0;
    if (g->list.count) {
        int mode = to_device(g, gc->mode, mapped, base, dptr, dst_side);
        rc = gpu_slot_launch(&g->slots[0], &g->list, mode, gc->stream, gc->serial, &gc->stats);
    }
    if (host->count)
        gk_copy_run(copier, host);
    gpu_list_reset(&g->list);
    return rc;
}

int gpu_conn_copy_leased(struct gpu_conn *g, struct client_pool *pool, struct client_batch *b,
                         const struct gk_copy_list *host, struct gk_copier *copier)
{
    int mapped = pool_mapped(pool);
    return launch_beside_host(g, b->gpu, mapped, (uint64_t)(uintptr_t)pool->base,
                              pool->gpu_dptr, 0, host, copier);
}

int gpu_conn_copy_put(struct gpu_conn *g, struct client_staging *staging,
                      struct client_pool *pool, struct client_batch *b,
                      const struct gk_copy_list *host, struct gk_copier *copier)
{
    int launched = g->list.count > 0;
    uint64_t base, dptr;
    int mapped;
    if (staging) {
        base = (uint64_t)(uintptr_t)staging->base;
        uint64_t len = GK_MIN(staging->len, GPU_STAGING_REGISTERED);
        mapped = launched && dsts_within(&g->list, base, len) &&
                 shared_mapped(staging->base, len, 0, &staging->gpu_state, &staging->gpu_dptr);
        dptr = staging->gpu_dptr;
    } else {
        base = (uint64_t)(uintptr_t)pool->base;
        mapped = launched && pool_mapped(pool);
        dptr = pool->gpu_dptr;
    }
    int rc = launch_beside_host(g, b->gpu, mapped, base, dptr, 1, host, copier);
    return rc ? rc : launched;
}

int gpu_conn_copy_done(struct gpu_conn *g)
{
    return gpu_slot_poll(&g->slots[0]);
}

int gpu_conn_drain(struct gpu_conn *g)
{
    if (!g)
        return 0;
    int rc0 = gpu_slot_wait(&g->slots[0]);
    int rc1 = gpu_slot_wait(&g->slots[1]);
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
    gpu_list_free(&g->list);
    free(g);
}

/* ------------------------------------------------------------ public */

int gdrkv_gpu_available(char *why, size_t len)
{
    char scratch[1];
    return why && len ? gpu_available(why, len) : gpu_available(scratch, sizeof scratch);
}

/* One slot for every caller of gdrkv_gpu_copy, taken in turn. */
static struct gpu_slot copy_slot;
static struct gpu_list copy_list;
static pthread_mutex_t copy_lock = PTHREAD_MUTEX_INITIALIZER;

int gdrkv_gpu_copy(int device, uint32_t n, const uint64_t *dsts, const uint64_t *srcs,
                   const uint64_t *lens, int mode, uint64_t stream)
{
    struct gpu_stats stats = {0};
    int rc = 0;

    if (n && (!dsts || !srcs || !lens))
        return GDRKV_E_INVALID;
    if (device < 0 || device >= GPU_MAX_DEVICES || mode < GPU_MODE_AUTO ||
        mode > GPU_MODE_PER_PIECE)
        return GDRKV_E_INVALID;
    if (!gk_cuda())
        return GDRKV_E_UNSUPPORTED;
    pthread_mutex_lock(&copy_lock);
    gpu_list_reset(&copy_list);
    for (uint32_t i = 0; i < n && !rc; i++)
        rc = gpu_list_add(&copy_list, device, dsts[i], srcs[i], lens[i]);
    if (!rc)
        rc = gpu_slot_launch(&copy_slot, &copy_list, mode, stream, NULL, &stats);
    int wait_rc = gpu_slot_wait(&copy_slot);
    pthread_mutex_unlock(&copy_lock);
    return rc ? rc : wait_rc;
}
