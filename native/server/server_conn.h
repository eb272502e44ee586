/*
 * server_conn.h - one client connection of the server: a non-blocking
 * state machine that reads a frame (header, body, and for PUT the payload
 * straight into reserved pool chunks), has it executed (server_ops.c), and
 * writes the response (for GET the values straight from pinned chunks).
 * A connection belongs to the worker that accepted it and is only ever
 * touched by that worker's thread.
 *
 * A local connection (unix socket) may also use the shm transport: HELLO
 * passes it the pool's fd, and a LEASE's pins outlive the frame as the
 * connection's lease, until RELEASE, the next frame, the lease timeout or
 * the connection's end.
 *
 * Any connection may become an rdma one (server_rdma.h): RDMA_HELLO gives
 * it QPs, and a RESERVE's reservations outlive the frame until COMMIT.
 */
#ifndef GDRKV_SERVER_CONN_H
#define GDRKV_SERVER_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "common/protocol.h"
#include "server.h"
#include "server_payload.h"

enum server_conn_state {
    CONN_READ_HDR,          /* between frames, or part of a header read */
    CONN_READ_BODY,
    CONN_SKIP,              /* dropping body and payload of a frame we can't serve */
    CONN_READ_PAYLOAD,      /* PUT values, into reserved chunks */
    CONN_WRITE              /* response, then GET values from pinned chunks */
};

/* What the frame in progress holds in the store. Released when the frame
 * ends or the connection dies, whichever comes first. */
enum server_conn_hold {
    CONN_HOLDS_NOTHING,
    CONN_HOLDS_PINS,        /* GET objects being sent, or LEASE objects being described */
    CONN_HOLDS_RESERVATIONS,/* PUT objects being received */
    CONN_HOLDS_LEASE        /* LEASE objects the client copies from the pool */
};

/* The per-key arrays of the frame in progress; they keep the largest size
 * seen so far (at most GK_MAX_KEYS entries). */
struct server_batch {
    uint32_t cap;
    struct gk_entry *entries;
    struct store_obj **objs;
    uint64_t *sizes;
    int32_t *status;
};

struct server_conn {
    int fd;
    struct server_worker *worker;
    struct server_conn *prev, *next; /* the worker's list */
    enum server_conn_state state;
    enum server_conn_hold holds;
    uint32_t events;                /* epoll interest registered now */
    int local;                      /* on the unix socket: shm allowed */
    int close_after_write;          /* the stream can't be trusted past this frame */
    int frame_executed;             /* counts in the per-op stats once written */
    int runnable;                   /* stopped at the step bound with work left */
    uint64_t last_progress_ns;      /* last time a byte moved: stall detection */
    uint64_t frame_start_ns;        /* header complete: op latency */

    uint8_t hdr_raw[GK_HDR_SIZE];
    uint32_t hdr_got;
    struct gk_hdr req;

    uint8_t *body;
    size_t body_cap;
    uint32_t body_got;
    uint64_t skip_left;

    struct gk_ns ns;                /* points into body */
    struct server_batch batch;
    struct server_payload payload;

    uint8_t *out;                   /* response header + body */
    size_t out_cap, out_len, out_sent;
    int pass_fd;                    /* sent with the response's first byte, or -1 */

    uint32_t lease_count;           /* keys of the lease or RESERVE (batch.objs) */
    uint64_t lease_bytes;           /* their bytes: a big transfer gets longer */
    uint64_t lease_deadline_ns;
    int lease_expired;              /* dropped by the timeout; RELEASE/COMMIT say so */
    int reserved_for_rdma;          /* the reservations are a RESERVE's, awaiting COMMIT */
    struct server_rdma_conn *rdma;  /* QPs, after RDMA_HELLO */
};

/* Takes over an accepted socket. Returns 0, or -1 with fd left to the caller. */
int server_conn_open(struct server_worker *w, int fd, int local);
/* Runs the state machine as far as the socket allows (bounded, so one busy
 * client can't starve the others); may close and free c. A connection
 * stopped by the bound is marked runnable (and its worker too): the worker
 * must run it again without waiting for an event, which may never come. */
void server_conn_on_event(struct server_conn *c);
/* Mid-frame and no byte moved for the server's stall timeout. */
int server_conn_stalled(const struct server_conn *c, uint64_t now_ns);
/* Drops a lease held past its deadline. */
void server_conn_expire_lease(struct server_conn *c, uint64_t now_ns);
/* Releases what the frame holds in the store, closes and frees c. */
void server_conn_close(struct server_conn *c);

/* Starts the response to the current request: encodes the header and
 * returns where its body_len body bytes go, or NULL when out of memory. */
uint8_t *server_conn_response(struct server_conn *c, int32_t status, uint32_t count,
                              uint32_t body_len, uint64_t payload_len);
/* A response that refuses the whole frame: status code, msg as the body.
 * 0, or GDRKV_E_INTERNAL when out of memory. */
int server_conn_error(struct server_conn *c, int32_t code, const char *msg, size_t len);

#endif
