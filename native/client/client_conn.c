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
#include "client_rdma.h"
#include "client_shm.h"
#include "common/common.h"
#include "gdrkv.h"
#include "client_gpu.h"
#include "common/log.h"

/* Why a server that answers DENIED is down for us. */
#define DENIED_WHY "it serves only clients holding its token (token_file=)"

/* Of an error response's message, what the debug log shows. */
#define CLIENT_CONN_LOG_MESSAGE 200

/* A followed frame's copy raises the staged word at least this often: the
 * server's copy starts this far behind, and each raise moves the word's
 * cache line between the two cores. */
#define CLIENT_STAGED_PUBLISH_BYTES (32u << 10)

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

static void encode_request(const struct client_batch *b, const struct client_frame *f,
                           uint8_t opcode, uint64_t req_id, uint16_t flags)
{
    struct gk_hdr h = {
        .magic = GK_MAGIC,
        .version = GK_VERSION,
        .opcode = opcode,
        .flags = flags,
        .count = f->count,
        .body_len = f->body_len,
        .payload_len = opcode == GK_OP_PUT ? f->payload_len : 0,
        .req_id = req_id,
    };
    uint8_t *body = f->buf + GK_HDR_SIZE;

    gk_hdr_encode(&h, f->buf);
    if (gk_op_has_keys(b->opcode))
        gk_encode_request_body(body, b->ns, f->count, b->keys + f->key_off,
                               b->key_lens + f->first, b->sizes + f->first);
    else if (gk_op_is_keyed(b->opcode))     /* CLEAR: the namespace, no entries */
        gk_encode_request_body(body, b->ns, 0, NULL, NULL, NULL);
}

/* ------------------------------------------------------------ exchanges */

static int take_plain(struct client_conn *c);
static int copy_leased(struct client_conn *c);
static int read_leased(struct client_conn *c);
static int write_reserved(struct client_conn *c);
static int end_lease(struct client_conn *c);
static int take_commit(struct client_conn *c);
static int copy_reserved(struct client_conn *c);

/* How a frame travels, chosen once when it begins by the connection's
 * transport and the frame's segments: the request that carries it, the
 * handler of its success answer, and the follow-up request that handler
 * sends (send_followup) with the handler of the follow-up's answer. */
struct client_exchange {
    uint8_t request;        /* the request's op; 0: the batch's own */
    int (*answer)(struct client_conn *c);
    uint8_t followup;       /* 0: the answer ends the frame */
    int (*followup_answer)(struct client_conn *c);
    int staged;             /* GPU values pass through the connection's staging
                               (they go on the socket); else the NIC or the pool
                               copy moves them */
};

enum {
    EXCHANGE_PLAIN,
    EXCHANGE_SHM_LEASE,
    EXCHANGE_SHM_STAGED,
    EXCHANGE_SHM_RESERVE,
    EXCHANGE_RDMA_LEASE,
    EXCHANGE_RDMA_RESERVE
};

static const struct client_exchange exchanges[] = {
    /* tcp, and every frame shm or rdma don't take: values on the socket */
    [EXCHANGE_PLAIN] = {0, take_plain, 0, NULL, 1},
    /* shm GET: copied out of the mapped pool, then the lease confirmed */
    [EXCHANGE_SHM_LEASE] = {GK_OP_LEASE, copy_leased, GK_OP_RELEASE, end_lease, 0},
    /* shm PUT: copied into the connection's staging before the request
     * goes (stage_values), or after it with the server copying behind
     * (follows); the server copies them into the pool */
    [EXCHANGE_SHM_STAGED] = {GK_OP_PUT_STAGED, take_plain, 0, NULL, 0},
    /* shm PUT, single-tenant server: copied into the reserved chunks, then committed */
    [EXCHANGE_SHM_RESERVE] = {GK_OP_RESERVE, copy_reserved, GK_OP_COMMIT, take_commit, 0},
    /* rdma GET into registered memory: READ by the NIC, then confirmed */
    [EXCHANGE_RDMA_LEASE] = {GK_OP_LEASE, read_leased, GK_OP_RELEASE, end_lease, 0},
    /* rdma PUT from registered memory: WRITTEN into reserved chunks, then committed */
    [EXCHANGE_RDMA_RESERVE] = {GK_OP_RESERVE, write_reserved, GK_OP_COMMIT, take_commit, 0},
};

