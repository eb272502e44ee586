/*
 * server_metrics.c - the /metrics endpoint (server_metrics.h): one thread
 * that multiplexes up to METRICS_SCRAPERS_MAX scrapers with poll, each
 * with a deadline for its whole request and one for its whole answer, so
 * a peer that trickles or stalls holds only its own slot, and only until
 * its deadline.
 */
#include "server_metrics.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"
#include "common/log.h"
#include "common/net.h"
#include "common/stats.h"
#include "server_metrics_http.h"
#include "server_state.h"

/* Room for the answer's head, in front of its body in the same buffer. */
#define METRICS_HEAD_ROOM 256

struct scraper {
    int fd;                         /* -1: the slot is free */
    uint64_t deadline_ns;           /* the request, then the answer, must be done by then */
    size_t got;                     /* request bytes read */
    char *buf;                      /* the answer: head + body, from out */
    const char *out;
    size_t out_len, out_sent;       /* out_len 0: still reading the request */
    char req[METRICS_REQUEST_MAX];
};

struct server_metrics {
    int listen_fd;
    pthread_t thread;
    struct gk_token token;          /* len 0: no token wanted */
    struct scraper scrapers[METRICS_SCRAPERS_MAX];
};

static void scraper_end(struct scraper *sc)
{
    close(sc->fd);
    free(sc->buf);
    sc->fd = -1;
    sc->buf = NULL;
}

/* The text's room: the fixed series, then two lines per namespace. */
static size_t text_room(const struct gdrkv_server *s)
{
    return METRICS_FIXED_TEXT_MAX +
           (size_t)s->opts.metrics_namespaces * 2 * (METRICS_LABEL_MAX + 64);
}

/* Builds the answer to what the request asked for; 0 or -1 (no memory). */
static int answer(struct gdrkv_server *s, struct scraper *sc, enum metrics_request what)
{
    static const char *const status[] = {
        [METRICS_REQ_METRICS] = "200 OK",
        [METRICS_REQ_NOT_FOUND] = "404 Not Found",
        [METRICS_REQ_UNAUTHORIZED] = "401 Unauthorized",
        [METRICS_REQ_BAD] = "400 Bad Request",
    };
    size_t room = what == METRICS_REQ_METRICS ? text_room(s) : 256;
    if (!(sc->buf = malloc(METRICS_HEAD_ROOM + room)))
        return -1;
    struct gk_text t;
    gk_text_init(&t, sc->buf + METRICS_HEAD_ROOM, room);
    if (what == METRICS_REQ_METRICS)
        server_metrics_text(s, &t);
    else if (what == METRICS_REQ_NOT_FOUND)
        gk_text_printf(&t, "gdrkv serves its metrics at /metrics\n");
    else if (what == METRICS_REQ_UNAUTHORIZED)
        gk_text_printf(&t, "this endpoint wants its token: Authorization: Bearer <token>\n");
    else
        gk_text_printf(&t, "not an HTTP request for /metrics\n");
    int len = gk_text_finish(&t);
    char head[METRICS_HEAD_ROOM];
    int hlen = snprintf(head, sizeof head,
                        "HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s"
                        "Connection: close\r\n\r\n", status[what],
                        what == METRICS_REQ_METRICS ? "text/plain; version=0.0.4; charset=utf-8"
                                                    : "text/plain",
                        len, what == METRICS_REQ_UNAUTHORIZED ? "WWW-Authenticate: Bearer\r\n" : "");
    char *start = sc->buf + METRICS_HEAD_ROOM - hlen;
    memcpy(start, head, (size_t)hlen);
    sc->out = start;
    sc->out_len = (size_t)hlen + (size_t)len;
    sc->out_sent = 0;
    sc->deadline_ns = gk_now_ns() + METRICS_ANSWER_TIMEOUT_MS * 1000000ull;
    return 0;
}

