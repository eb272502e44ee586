/*
 * client_shm.c - see client_shm.h.
 *
 * The mapping is read-only and the server sealed the memfd against writes
 * (pool.h), so nothing a client does through it can touch the store. A
 * pool file can't be sealed: it must be private to our user instead.
 */
#include "client_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_auth.h"
#include "client_chunks.h"
#include "common/common.h"
#include "gdrkv.h"
#include "client_gpu.h"
#include "common/log.h"
#include "common/net.h"
#include "common/protocol.h"

void client_pool_put(struct client_pool *p)
{
    if (p && __atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        gpu_pool_release(p);
        munmap((void *)p->base, p->map_len);
        free(p);
    }
}

/* Receives exactly len bytes; descriptors that come with them land in
 * fds[0] and fds[1] in order (fds[nfds++]); any beyond those are closed. */
static int recv_exact(int fd, uint8_t *buf, size_t len, int fds[2], int *nfds,
                      uint64_t deadline_ns)
{
    size_t got = 0;
    while (got < len) {
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(2 * sizeof(int))];
        } control;
        struct iovec iov = {.iov_base = buf + got, .iov_len = len - got};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
                             .msg_control = control.buf, .msg_controllen = sizeof control.buf};
        ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            int rc = gk_wait_fd(fd, POLLIN, deadline_ns);
            if (rc)
                return rc;
            continue;
        }
        if (n <= 0 || (msg.msg_flags & MSG_CTRUNC))
            return GDRKV_E_UNAVAILABLE;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                continue;
            size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < count; i++) {
                int passed;
                memcpy(&passed, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                if (*nfds < 2)
                    fds[(*nfds)++] = passed;
                else
                    close(passed);
            }
        }
        got += (size_t)n;
    }
    return 0;
}

/* What HELLO brings: the pool's fd and size, the connection's staging fd
 * (or -1), and the answer's flags. */
struct hello_answer {
    int fds[2];
    int nfds;
    uint64_t size;
    uint16_t flags;
};

static void hello_drop(struct hello_answer *a)
{
    for (int i = 0; i < a->nfds; i++)
        close(a->fds[i]);
    a->nfds = 0;
}

/* HELLO: 0 with *a filled (at least the pool's fd), or a negative gdrkv_error. */
static int hello(int fd, uint64_t deadline_ns, struct hello_answer *a)
{
    uint8_t buf[GK_HDR_SIZE];
    uint8_t body[GK_RESULT_SIZE];
    struct gk_hdr h = {.magic = GK_MAGIC, .version = GK_VERSION, .opcode = GK_OP_HELLO,
                       .req_id = 1};
    struct gk_result r;

    *a = (struct hello_answer){.fds = {-1, -1}};
    gk_hdr_encode(&h, buf);
    /* A fresh local socket always takes 40 bytes at once. */
    if (send(fd, buf, sizeof buf, MSG_NOSIGNAL) != (ssize_t)sizeof buf)
        return GDRKV_E_UNAVAILABLE;
    int rc = recv_exact(fd, buf, sizeof buf, a->fds, &a->nfds, deadline_ns);
    if (rc == 0) {
        gk_hdr_decode(buf, &h);
        if (h.magic != GK_MAGIC || h.opcode != (GK_OP_HELLO | GK_OP_RESPONSE) ||
            h.status != 0 || h.count != 1 || h.body_len != GK_RESULT_SIZE || h.payload_len)
            /* Refused: no shm; denied: no token, and no tcp either. */
            rc = h.status == GDRKV_E_DENIED ? GDRKV_E_DENIED
                 : h.status < 0             ? GDRKV_E_UNAVAILABLE
                                            : GDRKV_E_PROTOCOL;
    }
    if (rc == 0)
        rc = recv_exact(fd, body, sizeof body, a->fds, &a->nfds, deadline_ns);
    if (rc == 0) {
        gk_result_decode(body, &r);
        rc = r.status != 0 || r.size == 0 || a->nfds < 1 ? GDRKV_E_PROTOCOL : 0;
        a->size = r.size;
        a->flags = h.flags;
    }
    if (rc)
        hello_drop(a);
    return rc;
}

static struct client_pool *map_pool(int fd, const struct stat *st, uint64_t size, int writable)
{
    struct client_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->map_len = (size_t)st->st_size;
    void *base = mmap(NULL, p->map_len, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED,
                      fd, 0);
    if (base == MAP_FAILED) {
        GK_WARN("cannot map the server's pool: %s", strerror(errno));
        free(p);
        return NULL;
    }
    p->base = base;
    p->size = size;
    p->dev = st->st_dev;
    p->ino = st->st_ino;
    p->writable = writable;
    p->refs = 1;
    return p;
}

