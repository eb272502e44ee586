/*
 * server_rdma.h - the server's side of the rdma transport. The pool is
 * registered once at start, split at the device's largest MR; a client
 * connection turns into an rdma one with RDMA_HELLO, which creates its
 * QPs. From then on its GETs are LEASEs (the client READs the chunks) and
 * its PUTs are RESERVE + COMMIT (the client WRITEs into the reserved
 * chunks in between); data never crosses the socket.
 *
 * Memory safety towards the store: before anything a connection's QPs
 * could still write into is given back (reservations aborted or expired,
 * connection closed), its QPs are moved to ERR, so a late WRITE is refused
 * by the NIC instead of landing in another object.
 */
#ifndef GDRKV_SERVER_RDMA_H
#define GDRKV_SERVER_RDMA_H

#include <stddef.h>

#include <stdint.h>

struct gdrkv_server;
struct gk_text;
struct rdma_endpoint;
struct rdma_region;
struct server_conn;

/* mode: -1 when available, 0 off, 1 required (failure stops the start).
 * Returns 0 or a negative gdrkv_error with the reason in err. */
int server_rdma_start(struct gdrkv_server *s, int mode, char *err, size_t errlen);
void server_rdma_stop(struct gdrkv_server *s);

/* RDMA_HELLO's resources (server_ops.c speaks the protocol): the
 * connection's QPs, made and connected to peer's after negotiating what
 * both sides can do (peer is adjusted to it; mine is the server's side to
 * send back). 0, or a gdrkv_error with the reason in *why
 * (GDRKV_E_INTERNAL: out of memory). */
int server_rdma_conn_create(struct server_conn *c, struct rdma_endpoint *peer,
                            struct rdma_endpoint *mine, const char **why);
/* The pool's registered regions, for the RDMA_HELLO answer. */
const struct rdma_region *server_rdma_regions(const struct gdrkv_server *s, uint32_t *n);
/* Counts an RDMA_HELLO answered with QPs (accepted) or refused. */
void server_rdma_count_hello(const struct gdrkv_server *s, int accepted);
/* Whether the connection has QPs (LEASE, RESERVE and COMMIT need them). */
int server_rdma_conn_active(const struct server_conn *c);
/* Stops the connection's QPs: no peer access from now on. */
void server_rdma_conn_kill(struct server_conn *c);
void server_rdma_conn_destroy(struct server_conn *c);

void server_rdma_stats(const struct gdrkv_server *s, struct gk_text *t);

#endif
