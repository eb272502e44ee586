/*
 * client_shm.c - see client_shm.h.
 *
 * The mapping is read-only and the server sealed the memfd against writes
 * (pool.h), so nothing a client does through it can touch the store.
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

/* Receives exactly len bytes; the first recvmsg may carry a descriptor,
 * which lands in *passed (closed again if a second one comes). */
static int recv_exact(int fd, uint8_t *buf, size_t len, int *passed, uint64_t deadline_ns)
{
    size_t got = 0;
    while (got < len) {
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(sizeof(int))];
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
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
                cm->cmsg_len == CMSG_LEN(sizeof(int))) {
                if (*passed >= 0)
                    close(*passed);
                memcpy(passed, CMSG_DATA(cm), sizeof(int));
            }
        }
        got += (size_t)n;
    }
    return 0;
}

/* HELLO: returns the pool's fd and size, or a negative gdrkv_error. */
static int hello(int fd, uint64_t deadline_ns, uint64_t *size)
{
    uint8_t buf[GK_HDR_SIZE];
    uint8_t body[GK_RESULT_SIZE];
    struct gk_hdr h = {.magic = GK_MAGIC, .version = GK_VERSION, .opcode = GK_OP_HELLO,
                       .req_id = 1};
    struct gk_result r;
    int pool_fd = -1;

    gk_hdr_encode(&h, buf);
    /* A fresh local socket always takes 40 bytes at once. */
    if (send(fd, buf, sizeof buf, MSG_NOSIGNAL) != (ssize_t)sizeof buf)
        return GDRKV_E_UNAVAILABLE;
    int rc = recv_exact(fd, buf, sizeof buf, &pool_fd, deadline_ns);
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
        rc = recv_exact(fd, body, sizeof body, &pool_fd, deadline_ns);
    if (rc == 0) {
        gk_result_decode(body, &r);
        rc = r.status != 0 || r.size == 0 || pool_fd < 0 ? GDRKV_E_PROTOCOL : 0;
        *size = r.size;
    }
    if (rc) {
        if (pool_fd >= 0)
            close(pool_fd);
        return rc;
    }
    return pool_fd;
}

static struct client_pool *map_pool(int fd, const struct stat *st, uint64_t size)
{
    struct client_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->map_len = (size_t)st->st_size;
    void *base = mmap(NULL, p->map_len, PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        GK_WARN("cannot map the server's pool: %s", strerror(errno));
        free(p);
        return NULL;
    }
    p->base = base;
    p->size = size;
    p->dev = st->st_dev;
    p->ino = st->st_ino;
    p->refs = 1;
    return p;
}

/* The mapping of the pool behind pool_fd, shared with the endpoint's
 * other connections when they map the same memfd; referenced for the
 * caller. */
/* Whether the pool memfd is sealed as docs/transports.md says: it can't
 * shrink (which would SIGBUS us mid-copy), grow, or be written again. */
static int sealed(int pool_fd)
{
    int seals = fcntl(pool_fd, F_GET_SEALS);
    int need = F_SEAL_SHRINK | F_SEAL_GROW;
    return seals >= 0 && (seals & need) == need &&
           (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE));
}

static struct client_pool *pool_of(struct client_endpoint *ep, int pool_fd, uint64_t size)
{
    struct stat st;
    struct client_pool *p = NULL, *old = NULL;

    if (!sealed(pool_fd)) {
        GK_WARN("%s: its pool memfd is not sealed: not mapping it", ep->name);
        return NULL;
    }
    /* The server may announce less than the file (hugepage rounding), never more. */
    if (fstat(pool_fd, &st) != 0 || (uint64_t)st.st_size < size)
        return NULL;
    pthread_mutex_lock(&ep->pool_lock);
    if (ep->pool && ep->pool->dev == st.st_dev && ep->pool->ino == st.st_ino &&
        ep->pool->size == size) {
        p = ep->pool;
    } else if ((p = map_pool(pool_fd, &st, size))) {
        old = ep->pool;
        ep->pool = p;
    }
    if (p)
        __atomic_add_fetch(&p->refs, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&ep->pool_lock);
    client_pool_put(old);
    return p;
}

int client_shm_connect(struct client_endpoint *ep, uint64_t deadline_ns,
                       struct client_pool **pool)
{
    uint64_t size = 0;
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
    if (rc) {
        close(fd);
        return rc;
    }
    int pool_fd = hello(fd, deadline_ns, &size);
    if (pool_fd < 0) {
        close(fd);
        return pool_fd;
    }
    *pool = pool_of(ep, pool_fd, size);
    close(pool_fd);     /* the mapping keeps the memory */
    if (!*pool) {
        close(fd);
        return GDRKV_E_UNAVAILABLE;
    }
    return fd;
}

/* ------------------------------------------------------------ copies */

struct shm_plan {
    const struct client_batch *b;
    const struct client_pool *pool;
    struct client_copy_list *out;
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
    return client_copy_add(plan->out, (uint8_t *)(uintptr_t)b->seg_ptrs[seg] + seg_off, src,
                           (size_t)len);
}

int client_shm_plan(const struct client_pool *pool, const uint8_t *lists, size_t len,
                    const struct client_batch *b, uint32_t first, uint32_t count,
                    struct client_copy_list *out, struct gpu_list *gpu)
{
    struct shm_plan plan = {.b = b, .pool = pool, .out = out, .gpu = gpu};
    return client_chunks_walk(lists, len, pool->size, b, first, count, NULL, b->got, add_copy,
                              &plan);
}
