/*
 * server_conn.c - see server_conn.h.
 *
 * Reads take exactly the bytes of the current frame part (header, body,
 * payload), never more, so a pipelined next frame stays in the socket
 * until this one's response is written. Epoll is level-triggered: the
 * connection listens for EPOLLIN while reading and for EPOLLOUT only while
 * a response is blocked on a full socket.
 */
#include "server_conn.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/common.h"
#include "common/grow.h"
#include "common/log.h"
#include "server_disk.h"
#include "server_ops.h"
#include "server_rdma.h"
#include "server_reply.h"
#include "server_state.h"
#include "server_stats.h"
#include "server_strangers.h"

/* Steps one event may run before the worker moves on to other connections. */
#define CONN_STEPS_PER_EVENT 64
/* Buffers above this are freed after their frame instead of being kept
 * for the next one, so pooled idle connections stay small. */
#define CONN_KEEP_BYTES (256u << 10)
/* Bodies up to this size never wait for max_buffered_bytes: the frames of
 * ordinary batches must go on while big ones queue. */
#define CONN_SMALL_BODY (64u << 10)

enum step {
    STEP_CLOSE = -1,    /* the connection is finished */
    STEP_WAIT = 0,      /* the socket has nothing more for now */
    STEP_MORE = 1       /* progress made; run the next step */
};

int server_conn_open(struct server_worker *w, int fd, int local, const struct server_peer *peer)
{
    struct server_conn *c = calloc(1, sizeof *c);
    if (!c)
        return -1;
    c->fd = fd;
    c->worker = w;
    c->serial = ++w->next_serial;
    c->local = local;
    c->peer = *peer;
    c->pass_fds[0] = c->pass_fds[1] = -1;
    c->staging.fd = -1;
    c->auth = w->server->token.len ? CONN_AUTH_NONE : CONN_AUTH_DONE;
    c->events = EPOLLIN;
    c->last_progress_ns = c->opened_ns = c->accepted_ns = gk_now_ns();
    c->slot = CONN_SLOT_CLIENT;
    if (!server_conn_slot_at_accept(w->server, local)) {
        enum server_stranger_take got = server_strangers_take(w->server->strangers,
                                                              &c->stranger, peer, fd);
        if (got == STRANGER_REFUSED) {
            gk_counter_add(&w->counters.unauthenticated_refused, 1);
            GK_DEBUG("connection refused: max_unauthenticated or its peer's share reached");
            free(c);
            return -2;
        }
        gk_counter_add(&w->counters.unauthenticated_evicted, got == STRANGER_TAKEN_EVICTING);
        c->slot = CONN_SLOT_STRANGER;
    }
    struct epoll_event ev = {.events = c->events, .data.ptr = c};
    if (epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        if (c->slot == CONN_SLOT_STRANGER)
            server_strangers_give(w->server->strangers, &c->stranger);
        free(c);
        return -1;
    }
    c->next = w->conns;
    if (w->conns)
        w->conns->prev = c;
    w->conns = c;
    if (local) {    /* server_conn_close leaves */
        c->pid = server_gpu_pins_peer_pid(fd);
        server_gpu_pins_join(w->server->gpu_pins, c->pid);
    }
    return 0;
}

void server_conn_close(struct server_conn *c)
{
    struct server_worker *w = c->worker;

    /* QPs first: nothing may reach the pool once pins and reservations go. */
    server_rdma_conn_destroy(c);
    server_ops_release(c);
    server_pins_leave(w->server->pins, c->pin_account);
    server_disk_release(c->disk_frame);
    server_staging_close(&c->staging);
    /* The stranger's slot first: past it nobody else shuts this fd down. */
    if (c->slot == CONN_SLOT_STRANGER)
        server_strangers_give(w->server->strangers, &c->stranger);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        w->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    /* Gives back the slots the worker took for this connection at accept. */
    if (c->slot == CONN_SLOT_CLIENT)
        server_conn_slot_give(w->server, c->local, &c->peer);
    if (c->local)
        server_gpu_pins_leave(w->server->gpu_pins, c->pid);
    __atomic_fetch_sub(&w->server->buffered_bytes, c->body_cap, __ATOMIC_RELAXED);
    free(c->body);
    free(c->out);
    free(c->batch.entries);
    free(c);
}