static const struct client_exchange *choose_exchange(const struct client_conn *c)
{
    uint8_t op = c->batch->opcode;

    if (c->pool && op == GK_OP_GET)
        return &exchanges[EXCHANGE_SHM_LEASE];
    if (c->pool && op == GK_OP_PUT && c->pool->writable)
        return &exchanges[EXCHANGE_SHM_RESERVE];
    if (c->pool && op == GK_OP_PUT && c->staging.base &&
        c->frame->payload_len <= c->staging.len)
        return &exchanges[EXCHANGE_SHM_STAGED];
    if (c->rdma && (op == GK_OP_GET || op == GK_OP_PUT) &&
        client_rdma_frame_ok(c->rdma, c->batch, c->frame))
        return &exchanges[op == GK_OP_GET ? EXCHANGE_RDMA_LEASE : EXCHANGE_RDMA_RESERVE];
    return &exchanges[EXCHANGE_PLAIN];
}

/* Readies the reader for the answer to request req_id, op on the wire,
 * which answer will take once its header and body are in. */
static void expect_answer(struct client_conn *c, uint8_t op, uint64_t req_id,
                          int (*answer)(struct client_conn *c))
{
    c->wire_op = op;
    c->req_id = req_id;
    c->answer = answer;
    c->resp_decoded = 0;
    c->got = 0;
    c->body = c->frame->buf + GK_HDR_SIZE;
}

static int take_request_answer(struct client_conn *c);
static int run_put_copies(struct client_conn *c, struct client_staging *staging,
                          struct gpu_list *gpu);

/* Where the frame's GPU pieces are planned: *gpu, or NULL when the call
 * has no GPU segment. GDRKV_E_INTERNAL when it can't be had. */
static int frame_gpu_list(struct client_conn *c, struct gpu_list **gpu)
{
    *gpu = c->batch->gpu ? gpu_conn_list(&c->gpu) : NULL;
    return c->batch->gpu && !*gpu ? GDRKV_E_INTERNAL : 0;
}

/* A PUT_STAGED frame's values, copied into the connection's staging: the
 * GPU ones by one launch, the host ones by the CPU meanwhile. 0 when they
 * are in place, 1 when the launch still runs (GPU_WAIT sends the frame
 * once it is done), or a negative error. */
static int stage_values(struct client_conn *c)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;
    struct gpu_list *gpu;

    int rc = frame_gpu_list(c, &gpu);
    if (rc == 0)
        rc = client_shm_plan_staged(&c->staging, b, f->first, f->count, &c->copies, gpu);
    if (rc == 0)
        rc = run_put_copies(c, &c->staging, gpu);
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
 * held the cores that workers with frames already staged needed (64 KiB
 * PUTs ran 2.5-3.5x slower in half the runs on a 2-core VM). The call's
 * last frame is followed in any case: the server's copy of the frames
 * before it overlaps this thread's copies of the next, but the last
 * frame's copy would be the call's tail. */
static int follows(const struct client_conn *c)
{
    return c->ex == &exchanges[EXCHANGE_SHM_STAGED] && c->staging.staged_word &&
           !c->batch->gpu && c->frame->payload_len < c->batch->copier->parallel_bytes &&
           (!c->batch->follows_in_flight || !c->batch->frames_unstarted);
}

