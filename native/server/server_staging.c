/*
 * server_staging.c - see server_staging.h.
 */
#include "server_staging.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

int server_staging_open(struct server_staging *st, uint64_t len)
{
    int fd = memfd_create("gdrkv-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    void *base = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0 &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
        base = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    st->base = base;
    st->len = len;
    st->fd = fd;
    return 0;
}

void server_staging_close(struct server_staging *st)
{
    if (st->base)
        munmap((void *)st->base, st->len);
    if (st->fd >= 0)
        close(st->fd);
    st->base = NULL;
    st->fd = -1;
}