/* Moves sc on as far as its socket allows; ends it when done or broken. */
static void scraper_step(struct gdrkv_server *s, struct scraper *sc)
{
    if (sc->out_len == 0) {
        ssize_t n = recv(sc->fd, sc->req + sc->got, sizeof sc->req - sc->got, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            scraper_end(sc);
            return;
        }
        if (n < 0)
            return;
        sc->got += (size_t)n;
        enum metrics_request what = metrics_parse_request(sc->req, sc->got, &s->metrics->token);
        if (what == METRICS_REQ_INCOMPLETE)
            return;
        if (answer(s, sc, what) < 0) {
            scraper_end(sc);
            return;
        }
    }
    while (sc->out_sent < sc->out_len) {
        ssize_t n = send(sc->fd, sc->out + sc->out_sent, sc->out_len - sc->out_sent,
                         MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        if (n <= 0)
            break;
        sc->out_sent += (size_t)n;
    }
    scraper_end(sc);
}

static void accept_scrapers(struct server_metrics *m)
{
    for (int i = 0; i < METRICS_SCRAPERS_MAX; i++) {
        struct scraper *sc = &m->scrapers[i];
        if (sc->fd >= 0)
            continue;
        int fd = accept4(m->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        *sc = (struct scraper){.fd = fd,
                               .deadline_ns = gk_now_ns() + METRICS_REQUEST_TIMEOUT_MS * 1000000ull};
    }
}

/* Poll's timeout: until the nearest deadline, or none. */
static int wait_ms(const struct server_metrics *m, uint64_t now)
{
    uint64_t nearest = UINT64_MAX;
    for (int i = 0; i < METRICS_SCRAPERS_MAX; i++)
        if (m->scrapers[i].fd >= 0 && m->scrapers[i].deadline_ns < nearest)
            nearest = m->scrapers[i].deadline_ns;
    if (nearest == UINT64_MAX)
        return -1;
    return nearest <= now ? 0 : (int)((nearest - now + 999999) / 1000000);
}

static void *metrics_main(void *arg)
{
    struct gdrkv_server *s = arg;
    struct server_metrics *m = s->metrics;
    struct pollfd fds[2 + METRICS_SCRAPERS_MAX];
    int slot_of[2 + METRICS_SCRAPERS_MAX];

    for (;;) {
        int n = 0, busy = 0;
        fds[n++] = (struct pollfd){.fd = s->wake_fd, .events = POLLIN};
        for (int i = 0; i < METRICS_SCRAPERS_MAX; i++) {
            struct scraper *sc = &m->scrapers[i];
            if (sc->fd < 0)
                continue;
            busy++;
            slot_of[n] = i;
            fds[n++] = (struct pollfd){.fd = sc->fd, .events = sc->out_len ? POLLOUT : POLLIN};
        }
        int listening = busy < METRICS_SCRAPERS_MAX;
        if (listening)
            fds[n++] = (struct pollfd){.fd = m->listen_fd, .events = POLLIN};
        if (poll(fds, (nfds_t)n, wait_ms(m, gk_now_ns())) < 0 && errno != EINTR)
            break;
        if (fds[0].revents)
            break;
        for (int k = 1; k < n - listening; k++)
            if (fds[k].revents)
                scraper_step(s, &m->scrapers[slot_of[k]]);
        uint64_t now = gk_now_ns();
        for (int i = 0; i < METRICS_SCRAPERS_MAX; i++)
            if (m->scrapers[i].fd >= 0 && now >= m->scrapers[i].deadline_ns) {
                GK_DEBUG("metrics: a scraper past its deadline, closed");
                scraper_end(&m->scrapers[i]);
            }
        if (listening && (fds[n - 1].revents & POLLIN))
            accept_scrapers(m);
    }
    return NULL;
}

static void metrics_free(struct server_metrics *m)
{
    for (int i = 0; i < METRICS_SCRAPERS_MAX; i++)
        if (m->scrapers[i].fd >= 0)
            scraper_end(&m->scrapers[i]);
    if (m->listen_fd >= 0)
        close(m->listen_fd);
    free(m);
}

int server_metrics_start(struct gdrkv_server *s, const struct gk_addr *addr,
                         const char *token_file, char *err, size_t errlen)
{
    struct server_metrics *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return GDRKV_E_INTERNAL;
    }
    for (int i = 0; i < METRICS_SCRAPERS_MAX; i++)
        m->scrapers[i].fd = -1;
    m->listen_fd = -1;
    if (token_file && *token_file) {
        int rc = gk_token_load(token_file, &m->token, err, errlen);
        if (rc) {
            metrics_free(m);
            return rc;
        }
    }
    m->listen_fd = gk_listen_tcp(addr, 64, err, errlen);
    if (m->listen_fd < 0) {
        int rc = m->listen_fd;
        m->listen_fd = -1;
        metrics_free(m);
        return rc;
    }
    gk_sock_name(m->listen_fd, s->metrics_address, sizeof s->metrics_address);
    s->metrics = m;
    if (pthread_create(&m->thread, NULL, metrics_main, s) != 0) {
        metrics_free(m);
        s->metrics = NULL;
        snprintf(err, errlen, "cannot start the metrics thread");
        return GDRKV_E_INTERNAL;
    }
    if (!m->token.len && !gk_sock_is_loopback(m->listen_fd))
        GK_WARN("metrics on http://%s/metrics without --metrics-token-file: anyone who "
                "reaches it reads the counters and namespace names", s->metrics_address);
    GK_INFO("metrics on http://%s/metrics%s", s->metrics_address,
            m->token.len ? " (bearer token)" : "");
    return 0;
}

void server_metrics_stop(struct gdrkv_server *s)
{
    struct server_metrics *m = s->metrics;
    if (!m)
        return;
    pthread_join(m->thread, NULL);      /* wake_fd is readable: stop has begun */
    metrics_free(m);
    s->metrics = NULL;
}