/* A followed frame's values, copied once its request is sent. */
static void stage_followed(struct client_conn *c)
{
    gk_copy_run_published(&c->copies, c->staging.base, c->staging.staged_word,
                          CLIENT_STAGED_PUBLISH_BYTES);
    gk_copy_reset(&c->copies);
    c->batch->shm_bytes_staged += c->frame->payload_len;
    c->batch->follows_in_flight++;
    c->follow = FOLLOW_SENT;
}

/* The server stopped following the frame (the staged word stood still
 * while this thread was held up): its values are all in staging by now,
 * and the frame goes again, whole. */
static int send_again_whole(struct client_conn *c)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;

    b->shm_staged_sent_again++;
    expect_answer(c, GK_OP_PUT_STAGED, c->next_req_id++, take_request_answer);
    encode_request(b, f, GK_OP_PUT_STAGED, c->req_id, 0);
    c->phase = CLIENT_CONN_SEND;
    client_iov_init(&c->io, f->buf, GK_HDR_SIZE + (size_t)f->body_len, b, f->first, 0, b->sizes);
    return 0;
}

/* Chooses the frame's exchange, encodes its request and starts sending it. */
static void begin_frame(struct client_conn *c)
{
    struct client_batch *b = c->batch;
    struct client_frame *f = c->frame;

    c->ex = choose_exchange(c);
    b->frames_unstarted--;
    uint8_t op = c->ex->request ? c->ex->request : b->opcode;
    expect_answer(c, op, c->next_req_id++, take_request_answer);
    c->follow = follows(c) ? FOLLOW_TO_COPY : FOLLOW_NONE;
    encode_request(b, f, op, c->req_id, c->follow ? GK_PUT_STAGED_FOLLOW : 0);
    c->phase = CLIENT_CONN_SEND;
    c->why = NULL;
    /* GPU segments: PUT values gathered into staging, socket GET values
     * received into it (the iov below reads b->seg_ptrs, now redirected). */
    c->start_err = b->gpu && c->ex->staged ? gpu_conn_start(&c->gpu, b, f, 1) : 0;
    if (c->follow) {
        /* Read by the server only after it has the request. */
        gk_copy_publish(c->staging.staged_word, 0);
        c->start_err = client_shm_plan_staged(&c->staging, b, f->first, f->count, &c->copies, NULL);
    } else if (c->ex == &exchanges[EXCHANGE_SHM_STAGED]) {
        int rc = stage_values(c);
        c->start_err = GK_MIN(rc, 0);
        if (rc == 1)
            c->phase = CLIENT_CONN_GPU_WAIT;    /* the call's other connections go on */
    }
    client_iov_init(&c->io, f->buf, GK_HDR_SIZE + (size_t)f->body_len, b, f->first,
                    op == GK_OP_PUT ? f->count : 0, b->sizes);
}

/* Sends the exchange's follow-up (RELEASE, COMMIT) from buf: its header,
 * encoded here with flags, and body_len bytes already in place after it. */
static void send_followup(struct client_conn *c, uint8_t *buf, uint32_t count,
                          uint32_t body_len, uint16_t flags)
{
    struct gk_hdr h = {.magic = GK_MAGIC, .version = GK_VERSION, .opcode = c->ex->followup,
                       .flags = flags, .count = count, .body_len = body_len,
                       .req_id = c->next_req_id++};

    expect_answer(c, h.opcode, h.req_id, c->ex->followup_answer);
    gk_hdr_encode(&h, buf);
    c->phase = CLIENT_CONN_SEND;
    client_iov_init(&c->io, buf, GK_HDR_SIZE + (size_t)body_len, c->batch, 0, 0, NULL);
}

static int take_hello(struct client_conn *c);

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
        begin_frame(c);
        return;
    }
    expect_answer(c, GK_OP_RDMA_HELLO, 1, take_hello);
    c->phase = CLIENT_CONN_RECV_HEAD;
    c->why = NULL;
}

