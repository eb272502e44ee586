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
#include "client_frame.h"
#include "client_gpu.h"
#include "common/common.h"
#include "gdrkv.h"
#include "common/log.h"
#include "common/net.h"
#include "common/protocol.h"

void client_pool_put(struct client_pool *p)
{
    if (p && __atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        gpu_pool_release(p);
        munmap((void *)p->base, p->map_len);
        pthread_mutex_destroy(&p->pins_lock);
        free(p);
    }
}

/* pins_told when the server may not know the pool's pins (no slice pins
 * that many bytes). */
#define PINS_UNTOLD UINT64_MAX

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
    static uint64_t mappings;      /* names the process's mappings in PINS */
    pthread_mutex_init(&p->pins_lock, NULL);
    p->pins_mapping = __atomic_add_fetch(&mappings, 1, __ATOMIC_RELAXED);
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
        p->gpu_pins = ep->gpu_pins;
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
    /* The server forgets a process's reports with its last connection
     * (idle ones close): a new connection's first frame tells it again. */
    __atomic_store_n(&(*pool)->pins_told, PINS_UNTOLD, __ATOMIC_RELAXED);
    return fd;
}

/* ------------------------------------------------------------ copies */

/* A frame's copies between the caller's segments and one shared mapping
 * (the pool, or the connection's staging), planned in one pass: each
 * piece goes to the CPU's list, or for a GPU segment to the frame's
 * launch, already addressed as the GPU reaches the mapping. */
struct shm_plan {
    const struct client_batch *b;
    uint8_t *host;              /* the mapping, as the CPU reaches it */
    int to_caller;              /* GET: mapping -> segments; PUT: the other way */
    struct gk_copy_list *out;
    struct gpu_list *gpu;
    struct gpu_reach *reach;    /* resolved at the frame's first GPU piece */
};

/* The one place a piece's copy is given to the CPU or the GPU: between
 * offset off of the mapping and the caller's segment seg, at seg_off. */
static int add_piece(struct shm_plan *pl, uint64_t seg, uint64_t seg_off, uint64_t off,
                     uint64_t len)
{
    const struct client_batch *b = pl->b;
    uint64_t caller = b->seg_ptrs[seg] + seg_off;
    int dev = gpu_seg_device(b->gpu, seg);

    if (dev < 0) {
        uint8_t *shared = pl->host + off, *mine = (uint8_t *)(uintptr_t)caller;
        return pl->to_caller ? gk_copy_add(pl->out, mine, shared, (size_t)len)
                             : gk_copy_add(pl->out, shared, mine, (size_t)len);
    }
    if (!pl->reach->resolved)
        gpu_reach_resolve(pl->reach, b->gpu, dev);
    return gpu_reach_add(pl->reach, pl->gpu, dev, caller, off, len, pl->to_caller);
}

/* A piece of a LEASE's or RESERVE's chunk lists, laid over a segment. */
static int add_listed(void *arg, uint32_t p, uint64_t seg, uint64_t seg_off, uint64_t pool_off,
                      uint64_t len)
{
    (void)p;
    return add_piece(arg, seg, seg_off, pool_off, len);
}

/* The copies a LEASE answer describes for the frame's keys: lists/len are
 * the chunk lists after the results, and keys whose result is a hit
 * (b->got[p] bytes) have one each. Every length and offset is checked
 * against the pool and the destination first. 0 or GDRKV_E_PROTOCOL
 * (malformed) / GDRKV_E_INTERNAL (out of memory). */
static int plan_leased(struct client_conn *c, const uint8_t *lists, size_t len,
                       struct gpu_list *gpu, struct gpu_reach *reach)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;
    struct shm_plan plan = {.b = b, .host = (uint8_t *)c->pool->base, .to_caller = 1,
                            .out = &c->copies, .gpu = gpu, .reach = reach};
    *reach = (struct gpu_reach){.pool = c->pool, .held = c->gpu ? gpu_conn_held(c->gpu) : NULL};
    return client_chunks_walk(lists, len, c->pool->size, b, f->first, f->count, NULL, b->got,
                              add_listed, &plan);
}

