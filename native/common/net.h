/*
 * net.h - socket helpers shared by the server and the client: address
 * parsing, listening, connecting within a deadline, socket options.
 */
#ifndef GDRKV_NET_H
#define GDRKV_NET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct gk_addr {
    char host[256];
    uint16_t port;
};

/* Parses "host:port", "[v6]:port" or "host" (default_port). Returns 0 or
 * GDRKV_E_INVALID. */
int gk_parse_addr(const char *s, uint16_t default_port, struct gk_addr *out);

/* Non-blocking listening TCP socket; returns fd or a negative gdrkv error
 * (message in err). */
int gk_listen_tcp(const struct gk_addr *a, int backlog, char *err, size_t errlen);
/* "host:port" of a bound socket. */
int gk_sock_name(int fd, char *buf, size_t len);
/* Whether a bound socket's address is a loopback one (127/8, ::1): only
 * this host can reach it. */
int gk_sock_is_loopback(int fd);

/* Connects to a, waiting at most until deadline_ns (gk_now_ns clock).
 * Returns a non-blocking, TCP_NODELAY, keepalive, close-on-exec fd, or
 * GDRKV_E_TIMEOUT / GDRKV_E_UNAVAILABLE. */
int gk_connect_tcp(const struct gk_addr *a, uint64_t deadline_ns);

/* The same without waiting, for a caller's poll loop: a connect in
 * progress, over the addresses a's name resolved to (the next is tried
 * when one is refused). */
#define GK_CONNECT_ADDRS 4
struct gk_connecting {
    int fd;                         /* the attempt in flight; poll it for POLLOUT */
    uint32_t naddrs, next;
    struct sockaddr_storage addrs[GK_CONNECT_ADDRS];
    socklen_t lens[GK_CONNECT_ADDRS];
};
/* Resolves a (within the deadline) and starts: 0, or a negative error. */
int gk_connect_start(const struct gk_addr *a, uint64_t deadline_ns, struct gk_connecting *k);
/* Never blocks: 1 connected (k->fd is the socket), 0 still in progress
 * (k->fd may be a new attempt), GDRKV_E_UNAVAILABLE when every address
 * failed (k->fd closed). */
int gk_connect_step(struct gk_connecting *k);
void gk_connect_abort(struct gk_connecting *k);

/* ---- unix-domain sockets of the shm transport (net_unix.c) */

/* Longest path a sockaddr_un holds, NUL included. */
#define GK_UNIX_PATH_MAX 108

/* Where a server on `port` listens for local clients when not told:
 * $GDRKV_RUNTIME_DIR/<port>.sock, else /tmp/gdrkv-<uid>/<port>.sock. The
 * server and its clients compute it alike, so a client of 127.0.0.1:port
 * finds the socket without asking. Returns 0 or GDRKV_E_INVALID (too long). */
int gk_unix_default_path(uint16_t port, char *buf, size_t len);
/* Non-blocking listening socket at path, owner-only: the parent directory
 * is created 0700 when missing and must be ours and not writable by others;
 * the socket is 0600. A stale socket left by a dead server is replaced, a
 * live one is not. Returns fd or a negative gdrkv error (message in err):
 * GDRKV_E_DENIED when the directory is not safely ours. */
int gk_listen_unix(const char *path, int backlog, char *err, size_t errlen);
/* Whether a client may trust the socket at path: it and its directory
 * belong to our user (or root) and nobody else may write the directory.
 * 1, or 0 with the reason in err. */
int gk_unix_server_trusted(const char *path, char *err, size_t errlen);
/* Connects to the socket at path: a non-blocking, close-on-exec fd, or
 * GDRKV_E_UNAVAILABLE (no server there, or not ours to reach). */
int gk_connect_unix(const char *path);
/* Whether the peer of a unix socket runs as our user (or as root): the
 * server checks its clients, a client the process it reached. */
int gk_peer_is_us(int fd);

/* Waits until fd is ready for poll events (POLLIN, POLLOUT) or the
 * deadline passes: 0, GDRKV_E_TIMEOUT or GDRKV_E_UNAVAILABLE. */
int gk_wait_fd(int fd, short events, uint64_t deadline_ns);
/* Sends or receives exactly len bytes on a non-blocking socket, waiting at
 * most until deadline_ns: 0, GDRKV_E_TIMEOUT or GDRKV_E_UNAVAILABLE (the
 * peer is gone). For the short exchanges that set a connection up. */
int gk_send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns);
int gk_recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns);

void gk_set_nodelay(int fd);

/* Milliseconds left until deadline_ns for poll(), 0 when passed. */
int gk_poll_ms_left(uint64_t deadline_ns);

#endif
