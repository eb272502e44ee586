/*
 * client_table.h - the client's server table: an immutable snapshot of its
 * members (who, how big, which failure domain, leaving or not) and the
 * servers that reach them, swapped whole by gdrkv_client_set_members.
 *
 * A call takes the current table once at its start (a reference, under a
 * lock held only for that) and uses it to its end without any lock; the
 * swap installs a new one and drops the client's reference to the old,
 * which goes when the last call on it ends. It never waits for a call.
 *
 * Servers are shared between tables (each table holds a reference on each
 * of its servers): a member in both the old and the new table keeps its
 * server, hence its idle connections, pool mapping and health.
 *
 * A table also keeps the placement of the table before it (prev), for
 * read-through while the new one is younger than settle_ms: the servers of
 * members that left stay reachable through it.
 */
#ifndef GDRKV_CLIENT_TABLE_H
#define GDRKV_CLIENT_TABLE_H

#include <stdint.h>

#include "client_state.h"
#include "placement.h"

struct client_server;

/* One membership as placement sees it. */
struct client_view {
    uint32_t n;
    struct placement_member *members;
    uint32_t *slot;             /* member i's server: all[slot[i]] */
    int uniform;                /* every weight the same */
    uint32_t nleaving;
};

struct client_table {
    uint32_t refs;              /* atomic: the client's pointer holds one, each call one */
    uint64_t born_ns;           /* when it was installed */
    uint32_t nall;              /* servers: cur's members first (slot[i] == i), */
    struct client_server **all; /* then prev's members that are not in cur */
    struct client_view cur;
    struct client_view prev;    /* n == 0: none */
};

/* Builds the first table from opts->servers (equal weights, each member's
 * host its failure domain) or, with members_later, an empty one. */
int client_table_open(struct gdrkv_client *c, const char *servers, char *err, size_t errlen);
/* The table a call runs on, with a reference the caller drops with
 * client_table_put. */
struct client_table *client_table_get(struct gdrkv_client *c);
void client_table_put(struct client_table *t);
/* At close: drops the client's table. */
void client_table_close(struct gdrkv_client *c);
/* Members in the current table. */
uint32_t client_table_members(struct gdrkv_client *c);

#endif