short client_conn_events(const struct client_conn *c)
{
    return c->phase == CLIENT_CONN_SEND || c->phase == CLIENT_CONN_CONNECTING ? POLLOUT
           : c->phase == CLIENT_CONN_GPU_WAIT                              ? 0
                                                                           : POLLIN;
}

int client_conn_busy(const struct client_conn *c)
{
    return c->phase == CLIENT_CONN_GPU_WAIT;
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

static int broken(struct client_conn *c, const char *why)
{
    c->why = why;
    GK_DEBUG("fd %d: bad %s response: %s", c->fd, gk_op_name(c->batch->opcode), why);
    return GDRKV_E_PROTOCOL;
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
        stage_followed(c);
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
        return broken(c, "not a gdrkv response");
    if (h->opcode != (op | GK_OP_RESPONSE) || h->req_id != c->req_id)
        return broken(c, "answer to another request");
    if (h->body_len > GK_MAX_BODY || c->got > GK_HDR_SIZE + (size_t)h->body_len)
        return broken(c, "body length out of bounds");
    if (h->status > 0)
        return broken(c, "positive frame status");
    if (h->status < 0 && (h->count != 0 || h->payload_len != 0))
        return broken(c, "error response with results");
    if (h->status == 0) {
        uint32_t count = expected_count(c);
        if (h->count != count)
            return broken(c, "result count differs from the key count");
        /* Bodies that go on past the results: LEASE's and RESERVE's chunk
         * lists, RDMA_HELLO's endpoint, STATS text. */
        int more = gk_op(op)->body_after_results;
        if (more ? h->body_len < count * GK_RESULT_SIZE : h->body_len != count * GK_RESULT_SIZE)
            return broken(c, "body length differs from the result count");
        if (!gk_op(op)->payload_out && h->payload_len != 0)
            return broken(c, "payload on an op that has none");
    }
    /* STATS text, error messages and RDMA_HELLO's answer may outgrow the
     * frame buffer; the GK_MAX_BODY check above bounds this allocation. */
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

/* A LEASE's or RESERVE's chunk lists: the body after the results. */
static const uint8_t *chunk_lists(const struct client_conn *c, size_t *len)
{
    size_t results_len = (size_t)c->frame->count * GK_RESULT_SIZE;
    *len = c->resp.body_len - results_len;
    return c->body + results_len;
}

/* The result of the frame's k-th key, from a success answer's body. */
static struct gk_result key_result(const struct client_conn *c, uint32_t k)
{
    struct gk_result r;
    gk_result_decode(c->body + (size_t)k * GK_RESULT_SIZE, &r);
    return r;
}

/* Writes the keys' results and gives *payload the GET bytes they announce,
 * each checked against its destination before any value is read. */
static int take_results(struct client_conn *c, uint64_t *payload)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;
    uint8_t op = b->opcode;

    *payload = 0;
    for (uint32_t k = 0; k < f->count; k++) {
        uint32_t p = f->first + k;
        struct gk_result r = key_result(c, k);
        if (r.status > 0)
            return broken(c, "positive key status");
        int64_t result = r.status;
        uint64_t carried = 0;
        if (r.status == 0) {
            if (r.size > GK_MAX_OBJECT)
                return broken(c, "object size over the limit");
            if (op == GK_OP_GET && r.size > b->sizes[p])
                return broken(c, "object larger than its destination");
            carried = op == GK_OP_GET ? r.size : 0;
            result = op == GK_OP_GET || op == GK_OP_EXISTS ? (int64_t)r.size : 0;
        }
        if (op == GK_OP_GET) {
            b->got[p] = carried;
            *payload += carried;
        }
        b->results[b->index[p]] = result;
    }
    return 0;
}

/* A plain frame answered: the keys' results (a GET's values follow in the
 * payload), CLEAR's count, STATS' text, or PING's nothing. */
static int take_plain(struct client_conn *c)
{
    struct client_batch *b = c->batch;
    struct client_frame *f = c->frame;
    const struct gk_hdr *h = &c->resp;

    if (gk_op_has_keys(b->opcode)) {
        uint64_t payload;
        int rc = take_results(c, &payload);
        if (rc)
            return rc;
        if (payload != h->payload_len)
            return broken(c, "payload length differs from the object sizes");
        if (payload)
            client_iov_init(&c->io, NULL, 0, b, f->first, f->count, b->got);
        return 0;
    }
    if (b->opcode == GK_OP_CLEAR) {
        struct gk_result r = key_result(c, 0);
        int rc = 0;
        if (r.status > 0 || r.size > INT64_MAX)
            rc = broken(c, "bad clear result");
        f->result = r.status < 0 ? r.status : (int64_t)r.size;
        return rc;
    }
    if (b->opcode == GK_OP_STATS) {
        size_t len = GK_MIN((size_t)h->body_len, b->text_cap - 1);
        memcpy(b->text, c->body, len);
        b->text[len] = '\0';
        f->result = (int64_t)len;
        return 0;
    }
    f->result = 0;
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
        return send_again_whole(c);
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

/* ------------------------------------------------------------ shm */

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
static void end_lease_copied(struct client_conn *c)
{
    if (lease_seen_held(c)) {
        c->batch->shm_leases_seen_held++;
        c->unanswered = 1;
        send_followup(c, c->release, 0, 0, GK_RELEASE_UNANSWERED);
    } else {
        send_followup(c, c->release, 0, 0, 0);
    }
}

/* The LEASE answered over shm: copies the objects out of the pool, then
 * releases. A lease with nothing to copy needs no confirmation; the
 * server drops it when the next frame comes. */
static int copy_leased(struct client_conn *c)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;
    uint64_t bytes;
    size_t len;

    int rc = take_results(c, &bytes);
    if (rc)
        return rc;
    const uint8_t *lists = chunk_lists(c, &len);
    struct gpu_list *gpu;
    rc = frame_gpu_list(c, &gpu);
    if (rc == 0)
        rc = client_shm_plan(c->pool, lists, len, b, f->first, f->count, &c->copies, gpu);
    if (rc == 0 && bytes > 0 && gpu && gpu->count) {
        /* One launch for the frame's GPU pieces, the CPU copying the host
         * ones meanwhile; the RELEASE goes once the kernel is done too
         * (GPU_WAIT), and the call's other connections go on meanwhile. */
        rc = gpu_conn_copy_leased(c->gpu, c->pool, b, &c->copies, b->copier);
        gk_copy_reset(&c->copies);
        if (rc) {
            c->why = "GPU copy failed";
            return rc;
        }
        c->leased_bytes = bytes;
        c->phase = CLIENT_CONN_GPU_WAIT;
        return 0;
    } else if (rc == 0 && bytes > 0) {
        gk_copy_run(b->copier, &c->copies);
    }
    gk_copy_reset(&c->copies);
    if (gpu)
        gpu_list_reset(gpu);
    if (rc == GDRKV_E_PROTOCOL)
        return broken(c, "bad chunk lists");
    if (rc) {
        c->why = "out of memory";
        return rc;
    }
    if (bytes > 0) {
        b->shm_bytes_copied += bytes;
        end_lease_copied(c);
    }
    return 0;
}

/* The frame's launch: when a LEASE's is done the bytes are the caller's,
 * and the lease can end; when a PUT's is done the values are in staging
 * (the frame goes) or in the reserved chunks (COMMIT goes). */
static int wait_gpu(struct client_conn *c)
{
    int rc = gpu_conn_copy_done(c->gpu);
    if (rc < 0) {
        c->why = "GPU copy failed";
        return rc;
    }
    if (rc == 0)
        return 0;
    if (c->ex == &exchanges[EXCHANGE_SHM_STAGED]) {
        c->phase = CLIENT_CONN_SEND;
    } else if (c->ex == &exchanges[EXCHANGE_SHM_RESERVE]) {
        send_followup(c, c->commit, c->frame->count, c->frame->count, 0);
    } else {
        c->batch->shm_bytes_copied += c->leased_bytes;
        end_lease_copied(c);
    }
    return 0;
}

/* RELEASE answered: status 0 vouches for the bytes copied (or READ) under
 * the lease; otherwise the lease was lost (the timeout dropped it) and the
 * bytes may be another object's, so every key of the frame fails. */
static int end_lease(struct client_conn *c)
{
    int32_t status = c->resp.status;
    if (status) {
        GK_DEBUG("fd %d: lease lost (%s): failing %u keys", c->fd, gdrkv_strerror(status),
                 c->frame->count);
        client_frame_fail(c->batch, c->frame, status);
        c->batch->shm_leases_expired++;
    }
    return 1;
}

/* A RESERVE answered: flags (the COMMIT request's body, one byte per key
 * of the frame) set for the keys reserved, whose values go now into the
 * chunks *lists (len bytes) describe; the others get their result
 * (stored already: 0, or an error). */
static int take_reservations(struct client_conn *c, uint8_t **flags_out, const uint8_t **lists,
                             size_t *len)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;
    size_t need = GK_HDR_SIZE + (size_t)f->count;

    if (need > c->commit_cap) {
        uint8_t *p = realloc(c->commit, need);
        if (!p) {
            c->why = "out of memory";
            return GDRKV_E_INTERNAL;
        }
        c->commit = p;
        c->commit_cap = need;
    }
    uint8_t *flags = c->commit + GK_HDR_SIZE;
    for (uint32_t k = 0; k < f->count; k++) {
        uint32_t p = f->first + k;
        struct gk_result r = key_result(c, k);
        if (r.status > GK_RESERVE_PRESENT)
            return broken(c, "positive key status");
        if (r.status == 0 && r.size != b->sizes[p])
            return broken(c, "reserved size differs from the value's");
        flags[k] = r.status == 0;
        b->results[b->index[p]] = r.status < 0 ? r.status : 0;
    }
    *flags_out = flags;
    *lists = chunk_lists(c, len);
    return 0;
}

