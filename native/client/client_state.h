/*
 * client_state.h - the structs the files of the client wing share, at the
 * bottom of the wing: one call taken apart into the keys grouped by server
 * (struct client_batch), the request/response exchanges that carry them
 * (struct client_frame), and the frames each connection carries in turn
 * (struct client_job). client_batch.c builds them, client_run.c drives
 * them, client_conn.c moves one frame at a time. The client object itself
 * is client.h's, the top of the wing.
 *
 * The wing, top to bottom:
 *   client.c          public API: options, server table, stats, entry points
 *   client_batch.c    a call -> checked, routed, striped keys -> jobs and frames
 *   client_run.c      connections for the jobs, the poll loop, health reports
 *   client_conn.c     one connection's non-blocking frame state machine
 *   client_iov.c      a frame's bytes as iovec windows over caller segments
 *   client_shm.c      shm: unix socket, HELLO, pool mapping, lease copy plans
 *   client_copy.c     shm: the copies, with helper threads for large frames
 *   client_chunks.c   chunk lists of LEASE/RESERVE answers laid over segments
 *   client_rdma.c     rdma: device, MRs, QPs per connection, READs and WRITEs
 *   client_server.c   one server: idle connection pool and health/backoff
 *   client_regions.c  registered memory ranges
 *   client_gpu.c      GPU segments of a call: staging, copy kernels, streams
 *   route.c           rendezvous hashing of keys to servers
 */
#ifndef GDRKV_CLIENT_STATE_H
#define GDRKV_CLIENT_STATE_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "common/protocol.h"

struct client_conn;
struct client_copier;
struct gdrkv_client;

struct client_batch {
    uint8_t opcode;
    const struct gk_ns *ns;

    /* The caller's arrays, indexed like the caller's keys. */
    const uint64_t *seg_ptrs;
    const uint64_t *seg_lens;
    const uint32_t *seg_counts;
    int64_t *results;

    /* The keys that go on the wire, grouped by server: position p is the
     * caller's key index[p]. Gathered so that a frame's keys are one run
     * the protocol encoder takes as is. */
    uint32_t *index;
    uint32_t *key_lens;
    uint64_t *sizes;        /* entry size: PUT value bytes, GET capacity, else 0 */
    uint64_t *first_seg;    /* the key's first entry in seg_ptrs/seg_lens */
    uint64_t *got;          /* GET: bytes the response carries for the key */
    uint8_t *keys;

    /* STATS copies the server's text here (NUL-terminated, truncated). */
    char *text;
    size_t text_cap;

    /* shm: the client's copy helpers. */
    struct client_copier *copier;
    /* The call's deadline, for the transports' synchronous steps (copies,
     * RDMA completions). */
    uint64_t deadline_ns;

    /* GPU segments of the call (gpu_client.h), or NULL when there are none. */
    struct gpu_call *gpu;

    /* Traffic of the call, added to the client's counters once at the end. */
    uint64_t bytes_sent;
    uint64_t bytes_received;
    uint64_t shm_bytes_copied;
    uint64_t shm_leases_expired;
};

/* One request and its response. */
struct client_frame {
    uint32_t first;         /* positions of its keys in the batch */
    uint32_t count;
    uint64_t key_off;       /* offset of its first key's bytes in batch->keys */
    uint32_t body_len;      /* request body bytes */
    uint64_t payload_len;   /* PUT: value bytes that follow the body */
    uint8_t *buf;           /* request header + body, then response header + body */
    size_t buf_cap;
    int64_t result;         /* keyless ops: CLEAR's count, STATS' text length, or an error */
};

/* The frames one connection carries, one after the other. */
struct client_job {
    uint32_t server;        /* index in the client's server table */
    struct client_frame *frames;
    uint32_t nframes;
    uint32_t done;          /* frames answered so far */
    struct client_conn *conn;
    int err;                /* why the frames from `done` on failed, or 0 */
    const char *why;        /* the same, for the log */
};

struct client_call {
    struct client_batch batch;
    struct client_job *jobs;    /* grouped by server, in server order */
    uint32_t njobs;
    struct pollfd *pollfds;     /* one per job, for the poll loop */
    uint64_t deadline_ns;
};

/* Whether an op's frames carry keys (CLEAR carries only the namespace). */
static inline int client_op_has_keys(uint8_t op)
{
    return op == GK_OP_EXISTS || op == GK_OP_GET || op == GK_OP_PUT || op == GK_OP_DELETE;
}

/* Results a successful response to a frame of `count` keys carries: one
 * per key, CLEAR's single count, none for PING and STATS. */
static inline uint32_t client_response_count(uint8_t op, uint32_t count)
{
    return client_op_has_keys(op) ? count : op == GK_OP_CLEAR ? 1 : 0;
}

/* Gives every key of f (or f itself, for keyless ops) the result err. */
static inline void client_frame_fail(struct client_batch *b, struct client_frame *f, int err)
{
    if (!client_op_has_keys(b->opcode)) {
        f->result = err;
        return;
    }
    for (uint32_t p = f->first; p < f->first + f->count; p++)
        b->results[b->index[p]] = err;
}

#endif
