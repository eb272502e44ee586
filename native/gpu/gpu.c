/*
 * gpu.c - see gpu.h.
 *
 * The kernel path: each device's pieces are cut into units of at most
 * GPU_UNIT_BYTES and written as descriptors into the slot's pinned,
 * mapped buffer, which the kernel reads straight from host memory, so a
 * launch needs no upload. The grid is sized to the work, capped at what
 * keeps every multiprocessor full: each warp then loops over units.
 *
 * The copy-engine path: one cuMemcpyBatchAsync per device where the
 * driver has it (CUDA 12.8+), else one cuMemcpyAsync per piece.
 */
#include "gpu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/grow.h"
#include "gdrkv.h"
#include "common/log.h"
#include "common/protocol.h"

/* Blocks per multiprocessor the grid is capped at: 8 x 256 threads fills
 * an SM of 2048 threads. */
#define GPU_BLOCKS_PER_SM 8

struct gpu_dev {
    int state;              /* 0 untried, 1 ready, -1 failed */
    CUcontext ctx;
    CUmodule module;
    CUfunction copy;
    int sms;
};

static struct gpu_dev devs[GPU_MAX_DEVICES];
static pthread_mutex_t devs_lock = PTHREAD_MUTEX_INITIALIZER;

static int cu_failed(const char *what, CUresult rc)
{
    GK_WARN("%s failed: %s", what, gk_cuda_strerror(rc));
    return GDRKV_E_INTERNAL;
}

