/*
 * client_auth.h - the handshake a fresh connection to a server with a token
 * goes through before anything else (common/auth.h has the arithmetic,
 * docs/protocol.md the frames). It is mutual: the client learns that the
 * server holds the same token before it trusts its answers, or its pool.
 */
#ifndef GDRKV_CLIENT_AUTH_H
#define GDRKV_CLIENT_AUTH_H

#include <stdint.h>

#include "common/auth.h"

/* Runs the handshake on the connected socket fd (blocking until
 * deadline_ns at most). Returns 0, or GDRKV_E_DENIED (the server refused
 * our proof, could not prove its own, or has no token), GDRKV_E_TIMEOUT,
 * GDRKV_E_UNAVAILABLE or GDRKV_E_PROTOCOL. name is the server's, for the
 * log. */
int client_auth(int fd, const struct gk_token *t, const char *name, uint64_t deadline_ns);

#endif
