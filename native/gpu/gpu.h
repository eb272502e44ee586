/*
 * gpu.h - moving batches of scattered pieces to and from GPU memory: the
 * per-device state (primary context, the copy kernel loaded from the
 * embedded fatbin), pinned host buffers, and launch slots that run a list
 * of pieces as ONE kernel launch (or one cuMemcpyBatchAsync) per device.
 *
 * Every address is a unified virtual address the GPU can reach: device
 * memory, or host memory registered/allocated as mapped pinned memory
 * (the shm pool, staging buffers). Work runs in the primary context of
 * the device of its pieces, pushed around each step so the caller's own
 * current context is left as it was.
 *
 * The wing's files: cuda.c (the driver table), gpu.c (this header), and
 * gpu_api.c (the public gdrkv_gpu_* functions, with their globals).
 */
#ifndef GDRKV_GPU_H
#define GDRKV_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "cuda.h"
#include "gpu_kernels.h"

#define GPU_MAX_DEVICES 16

/* gdrkv_client_opts.gpu_copy (enum gdrkv_gpu_copy in gdrkv.h). */
enum gpu_mode {
    GPU_MODE_AUTO = 0,
    GPU_MODE_KERNEL = 1,
    GPU_MODE_COPY_ENGINE = 2,
    GPU_MODE_PER_PIECE = 3      /* one cuMemcpyAsync per piece: the baseline the bench shows */
};

/* Kernel units: pieces are cut into units of at most this many bytes, so
 * a big page spreads over many warps. */
#define GPU_UNIT_BYTES (32u << 10)
/* auto: pieces at least this large on average go to the copy engines,
 * which match the kernel from that size on (docs/gpu.md,
 * "`gpu_copy=kernel|copy_engine|auto`, and streams") without taking SMs or
 * HBM bandwidth from the engine. */
#define GPU_AUTO_COPY_ENGINE_BYTES (64u << 10)

struct gpu_piece {
    uint64_t dst;
    uint64_t src;
    uint64_t len;
    int dev;                /* the device whose context runs the copy */
};

/* Kept as pieces are added, so that a launch walks the pieces only once,
 * to write what it hands the GPU. */
struct gpu_list {
    struct gpu_piece *pieces;
    uint32_t count, cap;
    uint64_t bytes;
    uint64_t units;         /* kernel units (GPU_UNIT_BYTES) the pieces are cut into */
    uint32_t devices;       /* bit d: a piece runs on device d */
    int apart;              /* the next piece is not merged into the last */
};

/* Appends a piece (merged into the previous one when both ends continue
 * it, unless l->apart says not to: it is cleared); 0, or GDRKV_E_INTERNAL
 * (out of memory, or dev not a device). */
int gpu_list_add(struct gpu_list *l, int dev, uint64_t dst, uint64_t src, uint64_t len);
void gpu_list_reset(struct gpu_list *l);
void gpu_list_free(struct gpu_list *l);

/* What launches did, one line each: the client counts them as gpu_<name>
 * (client_state.h, CLIENT_COUNTERS). */
#define GPU_STATS(X)                                                                 \
    X(bytes)                /* bytes moved to or from GPU memory */                 \
    X(kernel_launches)                                                              \
    X(copy_engine_calls)

#define GPU_STATS_FIELD(name) uint64_t name;
struct gpu_stats {
    GPU_STATS(GPU_STATS_FIELD)
};

/* One launch at a time per slot: its descriptors stay readable by the GPU
 * until gpu_slot_wait() saw it finish. */
struct gpu_slot {
    struct gk_copy_desc *descs;     /* pinned, mapped host memory */
    uint64_t desc_cap;
    CUdeviceptr *ce_dsts, *ce_srcs; /* cuMemcpyBatchAsync arrays */
    size_t *ce_sizes;
    uint64_t ce_cap;
    CUstream streams[GPU_MAX_DEVICES];  /* created on first use */
    CUevent events[GPU_MAX_DEVICES];
    uint32_t pending;               /* devices with work in flight (bits) */
};

/* One stream per device, created on first use, that the slots of several
 * connections launch on so that their copies run one after another, in
 * launch order, rather than side by side. A PUT frame's copy is followed
 * by the server's copy of the same bytes: side by side, every frame's GPU
 * copy would end with the last, and the server's copies all start then. */
struct gpu_serial {
    CUstream streams[GPU_MAX_DEVICES];
};

/* Destroys the streams; after every slot that launched on them. */
void gpu_serial_free(struct gpu_serial *q);

/* Starts the copies of l: per device, one kernel launch or one batched
 * copy-engine call (mode), on stream (a CUstream of the caller), else on
 * serial's stream of the device (serial not NULL), else on the slot's own.
 * Waits for the slot's previous launch first. Returns 0 or
 * GDRKV_E_INTERNAL (logged). */
int gpu_slot_launch(struct gpu_slot *s, const struct gpu_list *l, int mode, uint64_t stream,
                    struct gpu_serial *serial, struct gpu_stats *stats);
/* Waits until the slot's launches finished; 0 or GDRKV_E_INTERNAL. */
int gpu_slot_wait(struct gpu_slot *s);
/* Whether they have: 1 finished, 0 still running, GDRKV_E_INTERNAL. */
int gpu_slot_poll(struct gpu_slot *s);

/* Waits for the work queued on stream (a CUstream of the caller, or 0 for
 * the legacy default stream of device dev's primary context): what the
 * NIC reads or writes directly (rdma) must come after it. 0 or
 * GDRKV_E_INTERNAL. */
int gpu_wait_stream(int dev, uint64_t stream);
/* Waits, then frees what the slot holds. */
void gpu_slot_free(struct gpu_slot *s);

/* Pinned host memory mapped into every context; NULL on failure. */
void *gpu_host_alloc(size_t bytes);
void gpu_host_free(void *p);

/* Registers [base, base + len) (a shared mapping; readonly when the
 * mapping is) as mapped pinned memory of every context; *dptr is where
 * the GPU reaches base. 0 or a negative gdrkv_error. */
int gpu_register_shared(const void *base, size_t len, int readonly, CUdeviceptr *dptr);
void gpu_unregister(const void *base);
/* Makes device dev's primary context the calling thread's current one for
 * the rest of its life (a thread of gdrkv's own that works for that
 * device); 0 or GDRKV_E_INTERNAL. */
int gpu_thread_enter(int dev);

/* Registration's probe: whether [ptr, ptr + len) is GPU memory. 0 host
 * (*device = -1), 1 GPU (*device, *buffer_id: CUDA's id of the allocation
 * set), GDRKV_E_INVALID when the range mixes host and GPU memory or runs
 * past its GPU allocation. */
int gpu_probe_region(uint64_t ptr, uint64_t len, int *device, uint64_t *buffer_id);

/* Whether CUDA can be used here (1) or not (0, with why). */
int gpu_available(char *why, size_t len);

#endif
