/*
 * client_gpu.h - GPU memory in the client's batch calls, on the tcp and
 * shm transports: per connection, the staging and launch slots, and the hooks
 * the transports call so those segments move through the GPU copy paths
 * (gpu.h) instead of memcpy/readv/sendmsg:
 *
 *   shm GET   the LEASE's pieces bound for GPU memory are copied from the
 *             pool (registered once as mapped, read-only pinned memory)
 *             by one kernel launch per frame, while the CPU copies the
 *             host pieces; RELEASE goes only after the kernel finished.
 *   tcp GET   a frame's GPU-bound values land in one of two pinned staging
 *             buffers of the connection; once the frame is in, one launch
 *             moves them to the GPU while the next frame is received into
 *             the other buffer.
 *   shm PUT   a frame's GPU-sourced values are gathered by one launch
 *             straight into the connection's staging memfd (registered
 *             once as mapped pinned memory), or on a single-tenant server
 *             into the reservations in the pool, while the CPU copies the
 *             host ones; the frame goes once both are done.
 *   tcp PUT   a frame's GPU-sourced values are first gathered into pinned
 *             staging by one launch, then sent from there.
 *
 * A call with no GPU segment never gets here: its batch has gpu == NULL.
 * Which segments are GPU memory is client_gpu_call.h's; the public
 * gdrkv_gpu_* functions are the gpu wing's (gpu/gpu_api.c).
 */
#ifndef GDRKV_CLIENT_GPU_H
#define GDRKV_CLIENT_GPU_H

#include <stdint.h>

#include "client_gpu_call.h"
#include "gpu/gpu.h"

struct client_batch;
struct client_frame;
struct client_pool;
struct client_staging;
struct gk_copy_list;
struct gk_copier;

/* Per connection, created on first use. */
struct gpu_conn;

/* A socket frame of a GPU call starts on a connection. PUT: its
 * GPU-sourced values are gathered into staging now. GET: its GPU-bound
 * values are to be received into a staging buffer. When the frame has GPU
 * segments, *seg_ptrs is set to the connection's table of where the
 * socket moves each segment of the frame (the caller's address, or its
 * place in staging), by the call's segment index; else it is left as is.
 * 0 or a negative error. */
int gpu_conn_start(struct gpu_conn **gc, struct client_batch *b, const struct client_frame *f,
                   const uint64_t **seg_ptrs);
/* A GET frame's values are all in staging: starts their copy to the GPU
 * (waited for by the next use of that buffer, or gpu_conn_drain). */
int gpu_conn_received(struct gpu_conn *gc, struct client_batch *b, const struct client_frame *f);
/* Where a shm frame's GPU pieces are planned. */
struct gpu_list *gpu_conn_list(struct gpu_conn **gc);
/* Where the GPU reaches a shared mapping (the pool, or a connection's
 * staging memfd) for one frame's pieces, and how the frame's launch
 * copies (mode). Resolved at the frame's first GPU piece, so the pieces
 * are planned once, already addressed for the GPU.
 *
 * The pool is registered with CUDA in slices, on demand, by a thread of
 * its own (gpu/gpu_slices.h): a piece in a registered slice is reached at
 * its device address; one in a slice not registered yet at its host
 * address, and then the whole frame goes by the copy engines, which stage
 * pageable memory themselves, so no call waits for a registration.
 * Staging is registered whole on its first GPU copy (its first 8 MiB);
 * a frame past that goes by the copy engines too. dev: the device of the
 * frame's first GPU piece, whose context registers the pool. */
/* The pool slices a connection's launch holds (gpu_slices_hold), let go
 * once it is over: kept only where the pool's slices may be evicted. */
struct gpu_held {
    struct gpu_slices *slices;
    uint32_t *index;
    uint32_t count, cap;
};

struct gpu_reach {
    struct client_pool *pool;       /* the mapping: the pool, or else */
    struct gpu_held *held;          /* pool: where the slices it uses are held */
    struct client_staging *staging; /* ...the connection's staging, for */
    uint64_t frame_bytes;           /* ...a frame of this many bytes */
    int resolved;
    uint64_t base;                  /* host address (pool), or device or host (staging) */
    struct gpu_slices *slices;      /* the pool's, or NULL */
    uint64_t now_ns;                /* when resolved: the held slices' use */
    int mode;                       /* enum gpu_mode */
};
/* The connection's held slices, for a frame's gpu_reach of the pool. */
struct gpu_held *gpu_conn_held(struct gpu_conn *gc);
void gpu_reach_resolve(struct gpu_reach *r, const struct gpu_call *g, int dev);
/* Adds the GPU's copy between caller (a GPU segment's address on device
 * dev) and [off, off + len) of the mapping to list, in the direction
 * to_caller says; it is cut where it would span two of the pool's
 * slices, which no CUDA copy may. 0 or GDRKV_E_INTERNAL. */
int gpu_reach_add(struct gpu_reach *r, struct gpu_list *list, int dev, uint64_t caller,
                  uint64_t off, uint64_t len, int to_caller);

/* Starts a frame's copies between the caller's segments and a shared
 * mapping: the list (gpu_conn_list, addressed as gpu_reach says) by one
 * launch in mode, the host pieces by the CPU meanwhile. Returns when the
 * host ones are done: 0 when there was nothing to launch, 1 when
 * gpu_conn_copy_done must say when the GPU is done too (the call's other
 * connections move on meanwhile), or a negative error. */
int gpu_conn_copy_shared(struct gpu_conn *gc, struct client_batch *b, int mode,
                         const struct gk_copy_list *host, struct gk_copier *copier);
/* 1 when the connection's launch (a LEASE's, or a PUT's) finished, 0
 * while it runs, or an error. */
int gpu_conn_copy_done(struct gpu_conn *gc);
/* Waits for the connection's copies in flight; 0 or a negative error. */
int gpu_conn_drain(struct gpu_conn *gc);
void gpu_conn_free(struct gpu_conn *gc);

/* Drop a pool's or a staging memfd's CUDA registration (before it is
 * unmapped). */
void gpu_pool_release(struct client_pool *pool);
void gpu_staging_release(struct client_staging *st);

#endif
