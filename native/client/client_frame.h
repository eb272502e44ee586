/*
 * client_frame.h - what every exchange of a connection's frame is built
 * from, below the transports that own the exchanges (client_conn.c the
 * plain one, client_shm.c and client_rdma.c theirs): the exchange table's
 * row type, and the helpers that encode a request, await an answer, read
 * a success answer's results and chunk lists, and send a follow-up.
 *
 * Nothing here calls up into client_conn.c, client_shm.c or
 * client_rdma.c: those call down into it.
 */
#ifndef GDRKV_CLIENT_FRAME_H
#define GDRKV_CLIENT_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "client_conn.h"
#include "client_state.h"
#include "common/protocol.h"

/* How a frame travels, chosen once when it begins (client_conn.c,
 * choose_exchange) from the connection's transport and the call: every
 * decision that depends on the exchange is a column here, so no step
 * tests which exchange it is in. */
struct client_exchange {
    uint8_t request;        /* the request's op; 0: the batch's own */
    /* Puts the frame's values in place before its request goes: 0, or a
     * negative error that fails the frame. It may set c->follow (the
     * request goes first, its values after it) or enter
     * CLIENT_CONN_WAIT (the request goes once the launch is done).
     * NULL: nothing to do. */
    int (*begin)(struct client_conn *c);
    int (*answer)(struct client_conn *c);   /* the request's success answer */
    uint8_t followup;       /* 0: the answer ends the frame */
    int (*followup_answer)(struct client_conn *c);
    /* The asynchronous step an answer (or begin) started, entering
     * CLIENT_CONN_WAIT: a GPU launch, rdma READs or WRITEs. poll says
     * whether it is over (1), still runs (0) or failed (negative); waited
     * then does what follows. NULL: the exchange has no such step. */
    int (*poll)(struct client_conn *c);
    int (*waited)(struct client_conn *c);
    /* A GET's payload is all in from the socket: 0 or a negative error.
     * NULL: nothing to do. */
    int (*received)(struct client_conn *c);
};

/* Encodes the request of frame f, op on the wire, into f->buf. */
void client_frame_encode(const struct client_batch *b, const struct client_frame *f,
                         uint8_t opcode, uint64_t req_id, uint16_t flags);
/* Readies the reader for the answer to request req_id, op on the wire,
 * which answer will take once its header and body are in. */
void client_frame_expect(struct client_conn *c, uint8_t op, uint64_t req_id,
                         int (*answer)(struct client_conn *c));
/* Sends the exchange's follow-up (RELEASE, COMMIT) from buf: its header,
 * encoded here with flags, and body_len bytes already in place after it. */
void client_frame_send_followup(struct client_conn *c, uint8_t *buf, uint32_t count,
                                uint32_t body_len, uint16_t flags);

/* Fails the connection: the answer breaks the protocol (why, logged). */
int client_frame_broken(struct client_conn *c, const char *why);
/* The result of the frame's k-th key, from a success answer's body. */
struct gk_result client_frame_key_result(const struct client_conn *c, uint32_t k);
/* A LEASE's or RESERVE's chunk lists: the body after the results. */
const uint8_t *client_frame_chunk_lists(const struct client_conn *c, size_t *len);
/* Writes the keys' results and gives *payload the GET bytes they announce,
 * each checked against its destination before any value is read. */
int client_frame_take_results(struct client_conn *c, uint64_t *payload);
/* A RESERVE answered: flags (the COMMIT request's body, one byte per key
 * of the frame) set for the keys reserved, whose values go now into the
 * chunks *lists (len bytes) describe; the others get their result. */
int client_frame_take_reservations(struct client_conn *c, uint8_t **flags, const uint8_t **lists,
                                   size_t *len);

/* A plain frame answered (the plain exchange's, and a PUT_STAGED's): the
 * keys' results (a GET's values follow in the payload), CLEAR's count,
 * STATS' text, or PING's nothing. */
int client_frame_take_plain(struct client_conn *c);

/* The answers shm and rdma exchanges share: RELEASE's (the lease held, or
 * the frame's keys fail) and COMMIT's. Both end the frame (1) or fail the
 * connection. */
int client_frame_end_lease(struct client_conn *c);
int client_frame_take_commit(struct client_conn *c);

#endif
