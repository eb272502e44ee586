/*
 * route.h - rendezvous (highest random weight) hashing: a key goes to the
 * server with the highest score mix64(hash(key) ^ seed(server)). Adding or
 * removing a server moves only the keys it wins or held, and the choice
 * depends on nothing but key bytes and "host:port" texts, so every process
 * and every build routes a key the same way.
 */
#ifndef GDRKV_ROUTE_H
#define GDRKV_ROUTE_H

#include <stddef.h>
#include <stdint.h>

/* Seed of a server from its canonical "host:port" text. */
uint64_t route_server_seed(const char *name);
/* Hash of a key's bytes; computed once per key, scored against every seed. */
uint64_t route_key_hash(const void *key, size_t len);
/* Index of the server that owns key_hash; nservers must be > 0. */
uint32_t route_pick(uint64_t key_hash, const uint64_t *seeds, uint32_t nservers);

#endif
