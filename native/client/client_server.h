/*
 * client_server.h - one store server as the client sees it: its endpoint
 * (how to reach it), its rendezvous seed, a stack of idle connections, and
 * its health.
 *
 * Health is a small state machine. UP: calls go through. DOWN: calls fail
 * its keys at once (GDRKV_E_UNAVAILABLE, or GDRKV_E_DENIED when that is
 * why it went down; no syscall) until retry_at; the
 * first call after that becomes the PROBE (half-open) while others keep
 * failing fast; the probe's success brings the server UP, its failure
 * puts it DOWN again with twice the delay, up to backoff_max_ms.
 */
#ifndef GDRKV_CLIENT_SERVER_H
#define GDRKV_CLIENT_SERVER_H

#include <pthread.h>
#include <stdint.h>

#include "client_state.h"
#include "gdrkv.h"

struct client_conn;
struct client_rdma;

enum client_server_health { CLIENT_SERVER_UP, CLIENT_SERVER_DOWN, CLIENT_SERVER_PROBE };

struct client_server {
    struct client_endpoint ep;      /* its address, name and transports */
    uint64_t seed;                  /* rendezvous seed, from ep.name */
    uint32_t refs;                  /* atomic: each server table holding it (client_table.h) */

    pthread_mutex_t lock;           /* guards everything below */
    struct client_conn **idle;
    uint32_t nidle, idle_cap;
    enum client_server_health health;
    uint64_t retry_at_ns;           /* DOWN: when to probe; PROBE: when to give up on the prober */
    uint64_t backoff_ms;            /* length of the current or last DOWN period */
    uint64_t backoff_min_ms, backoff_max_ms;
    uint64_t probe_ns;
    int down_err;                   /* what short-circuited keys get while DOWN */
};

/* Sets up server s for the address (ep.name gets its canonical text), or
 * for the unix socket at unix_path when that is not NULL; rdma is the
 * client's, used where the transport asks for it; token (the client's, or
 * NULL) authenticates every new connection. Returns 0, GDRKV_E_INVALID (a
 * transport that can't reach the server: shm to one that is not local, tcp
 * or rdma to a unix socket) or GDRKV_E_INTERNAL. */
int client_server_init(struct client_server *s, const struct gk_addr *addr,
                       const char *unix_path, const gdrkv_client_opts *opts,
                       struct client_rdma *rdma, const struct gk_token *token);
void client_server_destroy(struct client_server *s);
/* A server allocated on its own is shared by the tables that list it:
 * hold adds a reference, put drops one and frees it with the last. */
void client_server_hold(struct client_server *s);
void client_server_put(struct client_server *s);
/* The canonical name of an address (or of the unix socket at unix_path,
 * when not NULL): what ep.name and the server's seed are made of. */
void client_server_name(const struct gk_addr *addr, const char *unix_path, char *buf, size_t len);

/* 0 when a call may send to s now (see the state machine above), else
 * the error its keys fail with. */
int client_server_admit(struct client_server *s, uint64_t now_ns);
int client_server_is_down(struct client_server *s);

/* Pooled connections idle longer than this are closed instead of reused:
 * well below the servers' idle timeout (docs/protocol.md). */
#define CLIENT_IDLE_MAX_MS 60000

/* Takes an idle connection, or NULL. */
struct client_conn *client_server_pop_idle(struct client_server *s);
/* Gives back a connection after a clean exchange (closed if the stack is full). */
void client_server_push_idle(struct client_server *s, struct client_conn *conn);

/* How a call's exchanges with s went: 0, or the error that failed them
 * (why is for the log). A failure closes the idle connections too: they
 * most likely share the fate of the one that failed. */
void client_server_report(struct client_server *s, int err, const char *why);

#endif
