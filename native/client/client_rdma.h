/*
 * client_rdma.h - the client's side of the rdma transport.
 *
 * Client-wide (struct client_rdma): the device, opened on first need, and
 * one MR per registered memory range (host memory with ibv_reg_mr, GPU
 * memory through dma-buf). Only registered memory moves by RDMA; a frame
 * touching anything else goes over the control socket as before.
 *
 * Per connection (struct client_rdma_conn): the QPs made at connect time
 * by RDMA_HELLO over the control socket, and the server's pool regions.
 * A GET frame is a LEASE answered with chunk lists, then RDMA READs into
 * the caller's segments, then RELEASE; a PUT frame is a RESERVE answered
 * with chunk lists, then RDMA WRITEs from the caller's segments, then
 * COMMIT naming the keys whose bytes all arrived.
 */
#ifndef GDRKV_CLIENT_RDMA_H
#define GDRKV_CLIENT_RDMA_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "client_state.h"
#include "rdma/rdma_post.h"

struct client_mr {
    uint64_t ptr, len;
    void *mr;                       /* struct ibv_mr * */
    uint32_t lkey, rkey;
    int dmabuf_fd;                  /* GPU memory: the exported dma-buf, else -1 */
    int flush;                      /* READs into it need a flush READ (GPU before Hopper) */
};

/* When a batch of READs gets one more READ from its last destination, so
 * that their PCIe writes are visible to a GPU before the call returns. */
enum client_rdma_flush {
    CLIENT_RDMA_FLUSH_AUTO,         /* GPU memory of a GPU before Hopper */
    CLIENT_RDMA_FLUSH_ALWAYS,       /* every MR (GDRKV_IB_FLUSH=always: tests, odd hosts) */
    CLIENT_RDMA_FLUSH_NEVER
};

struct client_rdma {
    pthread_mutex_t lock;
    int state;                      /* 0 not tried, 1 open, -1 unavailable (why) */
    char why[300];
    void *dev;                      /* struct rdma_dev * */
    struct client_mr *mrs;
    uint32_t nmrs, cap;
    uint32_t qps_per_conn;          /* GDRKV_IB_QPS, default 4 */
    uint32_t sq_depth;              /* GDRKV_IB_SQ_DEPTH, default 512 */
    enum client_rdma_flush flush_mode;  /* GDRKV_IB_FLUSH: auto, always, never */
    /* Counters (CLIENT_RDMA_COUNTERS, client_state.h), relaxed atomics. */
#define CLIENT_RDMA_COUNTER_FIELD(name, help) uint64_t name;
    CLIENT_RDMA_COUNTERS(CLIENT_RDMA_COUNTER_FIELD)
#undef CLIENT_RDMA_COUNTER_FIELD
};

int client_rdma_init(struct client_rdma *r);
void client_rdma_destroy(struct client_rdma *r);
/* Registers [ptr, ptr + len) with the NIC: host memory with ibv_reg_mr,
 * GPU memory (device >= 0, its ordinal) through dma-buf, or with
 * ibv_reg_mr where nvidia-peermem makes that work. The first registration
 * opens the device, the one closest to that GPU when it is GPU memory.
 * 0 or a negative gdrkv_error. */
int client_rdma_register(struct client_rdma *r, uint64_t ptr, uint64_t len, int device);
void client_rdma_unregister(struct client_rdma *r, uint64_t ptr);

struct client_rdma_conn;

/* Creates a connection's QPs and writes the RDMA_HELLO request (request
 * id 1) into req (cap bytes; RDMA_HELLO_REQUEST_MAX is enough). 0 with
 * *out set; GDRKV_E_UNSUPPORTED when this host has no rdma. */
#define RDMA_HELLO_REQUEST_MAX 256
int client_rdma_conn_new(struct client_rdma *r, struct client_rdma_conn **out, uint8_t *req,
                         size_t cap, size_t *req_len);
/* The RDMA_HELLO answer (frame status and body): connects the QPs. 0;
 * GDRKV_E_UNSUPPORTED when the server has no rdma (the socket is still
 * good for plain frames); else an error. */
int client_rdma_conn_answer(struct client_rdma_conn *rc, int32_t status, const uint8_t *body,
                            size_t len);
void client_rdma_conn_close(struct client_rdma_conn *rc);

/* Whether every segment of frame f lies in registered memory, so the
 * frame can move by RDMA. */
int client_rdma_frame_ok(struct client_rdma_conn *rc, const struct client_batch *b,
                         const struct client_frame *f);

/* LEASE answered (lists/len: the chunk lists after the results): starts
 * the READs of every hit into its segments. 0, or GDRKV_E_PROTOCOL (bad
 * lists) / GDRKV_E_INTERNAL before anything was posted. Then
 * client_rdma_poll until it says the run is over, and client_rdma_end. */
int client_rdma_read(struct client_rdma_conn *rc, const uint8_t *lists, size_t len,
                     struct client_batch *b, const struct client_frame *f);
/* RESERVE answered: starts the WRITEs of the values of the keys whose
 * flags[k] is 1 (k = position in the frame); the flag of those that fail
 * is cleared. Same returns and steps as client_rdma_read. */
int client_rdma_write(struct client_rdma_conn *rc, const uint8_t *lists, size_t len,
                      struct client_batch *b, const struct client_frame *f, uint8_t *flags);
/* Posts what the QPs have room for and takes the completions that came,
 * without waiting: 1 when the run is over (or deadline_ns passed while it
 * waited), 0 while it goes on. */
int client_rdma_poll(struct client_rdma_conn *rc, uint64_t deadline_ns);
/* Ends the run: keys whose READs or WRITEs failed have their error.
 * Returns 0, or an error that ends the connection (its QPs broke, or the
 * deadline passed: the frame's keys that did not fail already must fail
 * with it). */
int client_rdma_end(struct client_rdma_conn *rc);

struct client_conn;
struct client_exchange;
/* The rdma exchange a connection's frame takes (a GET: lease, READs,
 * release; a PUT: reserve, WRITEs, commit) when every segment of the
 * frame is registered, or NULL: it goes plain, on the socket. c has QPs
 * (c->rdma set). */
const struct client_exchange *client_rdma_exchange(const struct client_conn *c);

#endif