/* A PUT_STAGED frame's copies: its values into staging from offset 0, in
 * order, as a PUT payload lays them out (the frame's payload fits: the
 * exchange was chosen so). 0, or GDRKV_E_INTERNAL (out of memory). */
static int plan_staged(struct client_conn *c, struct gpu_list *gpu, struct gpu_reach *reach)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;
    struct shm_plan plan = {.b = b, .host = c->staging.base, .out = &c->copies, .gpu = gpu,
                            .reach = reach};
    uint64_t off = 0;

    *reach = (struct gpu_reach){.staging = &c->staging, .frame_bytes = f->payload_len};
    for (uint32_t p = f->first; p < f->first + f->count; p++) {
        uint64_t seg = b->first_seg[p];
        for (uint32_t k = 0; k < b->seg_counts[b->index[p]]; k++, seg++) {
            if (b->seg_lens[seg] && add_piece(&plan, seg, 0, off, b->seg_lens[seg]))
                return GDRKV_E_INTERNAL;
            off += b->seg_lens[seg];
        }
    }
    return 0;
}

/* Single-tenant: a RESERVE answer's copies, the values of the keys with
 * listed[k] set into their reserved chunks of the writable pool, checked
 * as plan_leased checks. */
static int plan_reserved(struct client_conn *c, const uint8_t *lists, size_t len,
                         const uint8_t *listed, struct gpu_list *gpu, struct gpu_reach *reach)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;
    struct shm_plan plan = {.b = b, .host = (uint8_t *)c->pool->base, .out = &c->copies,
                            .gpu = gpu, .reach = reach};

    *reach = (struct gpu_reach){.pool = c->pool, .held = c->gpu ? gpu_conn_held(c->gpu) : NULL};
    c->copies.streamed = 1;
    return client_chunks_walk(lists, len, c->pool->size, b, f->first, f->count, listed, b->sizes,
                              add_listed, &plan);
}

/* ------------------------------------------------------------ exchanges */

/* A followed frame's copy raises the staged word at least this often: the
 * server's copy starts this far behind, and each raise moves the word's
 * cache line between the two cores. */
#define CLIENT_STAGED_PUBLISH_BYTES (32u << 10)

/* Where the frame's GPU pieces are planned: *gpu, or NULL when the call
 * has no GPU segment. GDRKV_E_INTERNAL when it can't be had. */
static int frame_gpu_list(struct client_conn *c, struct gpu_list **gpu)
{
    *gpu = c->batch->gpu ? gpu_conn_list(&c->gpu) : NULL;
    return c->batch->gpu && !*gpu ? GDRKV_E_INTERNAL : 0;
}

/* A PUT frame's copies, planned into c->copies (host sources) and gpu
 * (reaching staging or the pool as reach says). 0 when done, 1 when the
 * GPU's part still runs, or a negative error. */
static int run_put_copies(struct client_conn *c, struct gpu_list *gpu,
                          const struct gpu_reach *reach)
{
    struct client_batch *b = c->batch;
    int rc = 0;
    if (gpu)
        rc = gpu_conn_copy_shared(c->gpu, b, reach->mode, &c->copies, b->copier);
    else if (c->copies.count)
        gk_copy_run(b->copier, &c->copies);
    gk_copy_reset(&c->copies);
    return rc;
}

/* A PUT_STAGED frame's values, copied into the connection's staging: the
 * GPU ones by one launch, the host ones by the CPU meanwhile. 0 when they
 * are in place, 1 when the launch still runs, or a negative error. */
static int stage_values(struct client_conn *c)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;
    struct gpu_list *gpu;
    struct gpu_reach reach;

    int rc = frame_gpu_list(c, &gpu);
    if (rc == 0)
        rc = plan_staged(c, gpu, &reach);
    if (rc == 0)
        rc = run_put_copies(c, gpu, &reach);
    gk_copy_reset(&c->copies);
    b->shm_bytes_staged += rc < 0 ? 0 : f->payload_len;
    return rc;
}

