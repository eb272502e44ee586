/*
 * client_conn.h - one client connection to a store server: a non-blocking
 * state machine that sends a frame (header and body from the frame's
 * buffer, PUT values from the caller's segments) and receives its response
 * (header and body, then GET values straight into the caller's segments).
 * The caller polls the fd for client_conn_events() and calls
 * client_conn_progress() when it is ready; one frame is in flight at a time.
 *
 * A connection is owned by one thread at a time: the call that checked it
 * out of its server's idle pool.
 *
 * Over shm (a unix socket, with the server's pool mapped) a GET goes out as
 * a LEASE: the answer says where the objects are in the pool, the values
 * are copied from there into the caller's segments, and a RELEASE confirms
 * the objects stayed pinned throughout, or fails the frame's keys. A PUT
 * goes out as PUT_STAGED, its values copied into the connection's staging
 * memfd first and from there by the server into the pool; on a
 * single-tenant server as RESERVE, copies into the reserved chunks, then
 * COMMIT.
 *
 * Over rdma (a tcp control connection with QPs, client_rdma.h) a GET whose
 * segments are all registered goes out as a LEASE too, its objects READ
 * by the NIC; such a PUT goes out as RESERVE, its values WRITTEN into the
 * reserved chunks, then COMMIT. Other frames travel on the socket.
 *
 * Which of these exchanges a frame is (plain, shm lease, shm staged, shm
 * reserve/commit, rdma lease, rdma reserve/commit) is chosen once when it
 * begins (struct client_exchange, client_frame.h): each transport owns its
 * exchanges and their handlers (the plain one here, the others in
 * client_shm.c and client_rdma.c), and this file keeps connect, send,
 * receive and the header checks.
 */
#ifndef GDRKV_CLIENT_CONN_H
#define GDRKV_CLIENT_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "client_state.h"
#include "common/copy.h"
#include "client_iov.h"
#include "common/net.h"
#include "common/protocol.h"

enum client_conn_phase {
    CLIENT_CONN_CONNECTING,     /* tcp connect in progress; then set-up, then SEND */
    CLIENT_CONN_SEND,           /* request header, body, PUT values */
    CLIENT_CONN_RECV_HEAD,      /* response header and body (rdma: first RDMA_HELLO's) */
    CLIENT_CONN_RECV_PAYLOAD,   /* GET values */
    CLIENT_CONN_WAIT            /* an exchange's asynchronous step runs (shm: a GPU
                                   launch; rdma: READs or WRITEs), polled; then
                                   RELEASE, COMMIT or the PUT_STAGED request goes */
};

/* A PUT_STAGED frame the server follows (client_shm.c, follows()). */
enum client_conn_follow {
    FOLLOW_NONE,
    FOLLOW_TO_COPY,             /* its values are copied once the request is sent */
    FOLLOW_SENT                 /* copied: the answer may send the frame back */
};

/* A PINS request: header and report. */
#define CLIENT_PINS_REQUEST (GK_HDR_SIZE + GK_PINS_BODY_SIZE)

struct client_exchange;
struct client_pool;
struct gpu_conn;

struct client_conn {
    int fd;                     /* -1 once a failed set-up closed it */
    struct client_endpoint *ep;
    struct gk_connecting *connecting;   /* the tcp connect in progress, or NULL */
    uint64_t connect_deadline_ns;       /* ...and when it must be done, set-up included */
    uint64_t next_req_id;
    uint64_t idle_since_ns;     /* when it went back to its server's idle stack */
    struct client_pool *pool;   /* shm: the server's pool, mapped; NULL over tcp */
    struct client_staging staging;  /* shm: where PUT values go for the server */
    struct gk_copy_list copies; /* shm: the current frame's copies */
    struct client_rdma_conn *rdma;  /* rdma: QPs and the server's regions; else NULL */
    int rdma_broken;            /* a QP failed: finish the frame, then close */
    int rdma_only;              /* transport rdma: no plain frames if the set-up fails */
    int hello_pending;          /* RDMA_HELLO sent, its answer not read yet */
    uint8_t *commit;            /* rdma: the COMMIT request (header + flags) */
    size_t commit_cap;
    struct gpu_conn *gpu;       /* GPU staging and copies (client_gpu.h), on first use */
    int start_err;              /* the frame's values could not be put in place
                                   (GPU staging, shm staging): fail it */

