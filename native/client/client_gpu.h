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