/* Whether a PUT_STAGED frame goes before its values (PUT_STAGED_FOLLOW):
 * the server then reserves while this thread copies them into staging,
 * and copies each into the pool as soon as the staged word says it is
 * there, instead of starting only once all are. Only host values this
 * thread copies alone, in order, can be followed: a GPU gather, or a copy
 * shared with the helpers, fills staging out of order. And one frame of a
 * call at a time: a following worker holds its core while this thread
 * copies, and with every frame followed the workers of a 16-frame call
 * held the cores that workers with frames already staged needed
 * (docs/transports.md, "PUT: staging, then the server's copy"). The call's
 * last frame is followed in any case: the server's copy of the frames
 * before it overlaps this thread's copies of the next, but the last
 * frame's copy would be the call's tail. */
static int follows(const struct client_conn *c)
{
    return c->staging.staged_word && !c->batch->gpu &&
           c->frame->payload_len < c->batch->copier->parallel_bytes &&
           (!c->batch->follows_in_flight || !c->batch->frames_unstarted);
}

/* A PUT_STAGED frame begins: followed, its copies are only planned (they
 * run once the request is sent, client_shm_stage_followed); else they run
 * now, and a GPU launch among them holds the request back (WAIT) while
 * the call's other connections go on. */
static int begin_staged(struct client_conn *c)
{
    struct gpu_reach none;

    if (follows(c)) {
        c->follow = FOLLOW_TO_COPY;
        /* Read by the server only after it has the request. */
        gk_copy_publish(c->staging.staged_word, 0);
        return plan_staged(c, NULL, &none);    /* host values only */
    }
    int rc = stage_values(c);
    if (rc == 1)
        c->phase = CLIENT_CONN_WAIT;
    return GK_MIN(rc, 0);
}

/* The staging launch is done: the request goes. */
static int staged_waited(struct client_conn *c)
{
    c->phase = CLIENT_CONN_SEND;
    return 0;
}

void client_shm_stage_followed(struct client_conn *c)
{
    gk_copy_run_published(&c->copies, c->staging.base, c->staging.staged_word,
                          CLIENT_STAGED_PUBLISH_BYTES);
    gk_copy_reset(&c->copies);
    c->batch->shm_bytes_staged += c->frame->payload_len;
    c->batch->follows_in_flight++;
    c->follow = FOLLOW_SENT;
}

int client_shm_send_again(struct client_conn *c)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;

    b->shm_staged_sent_again++;
    /* c->answer is the request's answer handler, which calls this: the
     * frame sent again is answered the same way. */
    client_frame_expect(c, GK_OP_PUT_STAGED, c->next_req_id++, c->answer);
    client_frame_encode(b, f, GK_OP_PUT_STAGED, c->req_id, 0);
    c->phase = CLIENT_CONN_SEND;
    client_iov_init(&c->io, f->buf, GK_HDR_SIZE + (size_t)f->body_len, b, NULL, f->first, 0,
                    b->sizes);
    return 0;
}

/* Whether the lease is seen to hold now, after the copy: the server sets
 * the lease word to 0 before it lets any pinned object go, and a server
 * that died (whose pool file a new server may be writing) shows on the
 * socket, which the kernel closes at its exit. Anything else on the socket
 * (an answer nobody asked for) counts as not seen. */
static int lease_seen_held(const struct client_conn *c)
{
    if (!c->staging.lease_word ||
        __atomic_load_n(c->staging.lease_word, __ATOMIC_SEQ_CST) != GK_LEASE_HELD)
        return 0;
    struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLRDHUP};
    return poll(&p, 1, 0) == 0;
}

/* The lease's copy is done (the GPU's too): the lease ends. Seen to hold,
 * the RELEASE goes unanswered and the frame ends once it is sent; else its
 * answer says whether the bytes were the objects'. */