    /* The frame in flight. */
    enum client_conn_phase phase;
    struct client_batch *batch;
    struct client_frame *frame;
    const struct client_exchange *ex;   /* how it travels, chosen when it begins */
    const uint64_t *seg_ptrs;   /* where the socket moves its values: the call's
                                   segments, or a GPU call's table (gpu_conn_start) */
    uint64_t req_id;            /* the request whose answer is awaited */
    uint8_t wire_op;            /* its op: the batch's, or LEASE, RELEASE, RESERVE,
                                   COMMIT, RDMA_HELLO */
    int (*answer)(struct client_conn *c);   /* takes that answer once it is in */
    uint8_t release[GK_HDR_SIZE];   /* the RELEASE request */
    uint8_t pins[CLIENT_PINS_REQUEST];  /* a PINS report, before a frame (client_shm.h) */
    struct gk_hdr resp;
    int resp_decoded;
    size_t got;                 /* response header + body bytes received */
    uint8_t *body;              /* where the response body goes */
    uint8_t *body_heap;         /* ...when it doesn't fit the frame buffer (kept
                                   through a WAIT step, which may read it) */
    const char *why;            /* what failed, for the log */
    uint64_t leased_bytes;      /* WAIT: a shm LEASE's bytes, counted once copied */
    int unanswered;             /* the request being sent gets no answer: it ends the frame */
    enum client_conn_follow follow;
    struct client_iov io;
};

/* A connection to the endpoint: over shm where it has a unix socket that
 * answers (connected and set up within deadline_ns before this returns),
 * else tcp, unless it is shm only. A tcp one comes back connecting: the
 * poll loop finishes the connect, the handshake and RDMA_HELLO before its
 * first frame (client_conn_connect_deadline bounds them). NULL with *err =
 * GDRKV_E_TIMEOUT, GDRKV_E_UNAVAILABLE, GDRKV_E_DENIED or
 * GDRKV_E_INTERNAL. */
struct client_conn *client_conn_open(struct client_endpoint *ep, uint64_t deadline_ns,
                                     int *err);
/* Whether its tcp connect is still in progress, and until when it may be
 * (0: not connecting). */
int client_conn_connecting(const struct client_conn *c);
uint64_t client_conn_connect_deadline(const struct client_conn *c);
void client_conn_close(struct client_conn *c);
int client_conn_is_shm(const struct client_conn *c);
/* Waits for the connection's GPU copies still in flight (a socket GET's
 * last frames): 0, or a negative error when one failed. */
int client_conn_gpu_drain(struct client_conn *c);

/* Whether an idle connection can carry a frame: the server has neither
 * closed it (restart, idle timeout) nor sent anything unasked. */
int client_conn_usable(const struct client_conn *c);
/* Whether a connection that finished its frames may go back to the idle
 * pool: not one whose QPs broke. */
int client_conn_reusable(const struct client_conn *c);

void client_conn_start(struct client_conn *c, struct client_batch *b, struct client_frame *f);
/* POLLOUT while sending, POLLIN while receiving, nothing while a GPU copy
 * runs: client_conn_busy() then says to call client_conn_progress again
 * without waiting for the socket. */
short client_conn_events(const struct client_conn *c);
int client_conn_busy(const struct client_conn *c);
/* Moves what the socket allows. Returns 1 when the frame is answered (its
 * results are written and the connection is ready for the next frame), 0
 * when it waits for the socket, or a negative gdrkv_error when the
 * connection failed (c->why says how): it must then be closed, and the
 * frame's results are for the caller to set. */
int client_conn_progress(struct client_conn *c);

#endif
