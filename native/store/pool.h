/*
 * pool.h - the one big memory region objects live in: a memfd mapped
 * shared, so the shm transport can hand the same pages to local clients
 * (sealed, read-only), and so RDMA can register it once.
 */
#ifndef GDRKV_POOL_H
#define GDRKV_POOL_H

#include <stddef.h>
#include <stdint.h>

struct pool {
    uint8_t *base;
    uint64_t size;          /* bytes asked for */
    uint64_t map_len;       /* size rounded up to the page size backing it */
    int fd;                 /* the memfd; -1 when not open */
    int share_fd;           /* fd of the sealed memfd for local clients
                               (read-only unless writable_share); -1 when
                               the pool can't be shared */
    int hugepages;          /* 1 when backed by 2 MiB hugetlb pages */
};

/* Once mapped, the memfd is sealed against shrinking, growing and any new
 * writable mapping or write(): the pool's own mapping stays writable, but a
 * client holding the fd (or reopening it through /proc) can neither corrupt
 * objects nor truncate the file under the server (SIGBUS). A kernel that
 * refuses the seals leaves share_fd at -1, and shm stays off. With
 * writable_share (single-tenant mode) only the size is sealed, and share_fd
 * is writable: clients copy PUT values straight into their reservations.
 *
 * hugepages: -1 try 2 MiB hugetlb pages and fall back to normal ones,
 * 0 never, 1 require. pretouch faults every page in now rather than on
 * first write. Returns 0, or -1 with a message in err. */
int pool_open(struct pool *p, uint64_t size, int hugepages, int pretouch, int writable_share,
              char *err, size_t errlen);
void pool_close(struct pool *p);

#endif
