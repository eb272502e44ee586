/*
 * server_ops.h - the meaning of each request: store calls for a parsed
 * request and the response they produce.
 */
#ifndef GDRKV_SERVER_OPS_H
#define GDRKV_SERVER_OPS_H

struct server_conn;

/* Runs the request parsed into c against the store and prepares the
 * response; for PUT it reserves the objects and sets up reading the payload
 * into them instead. Returns 0, or GDRKV_E_INTERNAL when out of memory. */
int server_ops_execute(struct server_conn *c);
/* PUT: the whole payload arrived; publish the objects and respond. */
int server_ops_finish_put(struct server_conn *c);
/* The response is written: a LEASE's pins become the connection's lease
 * (its clock starts now); whatever else the frame holds is dropped. */
void server_ops_frame_done(struct server_conn *c);
/* Drops the pins, reservations or lease c holds. */
void server_ops_release(struct server_conn *c);

#endif
