/*
 * server_ops.h - the meaning of each request: store calls for a parsed
 * request and the response they produce.
 */
#ifndef GDRKV_SERVER_OPS_H
#define GDRKV_SERVER_OPS_H

#include <stddef.h>
#include <stdint.h>

struct server_conn;

/* A frame's header arrived. What the last frame left held in the store (a
 * LEASE's pins, a RESERVE's reservations) survives only into the frame
 * that ends it: a RELEASE of that lease, a COMMIT of exactly those keys.
 * Anything else lets it go first, so no frame ever reuses the arrays that
 * hold it. Returns 0, or GDRKV_E_PROTOCOL with the reason in why when the
 * frame contradicts its hold (a COMMIT of another count): the caller
 * refuses it and closes. */
int server_ops_frame_begin(struct server_conn *c, char *why, size_t len);
/* Whether this connection may run op at all: the op's reach (GK_OPS in
 * common/protocol.h). In-place ops need a peer that can reach the pool: a
 * local one that mapped it (shm), or one with QPs (rdma). Others are
 * skipped with UNSUPPORTED. */
int server_ops_allowed(const struct server_conn *c, uint8_t op);

/* Runs the request parsed into c against the store and prepares the
 * response; for PUT it reserves the objects and sets up reading the payload
 * into them instead. Returns 0, or GDRKV_E_INTERNAL when out of memory, or
 * SERVER_OPS_WAIT_ROOM for a write that must wait for the disk tier to
 * make room (store.h store_reserve_batch_or_wait): it holds nothing and
 * answered nothing, and runs again when the store's room hook or the
 * worker's tick says so (CONN_WAIT_ROOM), until opts.disk_full_wait_ms. */
#define SERVER_OPS_WAIT_ROOM 1
int server_ops_execute(struct server_conn *c);
/* PUT: the whole payload arrived; publish the objects and respond. */
int server_ops_finish_put(struct server_conn *c);
/* The response is written: a LEASE's pins become the connection's lease
 * (CONN_HOLDS_LEASE), a RESERVE's reservations wait for COMMIT
 * (CONN_HOLDS_COMMIT), their clocks starting now; whatever else the frame
 * holds is dropped. */
void server_ops_frame_done(struct server_conn *c);
/* Drops whatever c holds (server_state.h's enum server_conn_hold). */
void server_ops_release(struct server_conn *c);
/* Drops a lease or reservation held past its deadline; the RELEASE or
 * COMMIT that comes for it later is answered TIMEOUT. */
void server_ops_expire(struct server_conn *c, uint64_t now_ns);

#endif
