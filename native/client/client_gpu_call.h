/*
 * client_gpu_call.h - which segments of a GET or PUT call are GPU memory,
 * decided once per call against the client's registered ranges (struct
 * gpu_call, the batch's gpu). The transports ask gpu_seg_device() and
 * never classify a segment themselves.
 */
#ifndef GDRKV_CLIENT_GPU_CALL_H
#define GDRKV_CLIENT_GPU_CALL_H

#include <stdint.h>

#include "gpu/gpu.h"

struct client_regions;
struct client_keys;

/* Largest frame payload of a call with GPU segments: bounds the pinned
 * staging each connection holds (two of these), and sets the grain at
 * which receiving and copying to the GPU overlap. */
#define GPU_FRAME_BYTES (32ull << 20)

struct gpu_call {
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

#endif
