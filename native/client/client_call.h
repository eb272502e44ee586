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

#define CLIENT_NO_SERVER UINT32_MAX

/* One pass of a keyed call over a server table (client_keyed.c decides
 * the passes): entry e = r * n + i, r < copies, sends key i to server
 * table->all[targets[e]], or nowhere (CLIENT_NO_SERVER); results[e] gets
 * the entry's result (and is left alone for an entry sent nowhere).
 * targets NULL: every key to the table's only server. */
struct client_round {
    struct client_table *table;
    uint32_t copies;
    const uint32_t *targets;
    int64_t *results;
    uint64_t deadline_ns;
};

/* Runs one pass of an EXISTS, GET, PUT or DELETE batch; bad keys get
 * their error in every entry sent somewhere. Returns 0, or an error that
 * failed the whole pass (its entries have it too). */
int client_round_run(struct gdrkv_client *c, uint8_t op, const struct client_keys *k,
                     const struct client_round *r);
/* Runs an EXISTS, GET, PUT or DELETE batch (see gdrkv.h for the results):
 * client_keyed.c. */
int client_keyed_call(struct gdrkv_client *c, uint8_t op, const struct client_keys *k);
/* Sends PING, STATS or CLEAR to servers [first, first + count) of table t:
 * results[i] gets server first + i's outcome (CLEAR: objects removed;
 * STATS: length of the text copied to text; else 0) or a negative error. */
int client_server_call(struct gdrkv_client *c, struct client_table *t, uint8_t op,
                       uint32_t first, uint32_t count, int64_t *results, char *text,
                       size_t text_cap);
/* Adds a finished call to the client's counters. */
void client_record_call(struct gdrkv_client *c, uint8_t op, uint32_t keys, uint64_t start);

#endif
