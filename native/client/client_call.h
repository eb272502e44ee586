/*
 * client_call.h - every public operation becomes one of two calls: a keyed
 * batch (EXISTS, GET, PUT, DELETE) checked, routed and striped key by key,
 * or one keyless frame (PING, STATS, CLEAR) to each of some servers.
 * client_call.c plans the call's jobs and frames; client_run.c drives them.
 */
#ifndef GDRKV_CLIENT_CALL_H
#define GDRKV_CLIENT_CALL_H

#include <stddef.h>
#include <stdint.h>

#include "client_state.h"

/* Runs an EXISTS, GET, PUT or DELETE batch (see gdrkv.h for the results). */
int client_keyed_call(struct gdrkv_client *c, uint8_t op, const struct client_keys *k);
/* Sends PING, STATS or CLEAR to servers [first, first + count): results[i]
 * gets server first + i's outcome (CLEAR: objects removed; STATS: length
 * of the text copied to text; else 0) or a negative error. */
int client_server_call(struct gdrkv_client *c, uint8_t op, uint32_t first, uint32_t count,
                       int64_t *results, char *text, size_t text_cap);

#endif
