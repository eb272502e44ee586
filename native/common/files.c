/*
 * files.c - see files.h.
 */
#include "files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

int gk_open_owned_file(const char *path, const char *what, int flags, struct stat *st,
                       char *err, size_t errlen)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | flags, 0600);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot open %s %s: %s", what, path, strerror(e));
        errno = e;      /* the caller may retry without a flag (O_DIRECT: EINVAL) */
        return -1;
    }
    const char *bad = NULL;
    if (fstat(fd, st) != 0)
        bad = strerror(errno);
    else if (!S_ISREG(st->st_mode))
        bad = "not a regular file";
    else if (st->st_uid != geteuid())
        bad = "it belongs to another user";
    else if (st->st_mode & 077)
        bad = "other users may open it (chmod 600 it)";
    else if (flock(fd, LOCK_EX | LOCK_NB) != 0)
        bad = errno == EWOULDBLOCK ? "another gdrkv server is using it" : strerror(errno);
    if (bad) {
        snprintf(err, errlen, "%s %s: %s", what, path, bad);
        close(fd);
        return -1;
    }
    return fd;
}
