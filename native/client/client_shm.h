/*
 * client_shm.h - the client's side of the shm transport: connecting to a
 * server's unix socket, the HELLO that brings the pool's memfd, the
 * read-only mapping of the pool that every connection to that server
 * shares, the connection's staging memfd for PUT values, and the shm
 * exchanges: a LEASE's copies out of the pool, a PUT's into staging (or,
 * on a single-tenant server, into its reservations in the pool), each
 * planned in one pass over its pieces.
 */
#ifndef GDRKV_CLIENT_SHM_H
#define GDRKV_CLIENT_SHM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "client_state.h"
#include "common/copy.h"

struct client_conn;
struct client_exchange;

/* Connects to the endpoint's unix socket and maps its pool (shared with
 * the endpoint's other connections) and the connection's staging memfd
 * (staging->base NULL when the server gave none): returns the connected,
 * non-blocking fd with *pool referenced, or a negative gdrkv_error. */
int client_shm_connect(struct client_endpoint *ep, uint64_t deadline_ns,
                       struct client_pool **pool, struct client_staging *staging);
void client_pool_put(struct client_pool *p);
/* Where the endpoint's PUT values go, as far as a connection made so far
 * has seen: 0 when its pool is mapped writable (a single-tenant server:
 * the client copies into the pool), else how many value bytes its
 * connections' staging holds (0 too when it gave none), or UINT64_MAX
 * while no connection has told. */
uint64_t client_shm_staging_room(struct client_endpoint *ep);
void client_staging_unmap(struct client_staging *st);

/* The shm exchange a connection's frame takes (lease, staged PUT, or
 * reserve and commit on a single-tenant server), or NULL: it goes plain,
 * on the socket. c is a shm connection (c->pool set). */
const struct client_exchange *client_shm_exchange(const struct client_conn *c);
/* A followed PUT_STAGED frame's request is sent: its values are copied
 * into staging now, the server copying behind. */
void client_shm_stage_followed(struct client_conn *c);
/* The server stopped following the frame (the staged word stood still
 * while this thread was held up): its values are all in staging by now,
 * and the frame goes again, whole, answered by the same handler. 0. */
int client_shm_send_again(struct client_conn *c);

/* The server hears what this process pins of its pool (PINS): when the
 * pool's GPU slices pin other than it last said, the request goes into
 * buf (CLIENT_PINS_REQUEST bytes) and this returns 1 (the caller sends it
 * before its frame); else 0.
 * A report costs one round trip, and the pins change once per slice
 * registered, so few calls carry one. */
int client_shm_pins_request(struct client_conn *c, uint8_t *buf);
/* Its answer is in: a refusal is logged, and the mapping reports no more
 * (an older server, or one that keeps no more of this process's). */
void client_shm_pins_answered(struct client_conn *c);

#endif
