/*
 * client_server.c - see client_server.h.
 */
#include "client_server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_conn.h"
#include "common.h"
#include "log.h"
#include "route.h"

int client_server_init(struct client_server *s, const struct gk_addr *addr,
                       const gdrkv_client_opts *opts)
{
    memset(s, 0, sizeof *s);
    s->addr = *addr;
    /* One spelling per address, so the seed (and hence routing) and the
     * duplicate check don't depend on how the user wrote it. */
    snprintf(s->name, sizeof s->name, strchr(addr->host, ':') ? "[%s]:%u" : "%s:%u",
             addr->host, addr->port);
    s->seed = route_server_seed(s->name);
    /* Room for the connections of a couple of concurrent striped calls, so
     * threads sharing a client don't reconnect on every call. */
    s->idle_cap = 2 * opts->conns;
    s->idle = calloc(s->idle_cap, sizeof *s->idle);
    if (!s->idle)
        return GDRKV_E_INTERNAL;
    if (pthread_mutex_init(&s->lock, NULL)) {
        free(s->idle);
        return GDRKV_E_INTERNAL;
    }
    s->health = CLIENT_SERVER_UP;
    s->backoff_min_ms = opts->backoff_min_ms;
    s->backoff_max_ms = opts->backoff_max_ms;
    s->backoff_ms = s->backoff_min_ms;
    /* A probe ends within its call's timeout; one that hasn't reported by
     * twice that is lost, and the next call may probe instead. */
    s->probe_ns = 2 * (uint64_t)opts->timeout_ms * 1000000u;
    return 0;
}

static void close_idle(struct client_server *s)
{
    while (s->nidle)
        client_conn_close(s->idle[--s->nidle]);
}

void client_server_destroy(struct client_server *s)
{
    close_idle(s);
    free(s->idle);
    pthread_mutex_destroy(&s->lock);
}

int client_server_admit(struct client_server *s, uint64_t now_ns)
{
    int admitted = 1;

    pthread_mutex_lock(&s->lock);
    if (s->health != CLIENT_SERVER_UP) {
        admitted = now_ns >= s->retry_at_ns;
        if (admitted) {
            s->health = CLIENT_SERVER_PROBE;
            s->retry_at_ns = now_ns + s->probe_ns;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return admitted;
}

int client_server_is_down(struct client_server *s)
{
    pthread_mutex_lock(&s->lock);
    int down = s->health != CLIENT_SERVER_UP;
    pthread_mutex_unlock(&s->lock);
    return down;
}

struct client_conn *client_server_pop_idle(struct client_server *s)
{
    struct client_conn *conn = NULL;

    pthread_mutex_lock(&s->lock);
    if (s->nidle)
        conn = s->idle[--s->nidle];
    pthread_mutex_unlock(&s->lock);
    return conn;
}

void client_server_push_idle(struct client_server *s, struct client_conn *conn)
{
    pthread_mutex_lock(&s->lock);
    if (s->nidle < s->idle_cap) {
        s->idle[s->nidle++] = conn;
        conn = NULL;
    }
    pthread_mutex_unlock(&s->lock);
    if (conn)
        client_conn_close(conn);
}

void client_server_report(struct client_server *s, int err, const char *why)
{
    pthread_mutex_lock(&s->lock);
    if (!err) {
        /* A call admitted before someone else's failure can't bring a DOWN
         * server back: only the probe can. */
        if (s->health == CLIENT_SERVER_PROBE) {
            GK_INFO("server %s is back", s->name);
            s->health = CLIENT_SERVER_UP;
            s->backoff_ms = s->backoff_min_ms;
        }
    } else {
        if (s->health == CLIENT_SERVER_UP) {
            GK_WARN("server %s is down (%s): its keys fail for %llu ms, then it is retried",
                    s->name, why, (unsigned long long)s->backoff_ms);
        } else if (s->health == CLIENT_SERVER_PROBE) {
            s->backoff_ms = GK_MIN(2 * s->backoff_ms, s->backoff_max_ms);
            GK_DEBUG("server %s still down (%s): next retry in %llu ms", s->name, why,
                     (unsigned long long)s->backoff_ms);
        }
        if (s->health != CLIENT_SERVER_DOWN) {
            s->health = CLIENT_SERVER_DOWN;
            s->retry_at_ns = gk_now_ns() + s->backoff_ms * 1000000u;
        }
        close_idle(s);
    }
    pthread_mutex_unlock(&s->lock);
}
