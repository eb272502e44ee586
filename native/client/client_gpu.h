/*
 * client_gpu.h - GPU memory in the client's batch calls, on the tcp and
 * shm transports: which segments of a call are GPU memory, and the hooks
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
 */
#ifndef GDRKV_CLIENT_GPU_H
#define GDRKV_CLIENT_GPU_H

#include <stdint.h>

#include "gpu/gpu.h"

struct client_regions;
struct client_keys;
struct client_batch;
struct client_frame;
struct client_pool;
struct client_staging;
struct gk_copy_list;
struct gk_copier;

/* Largest frame payload of a call with GPU segments: bounds the pinned
 * staging each connection holds (two of these), and sets the grain at
 * which receiving and copying to the GPU overlap. */
#define GPU_FRAME_BYTES (32ull << 20)

struct gpu_call {
    const uint64_t *orig;   /* the caller's segment pointers */
    uint64_t *ptrs;         /* what the transports use: the caller's, except GPU
                               segments of socket frames, redirected into staging */
    int8_t *seg_dev;        /* per segment: GPU ordinal, or -1 for host memory;
                               NULL when every segment with bytes lies in one
                               GPU range */
    int device;             /* seg_dev NULL: that range's GPU ordinal */
    uint64_t nsegs;
    uint8_t *bad;           /* per key: a segment is GPU memory that can't be used
                               (NULL: none is; seg_dev NULL too) */
    int mode;               /* enum gpu_mode */
    uint64_t stream;        /* the caller's CUstream, or 0 */
    struct gpu_serial *serial;  /* where a PUT launches without the caller's stream: the
                                   client's PUT streams; NULL for a GET */
    struct gpu_stats stats;
    int error;              /* a GPU copy failed after its frame was answered */
};

/* For a GET or PUT call: classifies every segment against the client's
 * registered ranges, and returns NULL when none is GPU memory (nor bad);
 * mode is the client's enum gpu_mode; a PUT without a stream of the
 * caller's launches on put_streams. Keys with a segment in GPU memory that is
 * unregistered, freed since it was registered, or only partly inside a
 * registered range get GDRKV_E_INVALID in results and bad[i] = 1. *rc is
 * 0, or GDRKV_E_INTERNAL when out of memory (the call can't run). */
struct gpu_call *gpu_call_prepare(struct client_regions *regions, int mode, uint8_t op,
                                  const struct client_keys *k, struct gpu_serial *put_streams,
                                  int *rc);
void gpu_call_free(struct gpu_call *g);
/* For the NIC moving GPU memory itself (rdma): waits for the work queued
 * before the call on the caller's stream, or else on the legacy default
 * stream of every GPU the call touches. 0 or GDRKV_E_INTERNAL. */
int gpu_call_order(const struct gpu_call *g);

/* A segment's GPU ordinal, or -1 for host memory. (Segments without bytes
 * of a call in one GPU range count as that GPU's: nothing is copied for
 * them either way.) */
static inline int gpu_seg_device(const struct gpu_call *g, uint64_t seg)
{
    return !g ? -1 : g->seg_dev ? g->seg_dev[seg] : g->device;
}

/* Registration: whether [ptr, ptr + len) is GPU memory. 0 host (*device =
 * -1), 1 GPU (*device, *buffer_id set), GDRKV_E_INVALID when the range
 * mixes host and GPU memory or runs past its GPU allocation. */
int gpu_probe_region(uint64_t ptr, uint64_t len, int *device, uint64_t *buffer_id);

/* Per connection, created on first use. */
struct gpu_conn;

/* A frame starts on a connection. PUT: its GPU-sourced values are gathered
 * into staging now. GET over the socket (get_over_socket): its GPU-bound
 * segments are redirected into a staging buffer. 0 or a negative error. */
int gpu_conn_start(struct gpu_conn **gc, struct client_batch *b, const struct client_frame *f,
                   int get_over_socket);
/* A GET frame's values are all in staging: starts their copy to the GPU
 * (waited for by the next use of that buffer, or gpu_conn_drain). */
int gpu_conn_received(struct gpu_conn *gc, struct client_batch *b, const struct client_frame *f);
/* Where a LEASE's GPU-bound pieces are planned (dst: GPU, src: pool). */
struct gpu_list *gpu_conn_list(struct gpu_conn **gc);
/* Starts a LEASE's copies: the GPU list by one launch, the host pieces by
 * the CPU meanwhile; returns when the host ones are done and the launch is
 * queued. gpu_conn_copy_done then says when the GPU is done too, so the
 * call's other connections move on while the kernel runs. */
int gpu_conn_copy_leased(struct gpu_conn *gc, struct client_pool *pool, struct client_batch *b,
                         const struct gk_copy_list *host, struct gk_copier *copier);
/* Starts a PUT frame's copies into shared memory: the list (gpu_conn_list)
 * into the staging memfd (staging set) or a single-tenant pool's
 * reservations (staging NULL) by one launch, the host pieces by the CPU
 * meanwhile. Returns when the host ones are done: 0 when there was
 * nothing to launch, 1 when gpu_conn_copy_done must say when the GPU is
 * done too (the frame goes then), or a negative error. */
int gpu_conn_copy_put(struct gpu_conn *gc, struct client_staging *staging,
                      struct client_pool *pool, struct client_batch *b,
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