/* Whether a memfd can neither shrink (which would SIGBUS us mid-copy) nor
 * grow, and, unless writable is allowed, be written again: the pool as
 * docs/transports.md says, and a staging memfd (writable, of course). */
static int sealed(int fd, int writable)
{
    int seals = fcntl(fd, F_GET_SEALS);
    int need = F_SEAL_SHRINK | F_SEAL_GROW;
    return seals >= 0 && (seals & need) == need &&
           (writable || (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)));
}

/* Whether fd is a server's pool file (--pool-file): a regular file of
 * ours that no other user may write. Files can't be sealed, but then only
 * our own user (and root) could shrink it under us, and our user can kill
 * us anyway. */
static int private_file(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
           !(st.st_mode & (S_IWGRP | S_IWOTH));
}

/* The mapping of the pool behind pool_fd, shared with the endpoint's
 * other connections when they map the same memfd; referenced for the
 * caller. A single-tenant server's pool (writable) is mapped writable. */
static struct client_pool *pool_of(struct client_endpoint *ep, int pool_fd, uint64_t size,
                                   int writable)
{
    struct stat st;
    struct client_pool *p = NULL, *old = NULL;

    if (!sealed(pool_fd, writable) && !private_file(pool_fd)) {
        GK_WARN("%s: its pool is neither a sealed memfd nor a pool file of ours: not mapping it",
                ep->name);
        return NULL;
    }
    /* The server may announce less than the file (hugepage rounding), never more. */
    if (fstat(pool_fd, &st) != 0 || (uint64_t)st.st_size < size)
        return NULL;
    pthread_mutex_lock(&ep->pool_lock);
    if (ep->pool && ep->pool->dev == st.st_dev && ep->pool->ino == st.st_ino &&
        ep->pool->size == size && ep->pool->writable == writable) {
        p = ep->pool;
    } else if ((p = map_pool(pool_fd, &st, size, writable))) {
        old = ep->pool;
        ep->pool = p;
    }
    if (p)
        __atomic_add_fetch(&p->refs, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&ep->pool_lock);
    client_pool_put(old);
    return p;
}

uint64_t client_shm_staging_room(struct client_endpoint *ep)
{
    pthread_mutex_lock(&ep->pool_lock);
    uint64_t room = !ep->pool          ? UINT64_MAX
                    : ep->pool->writable ? 0
                                         : __atomic_load_n(&ep->pool->staging_len, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&ep->pool_lock);
    return room;
}

/* Maps the connection's staging memfd, when the server gave one that is
 * sealed against shrinking; without it PUTs simply go on the socket. With
 * lease_word, its last GK_LEASE_WORD_BYTES are the lease word's. */
static void map_staging(struct client_endpoint *ep, int fd, int lease_word, int staged_word,
                        struct client_staging *st)
{
    struct stat sb;
    *st = (struct client_staging){0};
    if (fd < 0)
        return;
    if (!sealed(fd, 1) || fstat(fd, &sb) != 0 ||
        sb.st_size <= (lease_word ? GK_LEASE_WORD_BYTES : 0)) {
        GK_WARN("%s: its staging memfd is not sealed: PUTs go on the socket", ep->name);
        return;
    }
    void *base = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        GK_DEBUG("%s: cannot map its staging memfd (%s): PUTs go on the socket", ep->name,
                 strerror(errno));
        return;
    }
    st->base = base;
    st->map_len = (uint64_t)sb.st_size;
    st->len = st->map_len - (lease_word ? GK_LEASE_WORD_BYTES : 0);
    st->lease_word = lease_word ? (const uint32_t *)(st->base + st->len) : NULL;
    st->staged_word = lease_word && staged_word
                          ? (uint64_t *)(st->base + st->len + GK_STAGED_WORD_OFFSET)
                          : NULL;
}

void client_staging_unmap(struct client_staging *st)
{
    if (!st->base)
        return;
    gpu_staging_release(st);
    munmap(st->base, st->map_len);
    st->base = NULL;
    st->lease_word = NULL;
    st->staged_word = NULL;
}

int client_shm_connect(struct client_endpoint *ep, uint64_t deadline_ns,
                       struct client_pool **pool, struct client_staging *staging)
{
    struct hello_answer a;
    int fd = gk_connect_unix(ep->unix_path);
    if (fd < 0)
        return fd;
    char why[400];
    if (!gk_unix_server_trusted(ep->unix_path, why, sizeof why) || !gk_peer_is_us(fd)) {
        if (gk_peer_is_us(fd))
            GK_WARN("%s: not using its unix socket: %s", ep->name, why);
        else
            GK_WARN("%s: the process on %s runs as another user: not trusting it", ep->name,
                    ep->unix_path);
        close(fd);
        return GDRKV_E_UNAVAILABLE;
    }
    int rc = ep->token ? client_auth(fd, ep->token, ep->name, deadline_ns) : 0;
    if (rc == 0)
        rc = hello(fd, deadline_ns, &a);
    if (rc) {
        close(fd);
        return rc;
    }
    *pool = pool_of(ep, a.fds[0], a.size, (a.flags & GK_HELLO_WRITABLE) != 0);
    map_staging(ep, a.nfds > 1 ? a.fds[1] : -1, (a.flags & GK_HELLO_LEASE_WORD) != 0,
                (a.flags & GK_HELLO_STAGED_WORD) != 0,
                staging);
    hello_drop(&a);     /* the mappings keep the memory */
    if (!*pool) {
        client_staging_unmap(staging);
        close(fd);
        return GDRKV_E_UNAVAILABLE;
    }
    /* Every connection of one server gets staging of one size. */
    __atomic_store_n(&(*pool)->staging_len, staging->len, __ATOMIC_RELAXED);
    return fd;
}