/* A PUT frame's copies, planned into c->copies (host sources) and gpu:
 * into staging, or a single-tenant pool's reservations (staging NULL).
 * 0 when done, 1 when the GPU's part still runs, or a negative error. */
static int run_put_copies(struct client_conn *c, struct client_staging *staging,
                          struct gpu_list *gpu)
{
    struct client_batch *b = c->batch;
    int rc = 0;
    if (gpu)
        rc = gpu_conn_copy_put(c->gpu, staging, c->pool, b, &c->copies, b->copier);
    else if (c->copies.count)
        gk_copy_run(b->copier, &c->copies);
    gk_copy_reset(&c->copies);
    return rc;
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

    int rc = take_reservations(c, &flags, &lists, &len);
    if (rc)
        return rc;
    rc = frame_gpu_list(c, &gpu);
    if (rc == 0)
        rc = client_shm_plan_reserved(c->pool, lists, len, b, f->first, f->count, flags,
                                      &c->copies, gpu);
    if (rc == GDRKV_E_PROTOCOL)
        return broken(c, "bad chunk lists");
    if (rc == 0)
        rc = run_put_copies(c, NULL, gpu);
    if (rc < 0) {
        gk_copy_reset(&c->copies);
        c->why = "the values could not be copied into the pool";
        return rc;
    }
    for (uint32_t k = 0; k < f->count; k++)
        b->shm_bytes_staged += flags[k] ? b->sizes[f->first + k] : 0;
    if (rc == 1)
        c->phase = CLIENT_CONN_GPU_WAIT;    /* COMMIT goes once the launch is done */
    else
        send_followup(c, c->commit, f->count, f->count, 0);
    return 0;
}

