/*
 * client_conn.c - see client_conn.h.
 *
 * The response header and the body we expect are asked for in one recv,
 * never more, so the GET values that follow are left in the socket for
 * readv to put straight into the caller's segments. Every length and count
 * in a response is checked against the request before a value byte is
 * read; any mismatch fails the connection, which is then closed, so nothing
 * late can ever land in a buffer the caller got back.
 */
#include "client_conn.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "client_auth.h"
#include "client_frame.h"
#include "client_gpu.h"
#include "client_rdma.h"
#include "client_shm.h"
#include "common/common.h"
#include "gdrkv.h"
#include "common/log.h"

/* Why a server that answers DENIED is down for us. */
#define DENIED_WHY "it serves only clients holding its token (token_file=)"

/* Of an error response's message, what the debug log shows. */
#define CLIENT_CONN_LOG_MESSAGE 200

/* rdma: the QPs made and the RDMA_HELLO sent on the fresh tcp socket fd,
 * its answer read by the call's poll loop, so a server that never answers
 * holds up only its own keys. A fresh socket takes its ~200 bytes. Returns
 * fd (with *rdma set, or NULL where rdma is not to be had here and plain
 * frames may do), or a negative gdrkv_error with fd closed. */
static int send_rdma_hello(struct client_endpoint *ep, int fd, struct client_rdma_conn **rdma)
{
    uint8_t req[RDMA_HELLO_REQUEST_MAX];
    size_t len = 0;
    int rc = client_rdma_conn_new(ep->rdma, rdma, req, sizeof req, &len);
    if (rc == 0 && send(fd, req, len, MSG_NOSIGNAL) != (ssize_t)len) {
        client_rdma_conn_close(*rdma);
        *rdma = NULL;
        close(fd);
        return GDRKV_E_UNAVAILABLE;
    }
    if (rc && ep->rdma_only) {
        GK_DEBUG("%s: no rdma here (%s)", ep->name, gdrkv_strerror(rc));
        close(fd);
        return GDRKV_E_UNAVAILABLE;
    }
    return fd;
}

/* The socket: the endpoint's unix socket with its pool mapped, where it
 * has one that answers (authenticated first when there is a token);
 * else a tcp connect, started here and finished by the call's poll loop
 * (finish_connect), unless the endpoint is shm only. */
struct client_conn *client_conn_open(struct client_endpoint *ep, uint64_t deadline_ns, int *err)
{
    struct client_pool *pool = NULL;
    struct client_staging staging = {0};
    struct gk_connecting *tcp = NULL;
    int fd = GDRKV_E_UNAVAILABLE;

    if (ep->unix_path[0]) {
        fd = client_shm_connect(ep, deadline_ns, &pool, &staging);
        if (fd < 0 && !ep->shm_only)
            GK_DEBUG("%s: no shm on %s (%s), using tcp", ep->name, ep->unix_path,
                     gdrkv_strerror(fd));
    }
    /* A server that denied us over shm would deny us over tcp too. */
    if (fd < 0 && fd != GDRKV_E_DENIED && !ep->shm_only) {
        tcp = malloc(sizeof *tcp);
        fd = !tcp ? GDRKV_E_INTERNAL : gk_connect_start(&ep->addr, deadline_ns, tcp);
        fd = fd == 0 ? tcp->fd : fd;
    }
    struct client_conn *c = fd >= 0 ? calloc(1, sizeof *c) : NULL;
    if (!c) {
        if (tcp)
            gk_connect_abort(tcp);
        else if (fd >= 0)
            close(fd);
        free(tcp);
        client_staging_unmap(&staging);
        client_pool_put(pool);
        *err = fd < 0 ? fd : GDRKV_E_INTERNAL;
        return NULL;
    }
    c->fd = fd;
    c->ep = ep;
    c->pool = pool;
    c->staging = staging;
    c->connecting = tcp;
    c->connect_deadline_ns = deadline_ns;
    c->rdma_only = ep->rdma_only;
    /* Request 1 may have been HELLO or RDMA_HELLO. */
    c->next_req_id = 2;
    return c;
}

int client_conn_connecting(const struct client_conn *c)
{
    return c->connecting != NULL;
}

uint64_t client_conn_connect_deadline(const struct client_conn *c)
{
    return c->connecting ? c->connect_deadline_ns : 0;
}

/* The tcp connect, moved on by the call's poll loop, so a server that
 * swallows SYNs costs only its own keys. Once connected: the handshake
 * (with a token), RDMA_HELLO (with rdma), then the frame begins. */
