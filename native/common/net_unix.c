/*
 * net_unix.c - the unix-domain sockets of the shm transport (net.h).
 *
 * The socket is the trust boundary of shm: whoever connects gets the pool
 * mapped read-only. So access is checked three times over: a directory only
 * we can write, a socket only we can open, and the peer's uid at accept
 * (SO_PEERCRED), which holds even when someone loosens the first two.
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

/* The socket's directory: made 0700 when missing; else it must be ours and
 * closed to writes by others, or anyone could swap the socket under us. */
static int private_dir(const char *path, char *err, size_t errlen)
{
    char copy[GK_UNIX_PATH_MAX];
    struct stat st;

    snprintf(copy, sizeof copy, "%s", path);
    const char *dir = dirname(copy);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
        return -1;
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s is not a directory", dir);
        return -1;
    }
    if (st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
        snprintf(err, errlen, "%s must belong to uid %u and not be writable by others",
                 dir, (unsigned)geteuid());
        return -1;
    }
    return 0;
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
    if (private_dir(path, err, errlen) || remove_stale(path, err, errlen))
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
