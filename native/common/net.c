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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int gk_send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            int rc = gk_wait_fd(fd, POLLOUT, deadline_ns);
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

int gk_recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            int rc = gk_wait_fd(fd, POLLIN, deadline_ns);
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

int gk_poll_ms_left(uint64_t deadline_ns)
{
    uint64_t now = gk_now_ns();
    if (now >= deadline_ns)
        return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > 1000000 ? 1000000 : (int)ms;
}

int gk_connect_tcp(const struct gk_addr *a, uint64_t deadline_ns)
{
    struct addrinfo *res, *ai;
    int result = GDRKV_E_UNAVAILABLE;

    if (resolve(a, 0, &res))
        return GDRKV_E_UNAVAILABLE;
    for (ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
            close(fd);
            continue;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int ready;
        do
            ready = poll(&pfd, 1, gk_poll_ms_left(deadline_ns));
        while (ready < 0 && errno == EINTR);
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (ready == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0) {
            gk_set_nodelay(fd);
            result = fd;
            break;
        }
        close(fd);
        if (ready == 0) {
            result = GDRKV_E_TIMEOUT;
            break;
        }
    }
    freeaddrinfo(res);
    return result;
}
