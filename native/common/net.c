/*
 * net.c - see net.h.
 */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "gdrkv.h"

int gk_parse_addr(const char *s, uint16_t default_port, struct gk_addr *out)
{
    const char *host = s, *port = NULL;
    size_t host_len;

    if (!s || !*s)
        return GDRKV_E_INVALID;
    if (s[0] == '[') {
        const char *end = strchr(s, ']');
        if (!end)
            return GDRKV_E_INVALID;
        host = s + 1;
        host_len = (size_t)(end - host);
        if (end[1] == ':')
            port = end + 2;
        else if (end[1] != '\0')
            return GDRKV_E_INVALID;
    } else {
        const char *colon = strrchr(s, ':');
        if (colon && strchr(s, ':') != colon)
            return GDRKV_E_INVALID;   /* bare IPv6 needs brackets */
        host_len = colon ? (size_t)(colon - s) : strlen(s);
        port = colon ? colon + 1 : NULL;
    }
    if (host_len == 0 || host_len >= sizeof out->host)
        return GDRKV_E_INVALID;
    memcpy(out->host, host, host_len);
    out->host[host_len] = '\0';
    out->port = default_port;
    if (port) {
        char *end;
        long v;
        if (!*port)
            return GDRKV_E_INVALID;
        errno = 0;
        v = strtol(port, &end, 10);
        if (errno || *end || v < 0 || v > 65535)
            return GDRKV_E_INVALID;
        out->port = (uint16_t)v;
    }
    return 0;
}

static int resolve(const struct gk_addr *a, int passive, struct addrinfo **res)
{
    struct addrinfo hints = {0};
    char port[8];
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    snprintf(port, sizeof port, "%u", a->port);
    return getaddrinfo(a->host, port, &hints, res);
}

/* Pooled client connections may sit idle for minutes: keepalive probes
 * find a peer that vanished (a host that died, a NAT that forgot us)
 * within about a minute instead of at the next call's timeout. */
static void set_keepalive(int fd)
{
    int on = 1, idle = 30, interval = 10, count = 3;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

void gk_set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int gk_listen_tcp(const struct gk_addr *a, int backlog, char *err, size_t errlen)
{
    struct addrinfo *res, *ai;
    int rc = resolve(a, 1, &res), fd = -1, saved = 0;
    if (rc) {
        snprintf(err, errlen, "cannot resolve %s: %s", a->host, gai_strerror(rc));
        return GDRKV_E_INVALID;
    }
    for (ai = res; ai; ai = ai->ai_next) {
        int one = 1;
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, backlog) == 0)
            break;
        saved = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, errlen, "cannot listen on %s:%u: %s", a->host, a->port, strerror(saved));
        return GDRKV_E_UNAVAILABLE;
    }
    return fd;
}

int gk_sock_name(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char host[INET6_ADDRSTRLEN];
    uint16_t port;

    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0)
        return GDRKV_E_INTERNAL;
    if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof host);
        port = ntohs(s6->sin6_port);
        snprintf(buf, len, "[%s]:%u", host, port);
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &s4->sin_addr, host, sizeof host);
        port = ntohs(s4->sin_port);
        snprintf(buf, len, "%s:%u", host, port);
    }
    return 0;
}

int gk_sock_is_loopback(int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;

    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0)
        return 0;
    if (ss.ss_family == AF_INET)
        return ((const uint8_t *)&((struct sockaddr_in *)&ss)->sin_addr)[0] == 127;
    if (ss.ss_family != AF_INET6)
        return 0;
    const struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

int gk_wait_fd(int fd, short events, uint64_t deadline_ns)
{
    struct pollfd pfd = {.fd = fd, .events = events};
    int n;
    do
        n = poll(&pfd, 1, gk_poll_ms_left(deadline_ns));
    while (n < 0 && errno == EINTR);
    return n > 0 ? 0 : n == 0 ? GDRKV_E_TIMEOUT : GDRKV_E_UNAVAILABLE;
}

/* Moves exactly len bytes one way (send when out, else recv), waiting for
 * the socket within the deadline. */
static int move_all(int fd, uint8_t *p, size_t len, int out, uint64_t deadline_ns)
{
    while (len > 0) {
        ssize_t n = out ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            int rc = gk_wait_fd(fd, out ? POLLOUT : POLLIN, deadline_ns);
            if (rc)
                return rc;
            continue;
        }
        if (n <= 0)
            return GDRKV_E_UNAVAILABLE;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int gk_send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns)
{
    return move_all(fd, (uint8_t *)(uintptr_t)buf, len, 1, deadline_ns);
}

int gk_recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns)
{
    return move_all(fd, buf, len, 0, deadline_ns);
}

int gk_poll_ms_left(uint64_t deadline_ns)
{
    uint64_t now = gk_now_ns();
    if (now >= deadline_ns)
        return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > 1000000 ? 1000000 : (int)ms;
}

/* A name lookup that may outlive the caller's deadline: the thread owns
 * the job; whoever finishes last (caller or thread) frees it. */
struct lookup {
    pthread_mutex_t lock;
    pthread_cond_t done_cond;
    int done, abandoned, rc;
    struct gk_addr addr;
    struct addrinfo *res;
};