static int finish_connect(struct client_conn *c)
{
    struct client_endpoint *ep = c->ep;
    int rc = gk_connect_step(c->connecting);
    c->fd = c->connecting->fd;
    if (rc == 0)
        return 0;
    if (rc < 0) {
        c->why = "connect failed";
        return rc;
    }
    free(c->connecting);
    c->connecting = NULL;
    if (ep->token && (rc = client_auth(c->fd, ep->token, ep->name, c->connect_deadline_ns))) {
        c->why = rc == GDRKV_E_DENIED ? "authentication failed (token_file)"
                                      : "the authentication did not finish";
        return rc;
    }
    if (ep->rdma) {
        c->fd = send_rdma_hello(ep, c->fd, &c->rdma);
        if (c->fd < 0) {
            c->why = "rdma set-up failed";
            return c->fd;
        }
        c->hello_pending = c->rdma != NULL;
    }
    client_conn_start(c, c->batch, c->frame);
    return 0;
}

void client_conn_close(struct client_conn *c)
{
    /* The QPs and the GPU copies first: no DMA may outlive the connection,
     * and a kernel still reading the pool must finish before the lease ends
     * (close) or the mapping goes (pool_put). */
    client_rdma_conn_close(c->rdma);
    gpu_conn_free(c->gpu);
    free(c->commit);
    if (c->fd >= 0)
        close(c->fd);
    free(c->connecting);
    client_staging_unmap(&c->staging);
    client_pool_put(c->pool);
    gk_copy_free(&c->copies);
    free(c->body_heap);
    free(c);
}

int client_conn_gpu_drain(struct client_conn *c)
{
    return gpu_conn_drain(c->gpu);
}

int client_conn_is_shm(const struct client_conn *c)
{
    return c->pool != NULL;
}

int client_conn_reusable(const struct client_conn *c)
{
    return !c->rdma_broken;
}

