/*
 * server_pins.h - what each peer holds pinned by its reads: the values of
 * its tcp GETs being sent, its shm and rdma leases. Pinned objects can't
 * be evicted, so a peer's pins are capped at a share of the pool
 * (peer_pin_share): one reader that stops reading can never keep the
 * writers out (docs/protocol.md, "Pins per peer").
 *
 * A peer is an IP address for tcp connections (rdma ones included), a
 * process for local (unix) ones. A connection joins its peer's account at
 * its first read and leaves it at close (under one mutex: never per
 * frame); a read charges and credits the account with one atomic.
 */
#ifndef GDRKV_SERVER_PINS_H
#define GDRKV_SERVER_PINS_H

#include <stdint.h>

#include "server_peers.h"

/* Who an account belongs to: an IP address (pid 0), or a local process
 * (the address all zeros, which no tcp peer has). */
struct server_pin_peer {
    struct server_peer ip;
    uint32_t pid;
};

struct server_pins;
struct server_pin_account;

/* Accounts of at most cap bytes each. NULL when out of memory. */
struct server_pins *server_pins_new(uint64_t cap);
void server_pins_free(struct server_pins *p);

/* The peer of connection fd: ip for tcp (server_peer_of's), the process
 * at the other end for a local one. */
void server_pin_peer_of(int fd, int local, const struct server_peer *ip,
                        struct server_pin_peer *out);

/* The peer's account, with one more connection on it; NULL when out of
 * memory. */
struct server_pin_account *server_pins_join(struct server_pins *p,
                                            const struct server_pin_peer *peer);
/* One connection less on a (NULL: none); the account goes with the last. */
void server_pins_leave(struct server_pins *p, struct server_pin_account *a);

/* Of the objects a read pinned (held[i] non-NULL, sizes[i] bytes), charges
 * a with the ones that fit under the cap, in order: all of them when they
 * all do; fits[i] says which. Returns the bytes charged. */
uint64_t server_pins_charge(struct server_pins *p, struct server_pin_account *a,
                            const uint64_t *sizes, const void *const *held, uint32_t n,
                            uint8_t *fits);
/* Gives back bytes a charge took. */
void server_pins_credit(struct server_pin_account *a, uint64_t bytes);

#endif
