/*
 * server_staging.c - see server_staging.h.
 */
#include "server_staging.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/protocol.h"

int server_staging_open(struct server_staging *st, uint64_t len)
{
    /* Whole cache lines of values, so that the words after them are
     * aligned: a misaligned u64 may be read torn, or fault. */
    len = (len + GK_LEASE_WORD_BYTES - 1) / GK_LEASE_WORD_BYTES * GK_LEASE_WORD_BYTES;
    uint64_t map_len = len + GK_LEASE_WORD_BYTES;
    int fd = memfd_create("gdrkv-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    void *base = MAP_FAILED;
    if (ftruncate(fd, (off_t)map_len) == 0 &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
        base = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    st->base = base;
    st->len = len;
    st->lease_word = (uint32_t *)((uint8_t *)base + len);
    st->staged_word = (const uint64_t *)((uint8_t *)base + len + GK_STAGED_WORD_OFFSET);
    st->fd = fd;
    return 0;
}

void server_staging_lease(struct server_staging *st, uint32_t held)
{
    /* Sequentially consistent: the word is 0 before any unpin that follows
     * is seen, so a client that still reads 1 after its copy copied
     * objects that were pinned all along. */
    if (st->lease_word)
        __atomic_store_n(st->lease_word, held, __ATOMIC_SEQ_CST);
}

void server_staging_close(struct server_staging *st)
{
    if (st->base)
        munmap((void *)st->base, st->len + GK_LEASE_WORD_BYTES);
    if (st->fd >= 0)
        close(st->fd);
    st->base = NULL;
    st->lease_word = NULL;
    st->staged_word = NULL;
    st->fd = -1;
}