#define CU_TRY(call) do { CUresult rc_ = (call); if (rc_ != GK_CUDA_SUCCESS) \
    return cu_failed(#call, rc_); } while (0)

/* Retains the device's primary context and loads the kernel there, once. */
static int dev_open(const struct gk_cuda *cu, int ordinal, struct gpu_dev *d)
{
    CUdevice dev;
    CU_TRY(cu->cuDeviceGet(&dev, ordinal));
    CU_TRY(cu->cuDeviceGetAttribute(&d->sms, GK_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CU_TRY(cu->cuDevicePrimaryCtxRetain(&d->ctx, dev));
    CU_TRY(cu->cuCtxPushCurrent(d->ctx));
    CUresult rc = cu->cuModuleLoadData(&d->module, gk_copy_fatbin);
    if (rc == GK_CUDA_SUCCESS)
        rc = cu->cuModuleGetFunction(&d->copy, d->module, GK_COPY_KERNEL);
    CUcontext popped;
    cu->cuCtxPopCurrent(&popped);
    if (rc != GK_CUDA_SUCCESS)
        return cu_failed("loading the copy kernel", rc);
    return 0;
}

/* The device, its context pushed as the calling thread's current one;
 * NULL when the device can't be used. Pair with dev_leave(). */
static const struct gpu_dev *dev_enter(const struct gk_cuda *cu, int ordinal)
{
    if (ordinal < 0 || ordinal >= GPU_MAX_DEVICES)
        return NULL;
    struct gpu_dev *d = &devs[ordinal];
    if (__atomic_load_n(&d->state, __ATOMIC_ACQUIRE) == 0) {
        pthread_mutex_lock(&devs_lock);
        if (d->state == 0)
            __atomic_store_n(&d->state, dev_open(cu, ordinal, d) ? -1 : 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&devs_lock);
    }
    if (d->state != 1 || cu->cuCtxPushCurrent(d->ctx) != GK_CUDA_SUCCESS)
        return NULL;
    return d;
}

static void dev_leave(const struct gk_cuda *cu)
{
    CUcontext popped;
    cu->cuCtxPopCurrent(&popped);
}

int gpu_thread_enter(int dev)
{
    const struct gk_cuda *cu = gk_cuda();
    return cu && dev_enter(cu, dev) ? 0 : GDRKV_E_INTERNAL;
}

/* The context work on no device in particular runs in: the caller's
 * current one, else device 0's primary context. */
static int enter_any(const struct gk_cuda *cu, int *pushed)
{
    CUcontext cur = NULL;
    *pushed = 0;
    if (cu->cuCtxGetCurrent(&cur) == GK_CUDA_SUCCESS && cur)
        return 0;
    if (!dev_enter(cu, 0))
        return GDRKV_E_INTERNAL;
    *pushed = 1;
    return 0;
}

/* ------------------------------------------------------------ lists */

static uint64_t units_of(uint64_t len)
{
    return (len + GPU_UNIT_BYTES - 1) / GPU_UNIT_BYTES;
}

int gpu_list_add(struct gpu_list *l, int dev, uint64_t dst, uint64_t src, uint64_t len)
{
    if (len == 0)
        return 0;
    if (dev < 0 || dev >= GPU_MAX_DEVICES)
        return GDRKV_E_INTERNAL;
    if (l->count && !l->apart) {
        struct gpu_piece *last = &l->pieces[l->count - 1];
        if (last->dev == dev && last->dst + last->len == dst && last->src + last->len == src &&
            last->len + len <= GK_MAX_OBJECT) {
            l->units += units_of(last->len + len) - units_of(last->len);
            last->len += len;
            l->bytes += len;
            return 0;
        }
    }
    if (gk_grow(&l->pieces, &l->cap, (size_t)l->count + 1, sizeof *l->pieces, 64) < 0)
        return GDRKV_E_INTERNAL;
    l->apart = 0;
    l->pieces[l->count++] = (struct gpu_piece){.dst = dst, .src = src, .len = len, .dev = dev};
    l->bytes += len;
    l->units += units_of(len);
    l->devices |= 1u << dev;
    return 0;
}

void gpu_list_reset(struct gpu_list *l)
{
    if (l->cap > 4096)
        gpu_list_free(l);
    l->count = 0;
    l->bytes = 0;
    l->units = 0;
    l->devices = 0;
    l->apart = 0;
}

void gpu_list_free(struct gpu_list *l)
{
    free(l->pieces);
    *l = (struct gpu_list){0};
}

/* ------------------------------------------------------------ host memory */

void *gpu_host_alloc(size_t bytes)
{
    const struct gk_cuda *cu = gk_cuda();
    void *p = NULL;
    int pushed;
    if (!cu || enter_any(cu, &pushed))
        return NULL;
    CUresult rc = cu->cuMemHostAlloc(&p, bytes ? bytes : 1,
                                     GK_CU_MEMHOSTALLOC_PORTABLE | GK_CU_MEMHOSTALLOC_DEVICEMAP);
    if (pushed)
        dev_leave(cu);
    if (rc != GK_CUDA_SUCCESS) {
        cu_failed("cuMemHostAlloc", rc);
        return NULL;
    }
    return p;
}

void gpu_host_free(void *p)
{
    const struct gk_cuda *cu = gk_cuda();
    int pushed;
    if (!p || !cu || enter_any(cu, &pushed))
        return;
    cu->cuMemFreeHost(p);
    if (pushed)
        dev_leave(cu);
}

int gpu_register_shared(const void *base, size_t len, int readonly, CUdeviceptr *dptr)
{
    const struct gk_cuda *cu = gk_cuda();
    int pushed;
    if (!cu || enter_any(cu, &pushed))
        return GDRKV_E_INTERNAL;
    CUresult rc = cu->cuMemHostRegister((void *)base, len,
                                        GK_CU_MEMHOSTREGISTER_PORTABLE |
                                        GK_CU_MEMHOSTREGISTER_DEVICEMAP |
                                        (readonly ? GK_CU_MEMHOSTREGISTER_READ_ONLY : 0));
    if (rc == GK_CUDA_SUCCESS) {
        rc = cu->cuMemHostGetDevicePointer(dptr, (void *)base, 0);
        if (rc != GK_CUDA_SUCCESS)
            cu->cuMemHostUnregister((void *)base);
    }
    if (pushed)
        dev_leave(cu);
    if (rc != GK_CUDA_SUCCESS) {
        GK_WARN("cannot register %zu bytes of shared memory (shm pool or staging) with CUDA: "
                "%s; GPU copies with it go through cuMemcpy instead", len, gk_cuda_strerror(rc));
        return GDRKV_E_INTERNAL;
    }
    return 0;
}

void gpu_unregister(const void *base)
{
    const struct gk_cuda *cu = gk_cuda();
    int pushed;
    if (!cu || enter_any(cu, &pushed))
        return;
    cu->cuMemHostUnregister((void *)base);
    if (pushed)
        dev_leave(cu);
}

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

int gpu_available(char *why, size_t len)
{
    const struct gk_cuda *cu = gk_cuda();
    int count = 0;
    if (!cu) {
        snprintf(why, len, "%s", gk_cuda_why());
        return 0;
    }
    if (cu->cuDeviceGetCount(&count) != GK_CUDA_SUCCESS || count == 0) {
        snprintf(why, len, "the CUDA driver sees no GPU");
        return 0;
    }
    snprintf(why, len, "CUDA driver %d, %d GPU(s)", cu->driver_version, count);
    return 1;
}

/* ------------------------------------------------------------ launches */

static int grow_descs(struct gpu_slot *s, uint64_t units)
{
    if (units <= s->desc_cap)
        return 0;
    uint64_t cap = GK_MAX(units, 2 * s->desc_cap);
    void *p = gpu_host_alloc(cap * sizeof *s->descs);
    if (!p)
        return GDRKV_E_INTERNAL;
    gpu_host_free(s->descs);
    s->descs = p;
    s->desc_cap = cap;
    return 0;
}

static int grow_ce(struct gpu_slot *s, uint64_t n)
{
    if (n <= s->ce_cap)
        return 0;
    uint64_t cap = GK_MAX(n, 2 * s->ce_cap);
    CUdeviceptr *d = realloc(s->ce_dsts, cap * sizeof *d);
    if (d)
        s->ce_dsts = d;
    CUdeviceptr *r = realloc(s->ce_srcs, cap * sizeof *r);
    if (r)
        s->ce_srcs = r;
    size_t *z = realloc(s->ce_sizes, cap * sizeof *z);
    if (z)
        s->ce_sizes = z;
    if (!d || !r || !z)
        return GDRKV_E_INTERNAL;
    s->ce_cap = cap;
    return 0;
}

/* One kernel launch for the pieces of device dev; descriptors from
 * s->descs[first]. Returns the units written, or a negative error. */
static int64_t launch_kernel(const struct gk_cuda *cu, const struct gpu_dev *d,
                             struct gpu_slot *s, const struct gpu_list *l, int dev,
                             uint64_t first, CUstream stream)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < l->count; i++) {
        const struct gpu_piece *p = &l->pieces[i];
        if (p->dev != dev)
            continue;
        for (uint64_t off = 0; off < p->len; off += GPU_UNIT_BYTES) {
            s->descs[first + n++] = (struct gk_copy_desc){
                .src = p->src + off, .dst = p->dst + off,
                .len = GK_MIN((uint64_t)GPU_UNIT_BYTES, p->len - off)};
        }
    }
    if (n == 0)
        return 0;
    if (n > UINT32_MAX)
        return GDRKV_E_TOO_LARGE;
    CUdeviceptr descs;
    CU_TRY(cu->cuMemHostGetDevicePointer(&descs, s->descs + first, 0));
    unsigned int count = (unsigned int)n;
    uint64_t warps_per_block = GK_COPY_THREADS / 32;
    uint64_t blocks = GK_MIN((n + warps_per_block - 1) / warps_per_block,
                             (uint64_t)d->sms * GPU_BLOCKS_PER_SM);
    void *params[] = {&descs, &count};
    CU_TRY(cu->cuLaunchKernel(d->copy, (unsigned int)blocks, 1, 1, GK_COPY_THREADS, 1, 1, 0,
                              stream, params, NULL));
    return (int64_t)n;
}

static int launch_copy_engine(const struct gk_cuda *cu, struct gpu_slot *s,
                              const struct gpu_list *l, int dev, CUstream stream, int mode,
                              struct gpu_stats *stats)
{
    size_t n = 0;
    for (uint32_t i = 0; i < l->count; i++) {
        const struct gpu_piece *p = &l->pieces[i];
        if (p->dev != dev)
            continue;
        s->ce_dsts[n] = p->dst;
        s->ce_srcs[n] = p->src;
        s->ce_sizes[n] = p->len;
        n++;
    }
    if (n == 0)
        return 0;
    struct gk_cu_memcpy_attributes attr = {.src_access_order = GK_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
    size_t attr_idx = 0, fail_idx = 0;
    CUresult rc = GK_CUDA_ERROR_INVALID_VALUE;
    if (mode == GPU_MODE_PER_PIECE)
        rc = GK_CUDA_ERROR_INVALID_VALUE;
    else if (cu->cuMemcpyBatchAsync_v2)
        rc = cu->cuMemcpyBatchAsync_v2(s->ce_dsts, s->ce_srcs, s->ce_sizes, n, &attr, &attr_idx,
                                       1, stream);
    else if (cu->cuMemcpyBatchAsync_v1)
        rc = cu->cuMemcpyBatchAsync_v1(s->ce_dsts, s->ce_srcs, s->ce_sizes, n, &attr, &attr_idx,
                                       1, &fail_idx, stream);
    if (rc == GK_CUDA_SUCCESS) {
        stats->copy_engine_calls++;
        return 0;
    }
    /* No batch call, or it refused these pointers: one copy per piece. */
    for (size_t i = 0; i < n; i++)
        CU_TRY(cu->cuMemcpyAsync(s->ce_dsts[i], s->ce_srcs[i], s->ce_sizes[i], stream));
    stats->copy_engine_calls += n;
    return 0;
}

static int use_copy_engine(int mode, const struct gpu_list *l)
{
    if (mode == GPU_MODE_COPY_ENGINE || mode == GPU_MODE_PER_PIECE)
        return 1;
    return mode == GPU_MODE_AUTO && l->count &&
           l->bytes / l->count >= GPU_AUTO_COPY_ENGINE_BYTES;
}

/* *at, the stream created there on first use (the device's context
 * current). Threads may race to create a shared one: one wins. */
static int stream_of(const struct gk_cuda *cu, CUstream *at, CUstream *out)
{
    CUstream made = NULL, none = NULL;
    *out = __atomic_load_n(at, __ATOMIC_ACQUIRE);
    if (*out)
        return 0;
    /* Blocking w.r.t. the legacy default stream, so work an engine
     * queued there (and did not synchronise) comes first. */
    CUresult r = cu->cuStreamCreate(&made, GK_CU_STREAM_DEFAULT);
    if (r != GK_CUDA_SUCCESS)
        return cu_failed("cuStreamCreate", r);
    if (__atomic_compare_exchange_n(at, &none, made, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        *out = made;
    } else {
        cu->cuStreamDestroy(made);
        *out = none;
    }
    return 0;
}

/* Launches device dev's pieces on its stream and records its event. */
static int launch_dev(const struct gk_cuda *cu, struct gpu_slot *s, const struct gpu_list *l,
                      int dev, int mode, uint64_t user_stream, struct gpu_serial *serial,
                      uint64_t *first_unit, struct gpu_stats *stats)
{
    const struct gpu_dev *d = dev_enter(cu, dev);
    int rc = 0;
    if (!d) {
        GK_WARN("GPU %d cannot be used (see the messages before)", dev);
        return GDRKV_E_INTERNAL;
    }
    CUstream stream = (CUstream)(uintptr_t)user_stream;
    if (!stream)
        rc = stream_of(cu, serial ? &serial->streams[dev] : &s->streams[dev], &stream);
    if (!rc && !s->events[dev]) {
        CUresult r = cu->cuEventCreate(&s->events[dev], GK_CU_EVENT_DISABLE_TIMING);
        if (r != GK_CUDA_SUCCESS)
            rc = cu_failed("cuEventCreate", r);
    }
    if (!rc) {
        if (use_copy_engine(mode, l)) {
            rc = launch_copy_engine(cu, s, l, dev, stream, mode, stats);
        } else {
            int64_t n = launch_kernel(cu, d, s, l, dev, *first_unit, stream);
            rc = n < 0 ? (int)n : 0;
            if (n > 0) {
                *first_unit += (uint64_t)n;
                stats->kernel_launches++;
            }
        }
    }
    if (!rc) {
        CUresult r = cu->cuEventRecord(s->events[dev], stream);
        if (r == GK_CUDA_SUCCESS)
            s->pending |= 1u << dev;
        else
            rc = cu_failed("cuEventRecord", r);
    }
    dev_leave(cu);
    return rc;
}

int gpu_slot_launch(struct gpu_slot *s, const struct gpu_list *l, int mode, uint64_t stream,
                    struct gpu_serial *serial, struct gpu_stats *stats)
{
    const struct gk_cuda *cu = gk_cuda();

    if (!cu)
        return GDRKV_E_INTERNAL;
    int rc = gpu_slot_wait(s);
    if (rc)
        return rc;
    if (use_copy_engine(mode, l) ? grow_ce(s, l->count) : grow_descs(s, l->units))
        return GDRKV_E_INTERNAL;
    uint64_t first_unit = 0;
    for (int dev = 0; dev < GPU_MAX_DEVICES && !rc; dev++)
        if (l->devices & (1u << dev))
            rc = launch_dev(cu, s, l, dev, mode, stream, serial, &first_unit, stats);
    if (!rc)
        stats->bytes += l->bytes;
    return rc;
}

int gpu_slot_wait(struct gpu_slot *s)
{
    const struct gk_cuda *cu = gk_cuda();
    int rc = 0;
    for (int dev = 0; s->pending && dev < GPU_MAX_DEVICES; dev++) {
        if (!(s->pending & (1u << dev)))
            continue;
        CUresult r = cu->cuEventSynchronize(s->events[dev]);
        if (r != GK_CUDA_SUCCESS && !rc)
            rc = cu_failed("the GPU copy", r);
        s->pending &= ~(1u << dev);
    }
    return rc;
}

int gpu_wait_stream(int dev, uint64_t stream)
{
    const struct gk_cuda *cu = gk_cuda();
    if (!cu || !dev_enter(cu, dev))
        return GDRKV_E_INTERNAL;
    CUresult r = cu->cuStreamSynchronize((CUstream)(uintptr_t)stream);
    dev_leave(cu);
    return r == GK_CUDA_SUCCESS ? 0 : cu_failed("waiting for the caller's stream", r);
}

int gpu_slot_poll(struct gpu_slot *s)
{
    const struct gk_cuda *cu = gk_cuda();
    for (int dev = 0; s->pending && dev < GPU_MAX_DEVICES; dev++) {
        if (!(s->pending & (1u << dev)))
            continue;
        CUresult r = cu->cuEventQuery(s->events[dev]);
        if (r == GK_CUDA_ERROR_NOT_READY)
            return 0;
        s->pending &= ~(1u << dev);
        if (r != GK_CUDA_SUCCESS)
            return cu_failed("the GPU copy", r);
    }
    return 1;
}

void gpu_serial_free(struct gpu_serial *q)
{
    const struct gk_cuda *cu = gk_cuda_if_loaded();
    for (int dev = 0; cu && dev < GPU_MAX_DEVICES; dev++) {
        if (q->streams[dev] && dev_enter(cu, dev)) {
            cu->cuStreamDestroy(q->streams[dev]);
            dev_leave(cu);
        }
    }
    *q = (struct gpu_serial){0};
}

void gpu_slot_free(struct gpu_slot *s)
{
    const struct gk_cuda *cu = gk_cuda();
    if (!cu)
        return;
    gpu_slot_wait(s);
    for (int dev = 0; dev < GPU_MAX_DEVICES; dev++) {
        if (!s->streams[dev] && !s->events[dev])
            continue;
        if (!dev_enter(cu, dev))
            continue;
        if (s->streams[dev])
            cu->cuStreamDestroy(s->streams[dev]);
        if (s->events[dev])
            cu->cuEventDestroy(s->events[dev]);
        dev_leave(cu);
    }
    gpu_host_free(s->descs);
    free(s->ce_dsts);
    free(s->ce_srcs);
    free(s->ce_sizes);
    *s = (struct gpu_slot){0};
}
