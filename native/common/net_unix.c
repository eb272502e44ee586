/*
 * net_unix.c - the unix-domain sockets of the shm transport (net.h).
 *
 * The socket is the trust boundary of shm: whoever connects gets the pool
 * mapped read-only. So access is checked three times over: a directory only
 * we can write, a socket only we can open, and the peer's uid at accept
 * (SO_PEERCRED), which holds even when someone loosens the first two.
 *
 * The client checks the same from its side before it trusts what answers:
 * the directory and the socket belong to its user (or root), and so does
 * the process listening on it. Another user who got to /tmp/gdrkv-<uid>
 * first can then neither serve our clients nor be served our PUTs.
 */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "gdrkv.h"
#include "net.h"

int gk_unix_default_path(uint16_t port, char *buf, size_t len)
{
    const char *dir = getenv("GDRKV_RUNTIME_DIR");
    int n = dir && *dir ? snprintf(buf, len, "%s/%u.sock", dir, port)
                        : snprintf(buf, len, "/tmp/gdrkv-%u/%u.sock", (unsigned)geteuid(), port);
    return n > 0 && (size_t)n < len && n < GK_UNIX_PATH_MAX ? 0 : GDRKV_E_INVALID;
}

static int unix_address(const char *path, struct sockaddr_un *sun)
{
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof sun->sun_path)
        return GDRKV_E_INVALID;
    memset(sun, 0, sizeof *sun);
    sun->sun_family = AF_UNIX;
    memcpy(sun->sun_path, path, len);
    return 0;
}

/* Ours to trust: owned by our user (or, for a client, root), and nobody
 * else may write the directory. Symlinks are followed: what counts is who
 * owns what they lead to. */
static int owned_safely(const char *path, int dir, int root_ok, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (dir ? !S_ISDIR(st.st_mode) : !S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "%s is not a %s", path, dir ? "directory" : "socket");
        return -1;
    }
    if ((st.st_uid != geteuid() && !(root_ok && st.st_uid == 0)) ||
        (dir && (st.st_mode & (S_IWGRP | S_IWOTH)))) {
        snprintf(err, errlen, "%s must belong to uid %u and not be writable by others "
                 "(it belongs to uid %u, mode %03o): another user may be posing as the server",
                 path, (unsigned)geteuid(), (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777));
        return -1;
    }
    return 0;
}

static const char *dir_of(const char *path, char *buf, size_t len)
{
    snprintf(buf, len, "%s", path);
    return dirname(buf);
}

/* The socket's directory: made 0700 when missing; else it must be ours and
 * closed to writes by others, or anyone could swap the socket under us. */
static int private_dir(const char *path, char *err, size_t errlen)
{
    char copy[GK_UNIX_PATH_MAX];
    const char *dir = dir_of(path, copy, sizeof copy);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
        return -1;
    }
    return owned_safely(dir, 1, 0, err, errlen);
}

int gk_unix_server_trusted(const char *path, char *err, size_t errlen)
{
    char copy[GK_UNIX_PATH_MAX];
    return owned_safely(dir_of(path, copy, sizeof copy), 1, 1, err, errlen) == 0 &&
           owned_safely(path, 0, 1, err, errlen) == 0;
}

/* A socket file nobody listens on is what a killed server leaves behind. */
static int remove_stale(const char *path, char *err, size_t errlen)
{
    int fd = gk_connect_unix(path);
    if (fd >= 0) {
        close(fd);
        snprintf(err, errlen, "another server already listens on %s", path);
        return -1;
    }
    if (unlink(path) != 0 && errno != ENOENT) {
        snprintf(err, errlen, "cannot remove the stale socket %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int gk_listen_unix(const char *path, int backlog, char *err, size_t errlen)
{
    struct sockaddr_un sun;

    if (unix_address(path, &sun)) {
        snprintf(err, errlen, "unix socket path must be 1..%d bytes", GK_UNIX_PATH_MAX - 1);
        return GDRKV_E_INVALID;
    }
    if (private_dir(path, err, errlen))
        return GDRKV_E_DENIED;
    if (remove_stale(path, err, errlen))
        return GDRKV_E_UNAVAILABLE;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return GDRKV_E_INTERNAL;
    }
    /* The directory keeps others out between bind and chmod. */
    if (bind(fd, (struct sockaddr *)&sun, sizeof sun) != 0 || chmod(path, 0600) != 0 ||
        listen(fd, backlog) != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", path, strerror(errno));
        close(fd);
        return GDRKV_E_UNAVAILABLE;
    }
    return fd;
}

int gk_connect_unix(const char *path)
{
    struct sockaddr_un sun;

    if (unix_address(path, &sun))
        return GDRKV_E_UNAVAILABLE;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return GDRKV_E_UNAVAILABLE;
    /* A local connect completes at once or fails (EAGAIN: backlog full). */
    if (connect(fd, (struct sockaddr *)&sun, sizeof sun) != 0) {
        close(fd);
        return GDRKV_E_UNAVAILABLE;
    }
    return fd;
}

int gk_peer_is_us(int fd)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
        return 0;
    return cred.uid == geteuid() || cred.uid == 0;
}