int server_conn_slot_at_accept(const struct gdrkv_server *s, int local)
{
    return local || !s->token.len;
}

/* One of max_connections, counted apart for local and tcp clients so a tcp
 * flood can't lock the local engines out, and for tcp one of its peer's
 * max_connections_per_peer, so no one host takes them all. */
int server_conn_slot_take(struct server_worker *w, int local, const struct server_peer *peer)
{
    struct gdrkv_server *s = w->server;
    uint32_t *open = local ? &s->local_connections : &s->connections;

    if (__atomic_fetch_add(open, 1, __ATOMIC_RELAXED) >= s->opts.max_connections) {
        __atomic_fetch_sub(open, 1, __ATOMIC_RELAXED);
        gk_counter_add(&w->counters.connections_rejected, 1);
        GK_DEBUG("%s connection refused: max_connections %u reached", local ? "unix" : "tcp",
                 s->opts.max_connections);
        return -1;
    }
    if (!local && server_peers_take(s->peers, peer) < 0) {
        __atomic_fetch_sub(open, 1, __ATOMIC_RELAXED);
        gk_counter_add(&w->counters.connections_rejected, 1);
        gk_counter_add(&w->counters.connections_rejected_peer, 1);
        GK_DEBUG("connection refused: its peer has max_connections_per_peer open");
        return -1;
    }
    return 0;
}

int server_conn_authenticated(struct server_conn *c)
{
    if (c->slot != CONN_SLOT_STRANGER)
        return 0;
    server_strangers_give(c->worker->server->strangers, &c->stranger);
    c->slot = CONN_SLOT_NONE;
    if (server_conn_slot_take(c->worker, c->local, &c->peer) < 0)
        return -1;
    c->slot = CONN_SLOT_CLIENT;
    return 0;
}

void server_conn_slot_give(struct gdrkv_server *s, int local, const struct server_peer *peer)
{
    if (local) {
        __atomic_fetch_sub(&s->local_connections, 1, __ATOMIC_RELAXED);
    } else {
        __atomic_fetch_sub(&s->connections, 1, __ATOMIC_RELAXED);
        server_peers_give(s->peers, peer);
    }
}

int server_conn_between_frames(const struct server_conn *c)
{
    return c->state == CONN_READ_HDR && c->hdr_got == 0;
}

enum server_conn_overdue server_conn_overdue(const struct server_conn *c, uint64_t now_ns)
{
    const struct gdrkv_server *s = c->worker->server;
    uint64_t stall_ns = (uint64_t)s->opts.stall_timeout_ms * 1000000ull;
    int between_frames = server_conn_between_frames(c);

    if (c->state == CONN_WAIT_ROOM)     /* bounded by disk_full_wait_ms (wait_room) */
        return CONN_OVERDUE_NO;
    if (c->answer_deadline_ns && now_ns >= c->answer_deadline_ns)
        return CONN_OVERDUE_ANSWER;
    if (c->request_deadline_ns && now_ns >= c->request_deadline_ns)
        return CONN_OVERDUE_REQUEST;
    /* A stranger has auth_timeout_ms from accept to prove it holds the
     * token, however its bytes come. */
    if (c->auth != CONN_AUTH_DONE &&
        now_ns - c->accepted_ns >= (uint64_t)s->opts.auth_timeout_ms * 1000000ull)
        return CONN_OVERDUE_AUTH;
    if (!between_frames && c->state != CONN_WAIT_BUFFER && now_ns - c->last_progress_ns >= stall_ns)
        return CONN_OVERDUE_STALLED;
    if (between_frames && now_ns - c->opened_ns >= (uint64_t)s->opts.idle_timeout_ms * 1000000ull)
        return CONN_OVERDUE_IDLE;
    return CONN_OVERDUE_NO;
}

/* ------------------------------------------------------------ buffers */

/* One allocation holds the four arrays, ordered so each stays aligned. */
static int batch_reserve(struct server_batch *b, uint32_t n)
{
    if (n <= b->cap)
        return 0;
    size_t per_key = sizeof *b->entries + sizeof *b->objs + sizeof *b->sizes + sizeof *b->status;
    uint8_t *p = malloc((size_t)n * per_key);
    if (!p)
        return -1;
    free(b->entries);
    b->cap = n;
    b->entries = (struct gk_entry *)p;
    b->objs = (struct store_obj **)(b->entries + n);
    b->sizes = (uint64_t *)(b->objs + n);
    b->status = (int32_t *)(b->sizes + n);
    return 0;
}