static void end_lease_copied(struct client_conn *c, uint64_t bytes)
{
    c->batch->shm_bytes_copied += bytes;
    if (lease_seen_held(c)) {
        c->batch->shm_leases_seen_held++;
        c->unanswered = 1;
        client_frame_send_followup(c, c->release, 0, 0, GK_RELEASE_UNANSWERED);
    } else {
        client_frame_send_followup(c, c->release, 0, 0, 0);
    }
}

/* The LEASE answered over shm: copies the objects out of the pool, then
 * releases. A lease with nothing to copy needs no confirmation; the
 * server drops it when the next frame comes. */
static int copy_leased(struct client_conn *c)
{
    struct client_batch *b = c->batch;
    uint64_t bytes;
    size_t len;

    int rc = client_frame_take_results(c, &bytes);
    if (rc)
        return rc;
    const uint8_t *lists = client_frame_chunk_lists(c, &len);
    struct gpu_list *gpu;
    struct gpu_reach reach;
    rc = frame_gpu_list(c, &gpu);
    if (rc == 0)
        rc = plan_leased(c, lists, len, gpu, &reach);
    if (rc == 0 && bytes > 0 && gpu && gpu->count) {
        /* One launch for the frame's GPU pieces, the CPU copying the host
         * ones meanwhile; the RELEASE goes once the kernel is done too
         * (WAIT), and the call's other connections go on meanwhile. */
        rc = gpu_conn_copy_shared(c->gpu, b, reach.mode, &c->copies, b->copier);
        gk_copy_reset(&c->copies);
        if (rc < 0) {
            c->why = "GPU copy failed";
            return rc;
        }
        c->leased_bytes = bytes;
        c->phase = CLIENT_CONN_WAIT;
        return 0;
    } else if (rc == 0 && bytes > 0) {
        gk_copy_run(b->copier, &c->copies);
    }
    gk_copy_reset(&c->copies);
    if (gpu)
        gpu_list_reset(gpu);
    if (rc == GDRKV_E_PROTOCOL)
        return client_frame_broken(c, "bad chunk lists");
    if (rc) {
        c->why = "out of memory";
        return rc;
    }
    if (bytes > 0)
        end_lease_copied(c, bytes);
    return 0;
}

/* The lease's launch is done: the bytes are the caller's, the lease ends. */
static int leased_waited(struct client_conn *c)
{
    end_lease_copied(c, c->leased_bytes);
    return 0;
}

/* The RESERVE answered on a single-tenant server: copies the values of
 * the reserved keys into their chunks of the (writable) pool, then
 * COMMITs them. */
static int copy_reserved(struct client_conn *c)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;
    const uint8_t *lists;
    uint8_t *flags;
    size_t len;
    struct gpu_list *gpu;
    struct gpu_reach reach;

    int rc = client_frame_take_reservations(c, &flags, &lists, &len);
    if (rc)
        return rc;
    rc = frame_gpu_list(c, &gpu);
    if (rc == 0)
        rc = plan_reserved(c, lists, len, flags, gpu, &reach);
    if (rc == GDRKV_E_PROTOCOL)
        return client_frame_broken(c, "bad chunk lists");
    if (rc == 0)
        rc = run_put_copies(c, gpu, &reach);
    if (rc < 0) {
        gk_copy_reset(&c->copies);
        c->why = "the values could not be copied into the pool";
        return rc;
    }
    for (uint32_t k = 0; k < f->count; k++)
        b->shm_bytes_staged += flags[k] ? b->sizes[f->first + k] : 0;
    if (rc == 1)
        c->phase = CLIENT_CONN_WAIT;    /* COMMIT goes once the launch is done */
    else
        client_frame_send_followup(c, c->commit, f->count, f->count, 0);
    return 0;
}

/* The reservations' launch is done: COMMIT goes. */
static int reserved_waited(struct client_conn *c)
{
    client_frame_send_followup(c, c->commit, c->frame->count, c->frame->count, 0);
    return 0;
}

