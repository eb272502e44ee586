/*
 * route.h - the hashes rendezvous placement (placement.h) is made of: a
 * key's, and a server's seed from its canonical "host:port" text. They
 * depend on nothing but those bytes, so every process and every build
 * routes a key the same way.
 */
#ifndef GDRKV_ROUTE_H
#define GDRKV_ROUTE_H

#include <stddef.h>
#include <stdint.h>

/* Seed of a server from its canonical "host:port" text. */
uint64_t route_server_seed(const char *name);
/* Hash of a key's bytes; computed once per key, scored against every seed. */
uint64_t route_key_hash(const void *key, size_t len);

#endif