static void shrink(uint8_t **buf, size_t *cap)
{
    if (*cap > CONN_KEEP_BYTES) {
        free(*buf);
        *buf = NULL;
        *cap = 0;
    }
}

/* ------------------------------------------------------------ frames */

/* Answers the current frame with an error status and a message, then goes
 * on reading (keep) or closes once it is written. Every rejected frame is
 * logged at debug level only, so a fuzzer can't flood the log. */
static enum step reject(struct server_conn *c, int code, int keep, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static enum step reject(struct server_conn *c, int code, int keep, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    len = GK_MIN(GK_MAX(len, 0), (int)sizeof msg - 1);

    gk_counter_add(&c->worker->counters.frames_bad, 1);
    GK_DEBUG("fd %d: frame rejected (%s): %s", c->fd, gdrkv_strerror(code), msg);
    if (server_reply_error(c, code, msg, (size_t)len))
        return STEP_CLOSE;
    c->close_after_write |= !keep;     /* a dropped reservation may have set it */
    c->request_deadline_ns = 0;        /* what is left of the request is not read */
    c->state = CONN_WRITE;
    return STEP_MORE;
}

static enum step execute(struct server_conn *c)
{
    /* Keys on disk only come back into the pool first, off this thread. */
    if (gk_op(c->req.opcode)->reads && server_disk_park(c)) {
        c->state = CONN_WAIT_DISK;
        c->request_deadline_ns = 0;     /* all of it is in; stall_timeout_ms bounds the wait */
        return STEP_WAIT;
    }
    int rc = server_ops_execute(c);
    if (rc == SERVER_OPS_WAIT_ROOM) {
        c->state = CONN_WAIT_ROOM;
        c->room_wait_ns = gk_now_ns();
        return STEP_WAIT;
    }
    /* The frame holds its own pins now, if it wanted them. */
    server_disk_release(c->disk_frame);
    c->disk_frame = NULL;
    if (rc < 0)
        return STEP_CLOSE;
    c->frame_executed = 1;
    c->state = gk_op(c->req.opcode)->payload_in ? CONN_READ_PAYLOAD : CONN_WRITE;
    if (c->state == CONN_WRITE)
        c->request_deadline_ns = 0;     /* all of it is in */
    return STEP_MORE;
}

/* A write waiting for room tries again (the store's room hook or the
 * tick): the time it waited does not count against the request's deadline
 * nor as a stall, since it is bounded by disk_full_wait_ms. */
static enum step wait_room(struct server_conn *c)
{
    uint64_t now = gk_now_ns();
    if (c->request_deadline_ns)
        c->request_deadline_ns += now - c->room_wait_ns;
    c->last_progress_ns = now;
    c->state = CONN_EXECUTE;
    return STEP_MORE;
}

static enum step on_header(struct server_conn *c)
{
    struct gk_hdr *h = &c->req;

    gk_hdr_decode(c->hdr_raw, h);
    c->frame_start_ns = gk_now_ns();
    /* Whatever the last frame left in the store ends here unless this frame
     * is the one that ends it (server_ops.h): only then may the batch
     * arrays, which hold those objects, survive into this frame. */
    char why[100];
    if (server_ops_frame_begin(c, why, sizeof why))
        return reject(c, GDRKV_E_PROTOCOL, 0, "%s", why);
    int rc = gk_check_request_hdr(h);
    if (rc == GDRKV_E_PROTOCOL && h->magic != GK_MAGIC) {
        /* Not our protocol at all: nothing we send would be understood. */
        gk_counter_add(&c->worker->counters.frames_bad, 1);
        GK_DEBUG("fd %d: bad magic 0x%08x, closing", c->fd, h->magic);
        return STEP_CLOSE;
    }
    /* Before the handshake nothing but AUTH is read, let alone answered. */
    if (c->auth != CONN_AUTH_DONE && h->opcode != GK_OP_AUTH) {
        gk_counter_add(&c->worker->counters.auth_denied, 1);
        return reject(c, GDRKV_E_DENIED, 0, "this server serves only clients that hold its "
                      "token: give the client token_file= (or GDRKV_TOKEN_FILE)");
    }
    /* The whole request (header, body, payload; read or skipped) must be
     * in by a deadline that grows with its size, however its bytes trickle. */
    if (rc != GDRKV_E_TOO_LARGE)
        c->request_deadline_ns = c->first_byte_ns +
                                 (uint64_t)c->worker->server->opts.stall_timeout_ms * 1000000ull +
                                 ((h->body_len + h->payload_len) >> 20) * CONN_REQUEST_NS_PER_MIB;
    if (rc == GDRKV_E_UNSUPPORTED || (rc == 0 && !server_ops_allowed(c, h->opcode))) {
        /* Lengths were checked before the opcode, so skipping is bounded. */
        c->skip_left = h->body_len + h->payload_len;
        c->state = CONN_SKIP;
        return STEP_MORE;
    }
    if (rc == GDRKV_E_TOO_LARGE)
        return reject(c, rc, 0, "frame over a protocol limit: count %u, body_len %u, "
                      "payload_len %llu",
                      h->count, h->body_len, (unsigned long long)h->payload_len);
    if (rc)
        return reject(c, rc, 0, "inconsistent %s header: count %u, body_len %u, payload_len %llu",
                      gk_op_name(h->opcode), h->count, h->body_len,
                      (unsigned long long)h->payload_len);

    /* The limits just checked bound the allocation. The batch arrays are
     * never empty, so even a zero-key request hands the store real arrays. */
    if (batch_reserve(&c->batch, GK_MAX(h->count, 1u)) < 0)
        return STEP_CLOSE;
    c->body_got = 0;
    c->state = CONN_WAIT_BUFFER;
    return STEP_MORE;
}

/* The body's buffer, within max_buffered_bytes over all connections: a
 * frame that would pass it waits here, unread (back-pressure), and the
 * worker's tick tries again; small bodies never wait. */
static enum step wait_buffer(struct server_conn *c)
{
    struct gdrkv_server *s = c->worker->server;
    uint32_t len = c->req.body_len;

    if (len > c->body_cap) {
        uint64_t more = len - c->body_cap;
        uint64_t total = __atomic_add_fetch(&s->buffered_bytes, more, __ATOMIC_RELAXED);
        if (len > CONN_SMALL_BODY && total > s->opts.max_buffered_bytes) {
            __atomic_fetch_sub(&s->buffered_bytes, more, __ATOMIC_RELAXED);
            if (!c->waited_for_buffer)
                gk_counter_add(&c->worker->counters.frames_waited_for_buffer, 1);
            c->waited_for_buffer = 1;
            return STEP_WAIT;
        }
        size_t before = c->body_cap;
        int rc = gk_buf_reserve(&c->body, &c->body_cap, len);
        /* Count what the buffer really is (0 after a failure). */
        __atomic_fetch_sub(&s->buffered_bytes, more - (c->body_cap - before), __ATOMIC_RELAXED);
        if (rc < 0)
            return STEP_CLOSE;
    }
    c->waited_for_buffer = 0;
    c->state = CONN_READ_BODY;
    return STEP_MORE;
}

static enum step on_body(struct server_conn *c)
{
    if (gk_op_is_keyed(c->req.opcode)) {
        int rc = gk_parse_request_body(&c->req, c->body, &c->ns, c->batch.entries);
        if (rc)
            return reject(c, rc, 0, "malformed %s body", gk_op_name(c->req.opcode));
        /* The answer's values stay pinned until they are sent. */
        if (gk_op(c->req.opcode)->payload_out) {
            uint64_t capacity = 0;
            for (uint32_t i = 0; i < c->req.count; i++)
                capacity += GK_MIN(c->batch.entries[i].size, GK_MAX_GET_CAPACITY + 1);
            if (capacity > GK_MAX_GET_CAPACITY)
                return reject(c, GDRKV_E_TOO_LARGE, 0, "GET of %llu destination bytes: at most "
                              "%llu per frame", (unsigned long long)capacity,
                              (unsigned long long)GK_MAX_GET_CAPACITY);
        }
        memset(c->batch.sizes, 0, c->req.count * sizeof *c->batch.sizes);
    }
    return execute(c);
}

/* The response is fully written: let go of the frame (a LEASE keeps its
 * pins, see server_ops_frame_done). */
static enum step on_written(struct server_conn *c)
{
    struct server_worker *w = c->worker;

    server_ops_frame_done(c);
    if (c->frame_executed)
        server_count_op(&w->counters, c->req.opcode, c->req.count,
                        (gk_now_ns() - c->frame_start_ns) / 1000);
    if (c->close_after_write)
        return STEP_CLOSE;
    size_t body_cap = c->body_cap;
    shrink(&c->body, &c->body_cap);
    __atomic_fetch_sub(&w->server->buffered_bytes, body_cap - c->body_cap, __ATOMIC_RELAXED);
    shrink(&c->out, &c->out_cap);
    c->opened_ns = gk_now_ns();
    c->answer_deadline_ns = 0;
    c->frame_executed = 0;
    c->payload = (struct server_payload){0};
    c->hdr_got = 0;
    c->state = CONN_READ_HDR;
    return STEP_MORE;
}

/* ------------------------------------------------------------ socket I/O */

/* Turns a recv/readv/sendmsg result into bytes moved (> 0), 0 when the
 * socket would block, or -1 when the peer is gone (EOF, reset, error). */
static ssize_t moved(struct server_conn *c, ssize_t n)
{
    if (n > 0) {
        c->last_progress_ns = gk_now_ns();
        return n;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    if (n < 0)
        GK_DEBUG("fd %d: %s", c->fd, strerror(errno));
    return -1;
}

static enum step step_of(ssize_t n)
{
    return n > 0 ? STEP_MORE : n == 0 ? STEP_WAIT : STEP_CLOSE;
}

static enum step read_header(struct server_conn *c)
{
    ssize_t n = moved(c, recv(c->fd, c->hdr_raw + c->hdr_got, GK_HDR_SIZE - c->hdr_got, 0));
    if (n <= 0)
        return step_of(n);
    if (c->hdr_got == 0) {
        c->first_byte_ns = c->last_progress_ns;
        c->request_deadline_ns = c->first_byte_ns +
                                 (uint64_t)c->worker->server->opts.stall_timeout_ms * 1000000ull;
    }
    c->hdr_got += (uint32_t)n;
    return c->hdr_got == GK_HDR_SIZE ? on_header(c) : STEP_MORE;
}

static enum step read_body(struct server_conn *c)
{
    if (c->body_got < c->req.body_len) {
        ssize_t n = moved(c, recv(c->fd, c->body + c->body_got, c->req.body_len - c->body_got, 0));
        if (n <= 0)
            return step_of(n);
        c->body_got += (uint32_t)n;
    }
    return c->body_got == c->req.body_len ? on_body(c) : STEP_MORE;
}

static enum step skip_frame(struct server_conn *c)
{
    if (c->skip_left > 0) {
        size_t want = (size_t)GK_MIN(c->skip_left, (uint64_t)SERVER_SCRATCH_SIZE);
        ssize_t n = moved(c, recv(c->fd, c->worker->scratch, want, 0));
        if (n <= 0)
            return step_of(n);
        c->skip_left -= (uint64_t)n;
    }
    if (c->skip_left > 0)
        return STEP_MORE;
    return reject(c, GDRKV_E_UNSUPPORTED, 1, "unsupported version %u or opcode %u",
                  c->req.version, c->req.opcode);
}

static enum step read_payload(struct server_conn *c)
{
    struct server_worker *w = c->worker;

    if (c->payload.left > 0) {
        struct iovec iov[IOV_MAX];
        int cnt = server_payload_iov(&c->payload, w->scratch, SERVER_SCRATCH_SIZE, iov, IOV_MAX);
        ssize_t n = moved(c, readv(c->fd, iov, cnt));
        if (n <= 0)
            return step_of(n);
        server_payload_advance(&c->payload, (uint64_t)n);
        gk_counter_add(&w->counters.bytes_in, (uint64_t)n);
    }
    if (c->payload.left > 0)
        return STEP_MORE;
    if (server_ops_finish_put(c) < 0)
        return STEP_CLOSE;
    c->request_deadline_ns = 0;
    c->state = CONN_WRITE;
    return STEP_MORE;
}

/* SCM_RIGHTS: the peer receives its own descriptors of the same files. */
static void attach_fds(struct msghdr *msg, char *buf, const int fds[2])
{
    int n = fds[1] >= 0 ? 2 : 1;
    msg->msg_control = buf;
    msg->msg_controllen = CMSG_SPACE(n * sizeof(int));
    struct cmsghdr *cm = CMSG_FIRSTHDR(msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(n * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, n * sizeof(int));
}

static enum step write_response(struct server_conn *c)
{
    struct iovec iov[IOV_MAX];
    int cnt = 0;
    size_t head_left = c->out_len - c->out_sent;

    if (head_left > 0)
        iov[cnt++] = (struct iovec){.iov_base = c->out + c->out_sent, .iov_len = head_left};
    cnt += server_payload_iov(&c->payload, NULL, 0, iov + cnt, IOV_MAX - cnt);
    if (cnt > 0) {
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(2 * sizeof(int))];
        } control;
        if (c->pass_fds[0] >= 0)
            attach_fds(&msg, control.buf, c->pass_fds);
        ssize_t n = moved(c, sendmsg(c->fd, &msg, MSG_NOSIGNAL));
        if (n <= 0)
            return step_of(n);
        if (c->pass_fds[0] >= 0) {
            /* They went with the first byte; our staging fd is not needed
             * past that (the mapping keeps the memory). */
            c->pass_fds[0] = c->pass_fds[1] = -1;
            if (c->staging.fd >= 0) {
                close(c->staging.fd);
                c->staging.fd = -1;
            }
        }
        size_t head = GK_MIN((size_t)n, head_left);
        c->out_sent += head;
        server_payload_advance(&c->payload, (uint64_t)n - head);
        gk_counter_add(&c->worker->counters.bytes_out, (uint64_t)n - head);
    }
    if (c->out_sent < c->out_len || c->payload.left > 0)
        return STEP_MORE;
    return on_written(c);
}

static enum step run_step(struct server_conn *c)
{
    switch (c->state) {
    case CONN_READ_HDR: return read_header(c);
    case CONN_WAIT_BUFFER: return wait_buffer(c);
    case CONN_READ_BODY: return read_body(c);
    case CONN_SKIP: return skip_frame(c);
    case CONN_READ_PAYLOAD: return read_payload(c);
    case CONN_WAIT_DISK: return STEP_WAIT;
    case CONN_WAIT_ROOM: return wait_room(c);
    case CONN_EXECUTE: return execute(c);
    case CONN_WRITE: return write_response(c);
    }
    return STEP_CLOSE;
}

static int listen_for(struct server_conn *c, uint32_t events)
{
    if (c->events == events)
        return 0;
    struct epoll_event ev = {.events = events, .data.ptr = c};
    if (epoll_ctl(c->worker->epoll_fd, EPOLL_CTL_MOD, c->fd, &ev) < 0)
        return -1;
    c->events = events;
    return 0;
}

void server_conn_resume_after_disk(struct server_conn *c, struct disk_frame *f)
{
    c->disk_frame = f;
    c->state = CONN_EXECUTE;
    c->last_progress_ns = gk_now_ns();
    server_conn_on_event(c);
}

void server_conn_on_event(struct server_conn *c)
{
    enum step s = STEP_MORE;

    for (int i = 0; i < CONN_STEPS_PER_EVENT && s == STEP_MORE; i++)
        s = run_step(c);
    uint32_t events = c->state == CONN_WRITE         ? EPOLLOUT
                      : c->state == CONN_WAIT_BUFFER ? 0     /* unread until there is room */
                      : c->state == CONN_WAIT_DISK   ? 0     /* nothing to read meanwhile */
                      : c->state == CONN_WAIT_ROOM   ? 0     /* the payload stays unread */
                                                     : EPOLLIN;
    if (s == STEP_CLOSE || listen_for(c, events) < 0) {
        server_conn_close(c);
        return;
    }
    /* Stopped by the bound, not by the socket: what was already read (a
     * whole request of a client that pipelines, say) would otherwise wait
     * for an event that never comes. */
    c->runnable = s == STEP_MORE;
    c->worker->runnable |= c->runnable;
}