int client_conn_usable(const struct client_conn *c)
{
    uint8_t byte;
    if (c->rdma_broken)
        return 0;
    ssize_t n = recv(c->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* ------------------------------------------------------------ exchanges */

static int take_request_answer(struct client_conn *c);

/* A GPU call's socket frame: its GPU-sourced PUT values gathered into
 * staging before the request goes, its GPU-bound GET values received
 * into staging (client_gpu.h); the socket moves them by the connection's
 * table of the frame's segments. */
static int begin_gpu_socket(struct client_conn *c)
{
    return gpu_conn_start(&c->gpu, c->batch, c->frame, &c->seg_ptrs);
}

/* ...and once such a GET's values are all in staging, their copy starts
 * and runs while the next frame is received. */
static int received_gpu_socket(struct client_conn *c)
{
    int rc = gpu_conn_received(c->gpu, c->batch, c->frame);
    if (rc)
        c->why = "GPU copy failed";
    return rc;
}

/* tcp, and every frame shm or rdma don't take: values on the socket. */
static const struct client_exchange plain = {.answer = client_frame_take_plain};
static const struct client_exchange plain_gpu = {
    .begin = begin_gpu_socket, .answer = client_frame_take_plain,
    .received = received_gpu_socket,
};

/* The transport's exchange for the frame, or the plain one. (A shm
 * connection has no QPs: rdma rides on tcp connections only.) */
static const struct client_exchange *choose_exchange(const struct client_conn *c)
{
    const struct client_exchange *ex = c->pool ? client_shm_exchange(c)
                                       : c->rdma ? client_rdma_exchange(c)
                                                 : NULL;
    return ex ? ex : c->batch->gpu ? &plain_gpu : &plain;
}

/* Chooses the frame's exchange, puts its values in place, encodes its
 * request and starts sending it. */
static void begin_frame(struct client_conn *c)
{
    struct client_batch *b = c->batch;
    struct client_frame *f = c->frame;

    c->ex = choose_exchange(c);
    b->frames_unstarted--;
    uint8_t op = c->ex->request ? c->ex->request : b->opcode;
    client_frame_expect(c, op, c->next_req_id++, take_request_answer);
    c->phase = CLIENT_CONN_SEND;
    c->why = NULL;
    c->follow = FOLLOW_NONE;
    c->seg_ptrs = b->seg_ptrs;
    c->start_err = c->ex->begin ? c->ex->begin(c) : 0;
    client_frame_encode(b, f, op, c->req_id, c->follow ? GK_PUT_STAGED_FOLLOW : 0);
    client_iov_init(&c->io, f->buf, GK_HDR_SIZE + (size_t)f->body_len, b, c->seg_ptrs, f->first,
                    op == GK_OP_PUT ? f->count : 0, b->sizes);
}

static int take_hello(struct client_conn *c);

/* A PINS report's answer is in: the frame begins. */
static int take_pins(struct client_conn *c)
{
    if (c->resp.status == GDRKV_E_DENIED) {
        c->why = DENIED_WHY;
        return GDRKV_E_DENIED;
    }
    client_shm_pins_answered(c);
    begin_frame(c);
    return 0;
}

/* A shm connection's frame may go after a PINS report (client_shm.h). */
static void report_pins_or_begin(struct client_conn *c)
{
    if (!c->pool || !client_shm_pins_request(c, c->pins)) {
        begin_frame(c);
        return;
    }
    struct gk_hdr h;
    gk_hdr_decode(c->pins, &h);
    client_frame_expect(c, GK_OP_PINS, h.req_id, take_pins);
    c->phase = CLIENT_CONN_SEND;
    c->why = NULL;
    c->follow = FOLLOW_NONE;
    client_iov_init(&c->io, c->pins, sizeof c->pins, c->batch, NULL, 0, 0, NULL);
}

/* Whether the frame goes by RDMA is only known once RDMA_HELLO (request
 * 1, sent at open) is answered: its answer is read first, then the frame
 * begins. */
void client_conn_start(struct client_conn *c, struct client_batch *b, struct client_frame *f)
{
    c->batch = b;
    c->frame = f;
    if (c->connecting) {
        c->phase = CLIENT_CONN_CONNECTING;
        c->why = NULL;
        return;
    }
    if (!c->hello_pending) {
        report_pins_or_begin(c);
        return;
    }
    client_frame_expect(c, GK_OP_RDMA_HELLO, 1, take_hello);
    c->phase = CLIENT_CONN_RECV_HEAD;
    c->why = NULL;
}

short client_conn_events(const struct client_conn *c)
{
    return c->phase == CLIENT_CONN_SEND || c->phase == CLIENT_CONN_CONNECTING ? POLLOUT
           : c->phase == CLIENT_CONN_WAIT                              ? 0
                                                                           : POLLIN;
}

int client_conn_busy(const struct client_conn *c)
{
    return c->phase == CLIENT_CONN_WAIT;
}

/* ------------------------------------------------------------ failures */

/* A send or receive that moved nothing: 0 when the socket merely has to
 * wait, else the connection is gone. */
static int stalled_or_lost(struct client_conn *c, ssize_t n)
{
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    /* The caller's segment is not mapped: the frame is lost half-sent or
     * half-read, but the server did nothing wrong (client_run.c). */
    if (n < 0 && errno == EFAULT) {
        c->why = "a segment points at memory this process cannot access";
        return GDRKV_E_INVALID;
    }
    if (n == 0) {
        c->why = "connection closed by the server";
    } else {
        c->why = "connection reset";
        GK_DEBUG("fd %d: %s", c->fd, strerror(errno));
    }
    return GDRKV_E_UNAVAILABLE;
}

/* ------------------------------------------------------------ sending */

static int send_request(struct client_conn *c)
{
    while (client_iov_left(&c->io)) {
        int count;
        size_t want;
        struct msghdr msg = {0};
        msg.msg_iov = (struct iovec *)client_iov_window(&c->io, &count, &want);
        msg.msg_iovlen = (size_t)count;
        /* MSG_NOSIGNAL: a server gone mid-frame is an error code, never SIGPIPE. */
        ssize_t n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
        if (n <= 0)
            return stalled_or_lost(c, n);
        c->batch->bytes_sent += (uint64_t)n;
        client_iov_advance(&c->io, (size_t)n);
        if ((size_t)n < want)
            return 0;   /* socket buffer full: wait for POLLOUT */
    }
    if (c->follow == FOLLOW_TO_COPY)
        client_shm_stage_followed(c);
    c->phase = CLIENT_CONN_RECV_HEAD;
    if (c->unanswered) {
        c->unanswered = 0;
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------ receiving */

/* Results a success answer to the op on the wire carries. */
static uint32_t expected_count(const struct client_conn *c)
{
    return gk_op_result_count(c->wire_op, c->frame->count);
}

/* Checks the response header against the request, before the body is
 * trusted or any byte reaches the caller. */
static int take_header(struct client_conn *c)
{
    struct gk_hdr *h = &c->resp;
    uint8_t op = c->wire_op;

    gk_hdr_decode(c->frame->buf, h);
    c->resp_decoded = 1;
    if (h->magic != GK_MAGIC || h->version != GK_VERSION)
        return client_frame_broken(c, "not a gdrkv response");
    if (h->opcode != (op | GK_OP_RESPONSE) || h->req_id != c->req_id)
        return client_frame_broken(c, "answer to another request");
    if (h->body_len > GK_MAX_BODY || c->got > GK_HDR_SIZE + (size_t)h->body_len)
        return client_frame_broken(c, "body length out of bounds");
    if (h->status > 0)
        return client_frame_broken(c, "positive frame status");
    if (h->status < 0 && (h->count != 0 || h->payload_len != 0))
        return client_frame_broken(c, "error response with results");
    if (h->status == 0) {
        uint32_t count = expected_count(c);
        if (h->count != count)
            return client_frame_broken(c, "result count differs from the key count");
        /* Bodies that go on past the results: LEASE's and RESERVE's chunk
         * lists, RDMA_HELLO's endpoint, STATS text. */
        int more = gk_op(op)->body_after_results;
        if (more ? h->body_len < count * GK_RESULT_SIZE : h->body_len != count * GK_RESULT_SIZE)
            return client_frame_broken(c, "body length differs from the result count");
        if (!gk_op(op)->payload_out && h->payload_len != 0)
            return client_frame_broken(c, "payload on an op that has none");
    }
    /* STATS text, error messages and RDMA_HELLO's answer may outgrow the
     * frame buffer; the GK_MAX_BODY check above bounds this allocation.
     * A body kept for a WAIT step (take_body) goes now. */
    free(c->body_heap);
    c->body_heap = NULL;
    if (h->body_len > c->frame->buf_cap - GK_HDR_SIZE) {
        c->body_heap = malloc(h->body_len);
        if (!c->body_heap) {
            c->why = "out of memory";
            return GDRKV_E_INTERNAL;
        }
        memcpy(c->body_heap, c->body, c->got - GK_HDR_SIZE);
        c->body = c->body_heap;
    }
    return 0;
}

/* The frame's request answered: a refusal fails its keys; a success goes
 * to the exchange's handler. */
static int take_request_answer(struct client_conn *c)
{
    const struct gk_hdr *h = &c->resp;

    int followed = c->follow == FOLLOW_SENT;
    if (followed) {
        c->batch->follows_in_flight--;
        c->follow = FOLLOW_NONE;
    }
    if (h->status == 0)
        return c->ex->answer(c);
    if (followed && h->status == GDRKV_E_TIMEOUT && (h->flags & GK_PUT_STAGED_FOLLOW))
        return client_shm_send_again(c);
    GK_DEBUG("fd %d: server refused a %s frame (%s): %.*s", c->fd, gk_op_name(c->batch->opcode),
             gdrkv_strerror(h->status), (int)GK_MIN(h->body_len, CLIENT_CONN_LOG_MESSAGE),
             (const char *)c->body);
    /* Denied: the server wants a token we lack. That is the server's
     * health, not this frame's: it fails the connection and short-circuits
     * the server like any failure, with the reason in the log. */
    if (h->status == GDRKV_E_DENIED) {
        c->why = DENIED_WHY;
        return GDRKV_E_DENIED;
    }
    client_frame_fail(c->batch, c->frame, h->status);
    return 0;
}

/* ------------------------------------------------------------ waits */

/* The exchange's asynchronous step (a GPU launch, rdma READs or WRITEs),
 * polled: once it is over, the exchange says what follows (a LEASE's
 * RELEASE, a PUT_STAGED's request, a RESERVE's COMMIT). */
static int wait_step(struct client_conn *c)
{
    int rc = c->ex->poll(c);
    return rc == 1 ? c->ex->waited(c) : rc;
}

/* The RDMA_HELLO answer connects the QPs. When the server has no rdma (or
 * can't set it up) under transport auto, the connection goes on as a
 * plain tcp one; under transport rdma it fails. Then the frame begins. */
static int take_hello(struct client_conn *c)
{
    if (c->resp.status == GDRKV_E_DENIED) {
        c->why = DENIED_WHY;
        return GDRKV_E_DENIED;
    }
    int rc = client_rdma_conn_answer(c->rdma, c->resp.status, c->body, c->resp.body_len);
    c->hello_pending = 0;
    if (rc && c->rdma_only) {
        c->why = "the server has no rdma";
        return rc == GDRKV_E_UNSUPPORTED || rc == GDRKV_E_PROTOCOL ? GDRKV_E_UNAVAILABLE : rc;
    }
    if (rc) {
        /* The whole answer was read: the socket serves plain frames. */
        client_rdma_conn_close(c->rdma);
        c->rdma = NULL;
    }
    begin_frame(c);
    return 0;
}

/* ------------------------------------------------------------ the reader */

/* The answer's header and body, then its handler. */
static int take_body(struct client_conn *c)
{
    int rc = c->answer(c);
    /* The body is kept for a WAIT step, whose waited handler may read it
     * (an rdma RESERVE's results). */
    if (c->phase != CLIENT_CONN_WAIT) {
        free(c->body_heap);
        c->body_heap = NULL;
    }
    if (rc)
        return rc;
    if (c->phase == CLIENT_CONN_SEND || c->phase == CLIENT_CONN_WAIT)
        return 0;       /* a follow-up goes next (after RDMA_HELLO: the frame) */
    /* Only a GET has a payload, and client_frame_take_plain has set up its stream. */
    if (c->resp.status || c->resp.payload_len == 0)
        return 1;
    c->phase = CLIENT_CONN_RECV_PAYLOAD;
    return 0;
}

/* Header and body; the first recv asks for exactly the body a success
 * would have, a longer one (STATS, chunk lists, error text, RDMA_HELLO's
 * endpoint) is read once known. */
static int recv_head(struct client_conn *c)
{
    for (;;) {
        size_t body_len = c->resp_decoded ? c->resp.body_len
                                          : (size_t)expected_count(c) * GK_RESULT_SIZE;
        size_t want = GK_HDR_SIZE + body_len - c->got;
        uint8_t *dst = c->got < GK_HDR_SIZE ? c->frame->buf + c->got
                                            : c->body + (c->got - GK_HDR_SIZE);
        ssize_t n = recv(c->fd, dst, want, 0);
        if (n <= 0)
            return stalled_or_lost(c, n);
        /* RDMA_HELLO is the connection's set-up, not the call's traffic
         * (its request went out at open, uncounted too). */
        if (c->wire_op != GK_OP_RDMA_HELLO)
            c->batch->bytes_received += (uint64_t)n;
        c->got += (size_t)n;
        if (!c->resp_decoded && c->got >= GK_HDR_SIZE) {
            int rc = take_header(c);
            if (rc)
                return rc;
        }
        if (c->resp_decoded && c->got == GK_HDR_SIZE + (size_t)c->resp.body_len)
            return take_body(c);
        if ((size_t)n < want)
            return 0;
    }
}

static int recv_payload(struct client_conn *c)
{
    while (client_iov_left(&c->io)) {
        int count;
        size_t want;
        const struct iovec *iov = client_iov_window(&c->io, &count, &want);
        ssize_t n = readv(c->fd, iov, count);
        if (n <= 0)
            return stalled_or_lost(c, n);
        c->batch->bytes_received += (uint64_t)n;
        client_iov_advance(&c->io, (size_t)n);
        if ((size_t)n < want)
            return 0;
    }
    int rc = c->ex->received ? c->ex->received(c) : 0;
    return rc ? rc : 1;
}

static int run_phase(struct client_conn *c)
{
    switch (c->phase) {
    case CLIENT_CONN_CONNECTING: return finish_connect(c);
    case CLIENT_CONN_WAIT: return wait_step(c);
    case CLIENT_CONN_SEND: return send_request(c);
    case CLIENT_CONN_RECV_HEAD: return recv_head(c);
    case CLIENT_CONN_RECV_PAYLOAD: return recv_payload(c);
    }
    return GDRKV_E_INTERNAL;
}

int client_conn_progress(struct client_conn *c)
{
    /* A phase that finishes goes straight on to the next: GET values
     * usually arrive with the header, and a lease's RELEASE can go out at
     * once. A request just sent waits for poll: its answer can't be there. */
    for (;;) {
        /* Checked before every phase: a frame begun inside this loop (after
         * RDMA_HELLO) must not send staging its GPU gather failed to fill. */
        if (c->start_err) {
            c->why = "the values could not be staged (GPU or shm copy failed)";
            return c->start_err;
        }
        enum client_conn_phase before = c->phase;
        int rc = run_phase(c);
        if (rc != 0 || c->phase == before || c->phase == CLIENT_CONN_RECV_HEAD)
            return rc;
    }
}
