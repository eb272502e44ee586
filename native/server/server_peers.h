/*
 * server_peers.h - how many connections each tcp peer (by IP address) has
 * open, so that one host cannot take every slot of max_connections and
 * lock everyone else out. accept asks server_peers_take before it keeps a
 * connection; closing gives the slot back. One table for all workers under
 * one mutex: it is touched once per accept and once per close, never per
 * frame. Local (unix) clients are all one user and are counted apart
 * (server_worker.c).
 */
#ifndef GDRKV_SERVER_PEERS_H
#define GDRKV_SERVER_PEERS_H

#include <stdint.h>

/* A peer's IP address; IPv4 in its IPv4-mapped IPv6 form, so one host
 * reaching us both ways counts once. */
struct server_peer {
    uint8_t addr[16];
};

struct server_peers;

/* A table for at most max_conns connections at a time, each peer holding
 * at most per_peer of them. NULL when out of memory. */
struct server_peers *server_peers_new(uint32_t max_conns, uint32_t per_peer);
void server_peers_free(struct server_peers *p);

/* The address of a connected tcp socket's peer; 0 or -1. */
int server_peer_of(int fd, struct server_peer *out);

/* Counts one more connection of peer: 0, or -1 (nothing counted) when the
 * peer is at its cap. */
int server_peers_take(struct server_peers *p, const struct server_peer *peer);
/* Gives back a connection server_peers_take counted. */
void server_peers_give(struct server_peers *p, const struct server_peer *peer);
/* Connections peer has open now (for tests and stats). */
uint32_t server_peers_count(struct server_peers *p, const struct server_peer *peer);

#endif