/* ------------------------------------------------------------ rdma */

/* What an rdma run's outcome means for the frame: a broken QP has failed
 * its own keys and the others are good, so the frame goes on and the
 * connection closes after it; a timeout or bad lists end it now. */
static int rdma_outcome(struct client_conn *c, int rc)
{
    if (rc == GDRKV_E_UNAVAILABLE) {
        c->rdma_broken = 1;
        return 0;
    }
    if (rc == GDRKV_E_PROTOCOL)
        return broken(c, "bad chunk lists");
    if (rc)
        c->why = rc == GDRKV_E_TIMEOUT ? "rdma completions did not come in time" : "rdma failed";
    return rc;
}

/* The LEASE answered over rdma: READs the objects into the caller's
 * segments, then releases (nothing to READ, nothing to confirm). */
static int read_leased(struct client_conn *c)
{
    uint64_t bytes;
    size_t len;

    int rc = take_results(c, &bytes);
    if (rc || bytes == 0)
        return rc;
    const uint8_t *lists = chunk_lists(c, &len);
    rc = rdma_outcome(c, client_rdma_read(c->rdma, lists, len, c->batch, c->frame));
    if (rc == 0)
        send_followup(c, c->release, 0, 0, 0);
    return rc;
}

/* The RESERVE answered over rdma: WRITEs the values of the reserved keys,
 * then COMMITs those whose bytes all arrived. */
