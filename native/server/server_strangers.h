/*
 * server_strangers.h - the budget of tcp connections that have not yet
 * proven they hold the token (a server with --auth-token-file). Until AUTH
 * succeeds a connection holds a stranger's slot, never one of
 * max_connections, so connections without the token can't lock out the
 * clients that have it. Strangers get max_unauthenticated slots in all and
 * max_unauthenticated_per_peer per IP address (an IPv6 address's /64 counts
 * as one), and auth_timeout_ms to finish AUTH (server_conn.c).
 *
 * When every slot is taken, a newcomer from an address with fewer
 * strangers than the address with most takes the oldest stranger of that
 * address (its socket is shut down; its worker sees the end and closes
 * it). A token holder's host, with one or two connections in the
 * handshake, thus always gets in while an attacker dials from fewer than
 * max_unauthenticated addresses; past that it competes by rate for a
 * second at most.
 *
 * One table for all workers under one mutex, touched once when a
 * connection opens and once when it authenticates or closes; a stranger's
 * fd is shut down only under the lock, and its connection leaves the table
 * under the lock before the fd is closed, so the fd is always its own.
 */
#ifndef GDRKV_SERVER_STRANGERS_H
#define GDRKV_SERVER_STRANGERS_H

#include <stdint.h>

#include "server_peers.h"

/* A connection's place in the table; it lives in the connection. */
struct server_stranger {
    struct server_stranger *older, *newer;  /* its address's strangers, oldest first */
    int fd;
    uint32_t at;                /* the index of its address's entry */
    int listed;                 /* holds a slot now (the table's lock guards it) */
};

struct server_strangers;

/* The largest budget: the table is scanned once per connection. */
#define SERVER_STRANGERS_MAX 65536u

/* NULL when out of memory. */
struct server_strangers *server_strangers_new(uint32_t max, uint32_t per_peer);
void server_strangers_free(struct server_strangers *t);

enum server_stranger_take {
    STRANGER_REFUSED,           /* no slot: the connection must be closed */
    STRANGER_TAKEN,
    STRANGER_TAKEN_EVICTING     /* taken from another address's oldest stranger */
};

/* Gives the connection on fd, from peer, a stranger's slot if there is one
 * (see above). who must stay valid until server_strangers_give. */
enum server_stranger_take server_strangers_take(struct server_strangers *t,
                                                struct server_stranger *who,
                                                const struct server_peer *peer, int fd);
/* Gives back who's slot, if it still holds one (an eviction may have taken
 * it); safe to call more than once. */
void server_strangers_give(struct server_strangers *t, struct server_stranger *who);
/* Strangers holding a slot now (stats, tests). */
uint32_t server_strangers_count(struct server_strangers *t);

#endif
