/*
 * client_server.c - see client_server.h.
 */
#include "client_server.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client_conn.h"
#include "client_shm.h"
#include "common/common.h"
#include "common/log.h"
#include "route.h"

/* Whether host names this machine: "localhost", or a numeric address one
 * of our interfaces has (binding to it succeeds only then). A server there
 * may have its unix socket at the default path. Names are not resolved
 * here: a slow DNS must not hold up opening a client. */
static int is_this_host(const char *host)
{
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST, .ai_socktype = SOCK_DGRAM}, *ai;
    int local = 0;

    if (!strcmp(host, "localhost"))
        return 1;
    if (getaddrinfo(host, NULL, &hints, &ai) != 0)
        return 0;
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        local = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
        close(fd);
    }
    freeaddrinfo(ai);
    return local;
}

/* Which transports reach the endpoint, by the one asked for. A server on
 * this host is reached over shm (or tcp) under auto: rdma through the NIC
 * and back would only cost more. */
static int choose_transports(struct client_endpoint *ep, const char *unix_path, int transport,
                             struct client_rdma *rdma)
{
    if (unix_path) {
        if (transport == GDRKV_TRANSPORT_TCP || transport == GDRKV_TRANSPORT_RDMA)
            return GDRKV_E_INVALID;
        snprintf(ep->unix_path, sizeof ep->unix_path, "%s", unix_path);
        ep->shm_only = 1;
        return 0;
    }
    /* rdma: QPs over a tcp control connection, even to this host. */
    if (transport == GDRKV_TRANSPORT_RDMA) {
        ep->rdma = rdma;
        ep->rdma_only = 1;
    }
    if (transport == GDRKV_TRANSPORT_TCP || transport == GDRKV_TRANSPORT_RDMA)
        return 0;
    int local = is_this_host(ep->addr.host) &&
                gk_unix_default_path(ep->addr.port, ep->unix_path, sizeof ep->unix_path) == 0;
    if (!local)
        ep->rdma = rdma;
    ep->shm_only = transport == GDRKV_TRANSPORT_SHM;
    return local || !ep->shm_only ? 0 : GDRKV_E_INVALID;
}

/* One spelling per address, so the seed (and hence routing) and the
 * duplicate check don't depend on how the user wrote it. */
void client_server_name(const struct gk_addr *addr, const char *unix_path, char *buf, size_t len)
{
    if (unix_path)
        snprintf(buf, len, "unix:%s", unix_path);
    else
        snprintf(buf, len, strchr(addr->host, ':') ? "[%s]:%u" : "%s:%u", addr->host,
                 addr->port);
}

static int endpoint_init(struct client_endpoint *ep, const struct gk_addr *addr,
                         const char *unix_path, int transport, struct client_rdma *rdma)
{
    if (addr)
        ep->addr = *addr;
    client_server_name(addr, unix_path, ep->name, sizeof ep->name);
    int rc = choose_transports(ep, unix_path, transport, rdma);
    if (rc)
        return rc;
    return pthread_mutex_init(&ep->pool_lock, NULL) ? GDRKV_E_INTERNAL : 0;
}

int client_server_init(struct client_server *s, const struct gk_addr *addr,
                       const char *unix_path, const gdrkv_client_opts *opts,
                       struct client_rdma *rdma, const struct gk_token *token)
{
    memset(s, 0, sizeof *s);
    int rc = endpoint_init(&s->ep, addr, unix_path, opts->transport, rdma);
    if (rc)
        return rc;
    s->ep.token = token;
    s->seed = route_server_seed(s->ep.name);
    /* Room for the connections of a couple of concurrent striped calls, so
     * threads sharing a client don't reconnect on every call. */
    s->idle_cap = 2 * opts->conns;
    s->idle = calloc(s->idle_cap, sizeof *s->idle);
    if (!s->idle) {
        pthread_mutex_destroy(&s->ep.pool_lock);
        return GDRKV_E_INTERNAL;
    }
    if (pthread_mutex_init(&s->lock, NULL)) {
        pthread_mutex_destroy(&s->ep.pool_lock);
        free(s->idle);
        return GDRKV_E_INTERNAL;
    }
    s->refs = 1;
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
    client_pool_put(s->ep.pool);
    pthread_mutex_destroy(&s->ep.pool_lock);
    free(s->idle);
    pthread_mutex_destroy(&s->lock);
}

void client_server_hold(struct client_server *s)
{
    __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
}

void client_server_put(struct client_server *s)
{
    if (s && __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        client_server_destroy(s);
        free(s);
    }
}

int client_server_admit(struct client_server *s, uint64_t now_ns)
{
    int refused = 0;

    pthread_mutex_lock(&s->lock);
    if (s->health != CLIENT_SERVER_UP) {
        if (now_ns >= s->retry_at_ns) {
            s->health = CLIENT_SERVER_PROBE;
            s->retry_at_ns = now_ns + s->probe_ns;
        } else {
            refused = s->down_err;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return refused;
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
    /* Servers close connections idle for their idle_timeout_ms (300 s by
     * default): one idle that long may be closing under us right now, and
     * a frame sent into that race fails. Long before, it is dropped here,
     * with those under it on the stack, which are older still. */
    int stale = conn && gk_now_ns() - conn->idle_since_ns > CLIENT_IDLE_MAX_MS * 1000000ull;
    if (stale)
        close_idle(s);
    pthread_mutex_unlock(&s->lock);
    if (stale) {
        client_conn_close(conn);
        conn = NULL;
    }
    return conn;
}

void client_server_push_idle(struct client_server *s, struct client_conn *conn)
{
    conn->idle_since_ns = gk_now_ns();
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
            GK_INFO("server %s is back", s->ep.name);
            s->refs = 1;
    s->health = CLIENT_SERVER_UP;
            s->backoff_ms = s->backoff_min_ms;
        }
    } else {
        if (s->health == CLIENT_SERVER_UP) {
            GK_WARN("server %s is down (%s): its keys fail for %llu ms, then it is retried",
                    s->ep.name, why, (unsigned long long)s->backoff_ms);
        } else if (s->health == CLIENT_SERVER_PROBE) {
            s->backoff_ms = GK_MIN(2 * s->backoff_ms, s->backoff_max_ms);
            GK_DEBUG("server %s still down (%s): next retry in %llu ms", s->ep.name, why,
                     (unsigned long long)s->backoff_ms);
        }
        /* Keys short-circuited later say why, when it is not mere absence. */
        s->down_err = err == GDRKV_E_DENIED ? err : GDRKV_E_UNAVAILABLE;
        if (s->health != CLIENT_SERVER_DOWN) {
            s->health = CLIENT_SERVER_DOWN;
            s->retry_at_ns = gk_now_ns() + s->backoff_ms * 1000000u;
        }
        close_idle(s);
    }
    pthread_mutex_unlock(&s->lock);
}
