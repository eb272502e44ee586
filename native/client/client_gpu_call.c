/*
 * client_gpu_call.c - see client_gpu_call.h.
 *
 * Segment classes are decided once per call, from a snapshot of the
 * registered ranges: a GPU range is checked to still be the allocation it
 * was at registration (CUDA's buffer id) before any byte goes near it, so
 * memory freed under a registration is refused (GDRKV_E_INVALID) instead
 * of faulting the GPU context. An unregistered segment is asked about
 * only when the process has the CUDA driver loaded: a GPU address there
 * is refused too, since the CPU can't touch it.
 */
#include "client_gpu_call.h"

#include <stdlib.h>
#include <string.h>

#include "client_state.h"
#include "common/common.h"
#include "common/log.h"
#include "gdrkv.h"

/* Whether a registered GPU range is still the allocation it was. */
static int region_alive(const struct gk_cuda *cu, const struct client_region *r)
{
    unsigned long long id = 0;
    return cu->cuPointerGetAttribute(&id, GK_CU_POINTER_ATTRIBUTE_BUFFER_ID, r->ptr) ==
               GK_CUDA_SUCCESS && id == r->buffer_id;
}

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
     * per segment: with `(last + n) % nregions` classifying took half again
     * as long (docs/benchmarks-log.md, "Where a small-page GPU GET's time
     * goes; planning once"). */
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
    g->seg_dev = seg_dev ? malloc(nsegs ? nsegs : 1) : NULL;
    g->bad = seg_dev ? calloc(k->n ? k->n : 1, 1) : NULL;
    if (seg_dev && (!g->seg_dev || !g->bad)) {
        gpu_call_free(g);
        return NULL;
    }
    g->nsegs = nsegs;
    g->stream = k->stream;
    return g;
}

/* in_one_range: the segments are not all inside one registered range. */
#define ONE_RANGE_NO (-3)

/* Whether every segment with bytes lies inside one registered range that
 * holds: its GPU ordinal, -1 for a host range, else ONE_RANGE_NO (then
 * each segment is classified on its own). An engine's calls mostly read
 * and write one registered KV pool, and this is one pass of min and max,
 * where a lookup per segment was over a third of a small-page GET's
 * planning (docs/gpu.md, "Limits"; docs/benchmarks-log.md, "Planning a
 * small-page GPU GET in fewer passes; deletes fetched ahead"). */
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