/* ------------------------------------------------------------ copies */

struct shm_plan {
    const struct client_batch *b;
    const struct client_pool *pool;
    struct gk_copy_list *out;
    struct gpu_list *gpu;
};

/* Host destinations become CPU copies; GPU ones go to the frame's launch. */
static int add_copy(void *arg, uint32_t p, uint64_t seg, uint64_t seg_off, uint64_t pool_off,
                    uint64_t len)
{
    struct shm_plan *plan = arg;
    const struct client_batch *b = plan->b;
    const uint8_t *src = plan->pool->base + pool_off;
    int dev = gpu_seg_device(b->gpu, seg);
    (void)p;
    if (dev >= 0)
        return gpu_list_add(plan->gpu, dev, b->gpu->orig[seg] + seg_off,
                            (uint64_t)(uintptr_t)src, len);
    return gk_copy_add(plan->out, (uint8_t *)(uintptr_t)b->seg_ptrs[seg] + seg_off, src,
                           (size_t)len);
}

int client_shm_plan(const struct client_pool *pool, const uint8_t *lists, size_t len,
                    const struct client_batch *b, uint32_t first, uint32_t count,
                    struct gk_copy_list *out, struct gpu_list *gpu)
{
    struct shm_plan plan = {.b = b, .pool = pool, .out = out, .gpu = gpu};
    return client_chunks_walk(lists, len, pool->size, b, first, count, NULL, b->got, add_copy,
                              &plan);
}

/* One PUT piece, from the caller's segment to dst (in staging or the
 * pool): host sources become CPU copies, GPU ones go to the launch. */
static int add_put_copy(const struct client_batch *b, uint64_t seg, uint64_t seg_off,
                        uint8_t *dst, uint64_t len, struct gk_copy_list *out,
                        struct gpu_list *gpu)
{
    int dev = gpu_seg_device(b->gpu, seg);
    if (dev >= 0)
        return gpu_list_add(gpu, dev, (uint64_t)(uintptr_t)dst, b->gpu->orig[seg] + seg_off,
                            len);
    return gk_copy_add(out, dst, (const uint8_t *)(uintptr_t)b->seg_ptrs[seg] + seg_off,
                           (size_t)len);
}

int client_shm_plan_staged(const struct client_staging *st, const struct client_batch *b,
                           uint32_t first, uint32_t count, struct gk_copy_list *out,
                           struct gpu_list *gpu)
{
    uint8_t *dst = st->base;
    for (uint32_t p = first; p < first + count; p++) {
        uint64_t seg = b->first_seg[p];
        for (uint32_t k = 0; k < b->seg_counts[b->index[p]]; k++, seg++) {
            if (b->seg_lens[seg] &&
                add_put_copy(b, seg, 0, dst, b->seg_lens[seg], out, gpu))
                return GDRKV_E_INTERNAL;
            dst += b->seg_lens[seg];
        }
    }
    return 0;
}

struct reserve_plan {
    const struct client_batch *b;
    const struct client_pool *pool;
    struct gk_copy_list *out;
    struct gpu_list *gpu;
};

static int add_reserved_copy(void *arg, uint32_t p, uint64_t seg, uint64_t seg_off,
                             uint64_t pool_off, uint64_t len)
{
    struct reserve_plan *plan = arg;
    (void)p;
    return add_put_copy(plan->b, seg, seg_off, (uint8_t *)plan->pool->base + pool_off, len,
                        plan->out, plan->gpu);
}

int client_shm_plan_reserved(const struct client_pool *pool, const uint8_t *lists, size_t len,
                             const struct client_batch *b, uint32_t first, uint32_t count,
                             const uint8_t *listed, struct gk_copy_list *out,
                             struct gpu_list *gpu)
{
    struct reserve_plan plan = {.b = b, .pool = pool, .out = out, .gpu = gpu};
    out->streamed = 1;
    return client_chunks_walk(lists, len, pool->size, b, first, count, listed, b->sizes,
                              add_reserved_copy, &plan);
}