static int write_reserved(struct client_conn *c)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;
    const uint8_t *lists;
    uint8_t *flags;
    size_t len;

    int rc = take_reservations(c, &flags, &lists, &len);
    if (rc)
        return rc;
    rc = rdma_outcome(c, client_rdma_write(c->rdma, lists, len, b, f, flags));
    if (rc)
        return rc;
    /* Reserved keys COMMIT drops make the server stop this connection's
     * QPs (it can't know no WRITE is still coming): don't reuse it. */
    for (uint32_t k = 0; k < f->count; k++) {
        struct gk_result r = key_result(c, k);
        if (r.status == 0 && !flags[k])
            c->rdma_broken = 1;
    }
    send_followup(c, c->commit, f->count, f->count, 0);
    return 0;
}

/* COMMIT answered: the server's word on the keys committed; the others
 * keep what RESERVE or the WRITEs gave them. */
static int take_commit(struct client_conn *c)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;
    const uint8_t *flags = c->commit + GK_HDR_SIZE;
    int32_t status = c->resp.status;

    if (status) {
        /* The reservations expired (or the server lost them): what was to
         * be committed is not stored, and the QPs are gone with them. */
        for (uint32_t k = 0; k < f->count; k++)
            if (flags[k])
                b->results[b->index[f->first + k]] = status;
        c->rdma_broken = 1;
        return 1;
    }
    for (uint32_t k = 0; k < f->count; k++) {
        if (!flags[k])
            continue;
        struct gk_result r = key_result(c, k);
        if (r.status > 0)
            return broken(c, "positive key status");
        b->results[b->index[f->first + k]] = r.status;
    }
    return 1;
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
    free(c->body_heap);
    c->body_heap = NULL;
    if (rc)
        return rc;
    if (c->phase == CLIENT_CONN_SEND || c->phase == CLIENT_CONN_GPU_WAIT)
        return 0;       /* a follow-up goes next (after RDMA_HELLO: the frame) */
    /* Only a GET has a payload, and take_plain has set up its stream. */
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
    /* GPU-bound values are in staging: their copy starts now and runs
     * while the next frame is received. */
    if (c->batch->gpu) {
        int rc = gpu_conn_received(c->gpu, c->batch, c->frame);
        if (rc) {
            c->why = "GPU copy failed";
            return rc;
        }
    }
    return 1;
}

static int run_phase(struct client_conn *c)
{
    switch (c->phase) {
    case CLIENT_CONN_CONNECTING: return finish_connect(c);
    case CLIENT_CONN_GPU_WAIT: return wait_gpu(c);
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