/* The frame's launch, polled. */
static int poll_launch(struct client_conn *c)
{
    int rc = gpu_conn_copy_done(c->gpu);
    if (rc < 0)
        c->why = "GPU copy failed";
    return rc;
}

/* shm GET: copied out of the mapped pool, then the lease confirmed. */
/* ------------------------------------------------------------ pin reports */

int client_shm_pins_request(struct client_conn *c, uint8_t *buf)
{
    struct client_pool *p = c->pool;
    struct gpu_slices *s = p ? __atomic_load_n(&p->gpu_slices, __ATOMIC_ACQUIRE) : NULL;
    if (!s || __atomic_load_n(&p->pins_off, __ATOMIC_RELAXED))
        return 0;
    uint64_t pinned = gpu_slices_pinned(s);
    uint64_t told = __atomic_load_n(&p->pins_told, __ATOMIC_RELAXED);
    /* Nothing pinned, on a connection that said nothing yet: nothing to
     * tell (the next change will be). */
    if (pinned == told || (pinned == 0 && told == PINS_UNTOLD))
        return 0;
    /* Under the lock each seq goes out with the bytes it was given, so
     * the server keeps the latest whatever order connections deliver them. */
    pthread_mutex_lock(&p->pins_lock);
    struct gk_pins r = {.mapping = p->pins_mapping, .seq = ++p->pins_seq,
                        .bytes = gpu_slices_pinned(s)};
    __atomic_store_n(&p->pins_told, r.bytes, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&p->pins_lock);

    struct gk_hdr h = {.magic = GK_MAGIC, .version = GK_VERSION, .opcode = GK_OP_PINS,
                       .body_len = GK_PINS_BODY_SIZE, .req_id = c->next_req_id++};
    gk_hdr_encode(&h, buf);
    gk_pins_encode(buf + GK_HDR_SIZE, &r);
    return 1;
}

void client_shm_pins_answered(struct client_conn *c)
{
    const struct gk_hdr *h = &c->resp;
    if (h->status == 0 || __atomic_exchange_n(&c->pool->pins_off, 1, __ATOMIC_RELAXED))
        return;
    if (h->status == GDRKV_E_UNSUPPORTED) {     /* a server older than PINS */
        GK_DEBUG("%s takes no pin reports", c->ep->name);
        return;
    }
    GK_WARN("%s refused this process's report of what it pins of the pool (%s): %.*s; "
            "no more reports from this mapping", c->ep->name, gdrkv_strerror(h->status),
            (int)GK_MIN(h->body_len, 200u), (const char *)c->body);
}

static const struct client_exchange shm_lease = {
    .request = GK_OP_LEASE, .answer = copy_leased,
    .followup = GK_OP_RELEASE, .followup_answer = client_frame_end_lease,
    .poll = poll_launch, .waited = leased_waited,
};

/* shm PUT: copied into the connection's staging before the request goes,
 * or after it with the server copying behind (follows); the server copies
 * them into the pool, and answers as to a plain PUT. */
static const struct client_exchange shm_staged = {
    .request = GK_OP_PUT_STAGED, .begin = begin_staged, .answer = client_frame_take_plain,
    .poll = poll_launch, .waited = staged_waited,
};

/* shm PUT, single-tenant server: copied into the reserved chunks, then committed. */
static const struct client_exchange shm_reserve = {
    .request = GK_OP_RESERVE, .answer = copy_reserved,
    .followup = GK_OP_COMMIT, .followup_answer = client_frame_take_commit,
    .poll = poll_launch, .waited = reserved_waited,
};

const struct client_exchange *client_shm_exchange(const struct client_conn *c)
{
    uint8_t op = c->batch->opcode;

    if (op == GK_OP_GET)
        return &shm_lease;
    if (op == GK_OP_PUT && c->pool->writable)
        return &shm_reserve;
    if (op == GK_OP_PUT && c->staging.base && c->frame->payload_len <= c->staging.len)
        return &shm_staged;
    return NULL;
}
