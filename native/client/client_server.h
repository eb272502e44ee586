/*
 * client_server.h - one store server as the client sees it: its address,
 * its rendezvous seed, a stack of idle connections, and its health.
 *
 * Health is a small state machine. UP: calls go through. DOWN: calls fail
 * its keys at once (GDRKV_E_UNAVAILABLE, no syscall) until retry_at; the
 * first call after that becomes the PROBE (half-open) while others keep
 * failing fast; the probe's success brings the server UP, its failure
 * puts it DOWN again with twice the delay, up to backoff_max_ms.
 */
#ifndef GDRKV_CLIENT_SERVER_H
#define GDRKV_CLIENT_SERVER_H

#include <pthread.h>
#include <stdint.h>

#include "gdrkv.h"
#include "common/net.h"

struct client_conn;
struct client_pool;
struct client_rdma;

/* Room for "[", a gk_addr host, "]:", a port and the NUL; and for
 * "unix:" and a socket path. */
#define CLIENT_SERVER_NAME_MAX (sizeof(((struct gk_addr *)0)->host) + 9)

enum client_server_health { CLIENT_SERVER_UP, CLIENT_SERVER_DOWN, CLIENT_SERVER_PROBE };

struct client_server {
    struct gk_addr addr;            /* unused for a unix: server */
    char name[CLIENT_SERVER_NAME_MAX];  /* canonical "host:port", "[v6]:port" or "unix:PATH" */
    uint64_t seed;
    char unix_path[GK_UNIX_PATH_MAX];   /* where to try shm first; "" = tcp only */
    int shm_only;                   /* no tcp fallback: a unix: server, or transport shm */

    pthread_mutex_t lock;           /* guards everything below */
    struct client_conn **idle;
    uint32_t nidle, idle_cap;
    enum client_server_health health;
    uint64_t retry_at_ns;           /* DOWN: when to probe; PROBE: when to give up on the prober */
    uint64_t backoff_ms;            /* length of the current or last DOWN period */
    uint64_t backoff_min_ms, backoff_max_ms;
    uint64_t probe_ns;
    struct client_pool *pool;       /* the mapping new connections share, or NULL */
    struct client_rdma *rdma;       /* the client's, when transport auto or rdma */
    int rdma_only;                  /* transport rdma: no plain tcp fallback */
    int local;                      /* on this host (auto: shm, never rdma) */
};

/* Sets up server s for the address (name gets its canonical text), or
 * for the unix socket at unix_path when that is not NULL. Returns 0,
 * GDRKV_E_INVALID (transport shm to a server that is not local) or
 * GDRKV_E_INTERNAL. */
int client_server_init(struct client_server *s, const struct gk_addr *addr,
                       const char *unix_path, const gdrkv_client_opts *opts);
void client_server_destroy(struct client_server *s);

/* Whether a call may send to s now (see the state machine above). */
int client_server_admit(struct client_server *s, uint64_t now_ns);
int client_server_is_down(struct client_server *s);

/* Takes an idle connection, or NULL. */
struct client_conn *client_server_pop_idle(struct client_server *s);
/* Gives back a connection after a clean exchange (closed if the stack is full). */
void client_server_push_idle(struct client_server *s, struct client_conn *conn);

/* How a call's exchanges with s went: 0, or the error that failed them
 * (why is for the log). A failure closes the idle connections too: they
 * most likely share the fate of the one that failed. */
void client_server_report(struct client_server *s, int err, const char *why);

#endif