static void lookup_free(struct lookup *l)
{
    if (l->res)
        freeaddrinfo(l->res);
    pthread_cond_destroy(&l->done_cond);
    pthread_mutex_destroy(&l->lock);
    free(l);
}

static void *lookup_main(void *arg)
{
    struct lookup *l = arg;
    struct addrinfo *res = NULL;
    int rc = resolve(&l->addr, 0, &res);
    pthread_mutex_lock(&l->lock);
    l->rc = rc;
    l->res = res;
    l->done = 1;
    int abandoned = l->abandoned;
    pthread_cond_signal(&l->done_cond);
    pthread_mutex_unlock(&l->lock);
    if (abandoned)
        lookup_free(l);
    return NULL;
}

/* getaddrinfo within the deadline: a numeric address at once; a name in a
 * thread of its own, since a DNS server that does not answer would hold
 * the call for the resolver's own timeouts (seconds). Returns 0,
 * GDRKV_E_TIMEOUT or GDRKV_E_UNAVAILABLE. */
static int resolve_until(const struct gk_addr *a, uint64_t deadline_ns, struct addrinfo **res)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST};
    char port[8];
    snprintf(port, sizeof port, "%u", a->port);
    if (getaddrinfo(a->host, port, &hints, res) == 0)
        return 0;

    struct lookup *l = calloc(1, sizeof *l);
    pthread_t thread;
    pthread_attr_t attr;
    if (!l)
        return GDRKV_E_UNAVAILABLE;
    l->addr = *a;
    pthread_condattr_t monotonic;       /* the deadline is on gk_now_ns's clock */
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->done_cond, &monotonic);
    pthread_condattr_destroy(&monotonic);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int started = pthread_create(&thread, &attr, lookup_main, l) == 0;
    pthread_attr_destroy(&attr);
    if (!started) {
        lookup_free(l);
        return GDRKV_E_UNAVAILABLE;
    }
    struct timespec until = {.tv_sec = (time_t)(deadline_ns / 1000000000ull),
                             .tv_nsec = (long)(deadline_ns % 1000000000ull)};
    pthread_mutex_lock(&l->lock);
    while (!l->done && pthread_cond_timedwait(&l->done_cond, &l->lock, &until) != ETIMEDOUT)
        ;
    int done = l->done, rc = l->rc;
    l->abandoned = !done;
    if (done) {
        *res = l->res;
        l->res = NULL;
    }
    pthread_mutex_unlock(&l->lock);
    if (!done)
        return GDRKV_E_TIMEOUT;     /* the thread frees l when the lookup ends */
    lookup_free(l);
    return rc ? GDRKV_E_UNAVAILABLE : 0;
}

/* Starts a connect to the next address not tried yet: 0 (k->fd in
 * progress or connected), or GDRKV_E_UNAVAILABLE when none is left. */
static int try_next(struct gk_connecting *k)
{
    while (k->next < k->naddrs) {
        const struct sockaddr *sa = (const struct sockaddr *)&k->addrs[k->next];
        socklen_t len = k->lens[k->next++];
        int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        if (connect(fd, sa, len) == 0 || errno == EINPROGRESS) {
            k->fd = fd;
            return 0;
        }
        close(fd);
    }
    k->fd = -1;
    return GDRKV_E_UNAVAILABLE;
}

int gk_connect_start(const struct gk_addr *a, uint64_t deadline_ns, struct gk_connecting *k)
{
    struct addrinfo *res;
    memset(k, 0, sizeof *k);
    k->fd = -1;
    int rc = resolve_until(a, deadline_ns, &res);
    if (rc)
        return rc;
    for (struct addrinfo *ai = res; ai && k->naddrs < GK_CONNECT_ADDRS; ai = ai->ai_next) {
        memcpy(&k->addrs[k->naddrs], ai->ai_addr, ai->ai_addrlen);
        k->lens[k->naddrs++] = ai->ai_addrlen;
    }
    freeaddrinfo(res);
    return try_next(k);
}

int gk_connect_step(struct gk_connecting *k)
{
    for (;;) {
        struct pollfd pfd = {.fd = k->fd, .events = POLLOUT};
        if (poll(&pfd, 1, 0) <= 0)
            return 0;
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (getsockopt(k->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0) {
            gk_set_nodelay(k->fd);
            set_keepalive(k->fd);
            return 1;
        }
        /* Refused or unreachable: the name's next address, if it has one
         * (localhost: ::1, then 127.0.0.1). */
        close(k->fd);
        if (try_next(k))
            return GDRKV_E_UNAVAILABLE;
    }
}

void gk_connect_abort(struct gk_connecting *k)
{
    if (k->fd >= 0)
        close(k->fd);
    k->fd = -1;
}

int gk_connect_tcp(const struct gk_addr *a, uint64_t deadline_ns)
{
    struct gk_connecting k;
    int rc = gk_connect_start(a, deadline_ns, &k);
    while (rc == 0) {
        rc = gk_connect_step(&k);
        if (rc == 0 && (rc = gk_wait_fd(k.fd, POLLOUT, deadline_ns)) != 0)
            gk_connect_abort(&k);
    }
    return rc == 1 ? k.fd : rc;
}
