/*
 * server_ops.c - see server_ops.h. Each keyed op is one store batch call;
 * the store takes its lock once per call, never once per key.
 */
#include "server_ops.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "common/log.h"
#include "server_conn.h"
#include "server_rdma.h"
#include "server_reply.h"
#include "server_state.h"
#include "server_stats.h"
#include "store/store.h"

static struct store *store_of(struct server_conn *c)
{
    return c->worker->server->store;
}

static int op_ping(struct server_conn *c)
{
    return server_reply_status(c, 0);
}

static int op_stats(struct server_conn *c)
{
    char text[SERVER_STATS_MAX];
    struct gk_text t;

    gk_text_init(&t, text, sizeof text);
    server_stats_text(c->worker->server, &t);
    int len = gk_text_finish(&t);
    return server_reply_text(c, text, (size_t)len);
}

static int op_exists(struct server_conn *c)
{
    struct server_batch *b = &c->batch;
    store_exists_batch(store_of(c), &c->ns, b->entries, c->req.count, b->status, b->sizes);
    return server_reply_results(c, c->req.count, b->status, b->sizes, 0);
}

/* Lets go of key i's pin, answering it status (with its size). */
static void unpin_key(struct server_conn *c, uint32_t i, int32_t status)
{
    struct server_batch *b = &c->batch;
    store_unpin_batch(store_of(c), &b->objs[i], 1);
    b->objs[i] = NULL;
    b->status[i] = status;
}

/* Charges the pins to the connection's peer, whose reads may hold at most
 * peer_pin_share of the pool (server_pins.h): the keys past it are let go
 * and answered BUSY. Returns the bytes of the keys that stay pinned (a key
 * repeated counts each time: its bytes are sent, or leased, each time). */
static uint64_t charge_peer(struct server_conn *c)
{
    struct gdrkv_server *srv = c->worker->server;
    struct server_batch *b = &c->batch;
    uint8_t fits[GK_MAX_KEYS];

    if (!c->pin_account) {
        struct server_pin_peer peer;
        server_pin_peer_of(c->fd, c->local, &c->peer, &peer);
        c->pin_account = server_pins_join(srv->pins, &peer);
    }
    uint64_t charged = c->pin_account
                           ? server_pins_charge(srv->pins, c->pin_account, b->sizes,
                                                (const void *const *)b->objs, c->req.count, fits)
                           : 0;
    c->pins_charged = charged;
    uint64_t kept = 0, refused = 0;
    for (uint32_t i = 0; i < c->req.count; i++) {
        if (!b->objs[i])
            continue;
        if (c->pin_account && fits[i]) {
            kept += b->sizes[i];
        } else {
            unpin_key(c, i, c->pin_account ? GDRKV_E_BUSY : GDRKV_E_INTERNAL);
            refused++;
        }
    }
    if (refused)
        gk_counter_add(&c->worker->counters.pin_cap_refused_keys, refused);
    return kept;
}

/* Pins the request's objects for reading (GET and LEASE); an object larger
 * than the client's destination is answered with its size only, and let go
 * at once, as are the objects past the peer's cap. Returns the bytes of the
 * objects that stay pinned. */
static uint64_t pin_for_read(struct server_conn *c)
{
    struct store *s = store_of(c);
    struct server_batch *b = &c->batch;

    store_pin_batch(s, &c->ns, b->entries, c->req.count, 1, b->objs, b->status, b->sizes);
    c->holds = CONN_HOLDS_PINS;
    for (uint32_t i = 0; i < c->req.count; i++)
        if (b->objs[i] && b->sizes[i] > b->entries[i].size)
            unpin_key(c, i, GDRKV_E_TOO_SMALL);
    return charge_peer(c);
}

/* The objects stay pinned until their bytes are written. */
static int op_get(struct server_conn *c)
{
    struct server_batch *b = &c->batch;
    uint32_t n = c->req.count;
    uint64_t payload_len = pin_for_read(c);

    server_payload_start(&c->payload, store_base(store_of(c)), b->entries, b->objs, n, 0,
                         payload_len);
    /* Pins last as long as a lease would (a little longer per MiB, since
     * the bytes go through a socket): a reader that stalls loses its
     * connection instead of keeping writers out of the pool. */
    if (payload_len)
        c->answer_deadline_ns = gk_now_ns() +
                                (uint64_t)c->worker->server->opts.lease_timeout_ms * 1000000ull +
                                (payload_len >> 20) * CONN_ANSWER_NS_PER_MIB;
    return server_reply_results(c, n, b->status, b->sizes, payload_len);
}

/* ------------------------------------------------------------ shm */

/* Tells a local client which memfd holds the pool (its size as the one
 * result), and gives the connection its staging memfd; both fds go with
 * the response. Without staging (none configured, or no memfd to be had)
 * the client's PUTs go on the socket. */
static int op_hello(struct server_conn *c)
{
    struct gdrkv_server *srv = c->worker->server;
    struct store *s = store_of(c);

    if (srv->opts.shm_staging_bytes && !c->staging.base &&
        server_staging_open(&c->staging, srv->opts.shm_staging_bytes) != 0)
        GK_WARN("fd %d: no staging memfd (%s): this client's PUTs go on the socket", c->fd,
                strerror(errno));
    uint16_t staging_words = GK_HELLO_LEASE_WORD | GK_HELLO_STAGED_WORD;
    uint16_t flags = (srv->opts.single_tenant ? GK_HELLO_WRITABLE : 0) |
                     (c->staging.base ? staging_words : 0);
    return server_reply_hello(c, store_capacity(s), flags, store_pool_fd(s), c->staging.fd);
}

/* Answers LEASE and RESERVE: the results, then the chunk list of every
 * object held (pinned or reserved). Lists over the body limit let
 * everything go and refuse the frame. */
static int respond_chunk_lists(struct server_conn *c)
{
    struct server_batch *b = &c->batch;
    int rc = server_reply_chunk_lists(c, c->req.count, b->status, b->sizes, b->objs);

    if (rc != GDRKV_E_TOO_LARGE)
        return rc;
    server_ops_release(c);
    static const char msg[] = "the objects' chunk lists exceed the body limit";
    return server_reply_error(c, GDRKV_E_TOO_LARGE, msg, sizeof msg - 1);
}

/* A GET answered with where the objects are instead of their bytes: the
 * client copies (shm) or READs (rdma) them out of the pool while they stay
 * pinned (server_ops_frame_done turns the pins into the connection's
 * lease). */
static int op_lease(struct server_conn *c)
{
    uint64_t bytes = pin_for_read(c);
    int rc = respond_chunk_lists(c);
    c->lease.bytes = bytes;
    if (rc == 0 && c->holds == CONN_HOLDS_PINS) {
        /* The word tells a client whose copy is done: a lease of no bytes
         * has no copy (nor a RELEASE; the next frame ends it). */
        if (bytes > 0)
            server_staging_lease(&c->staging, GK_LEASE_HELD);
        struct server_counters *k = &c->worker->counters;
        gk_counter_add(c->local ? &k->shm_leases : &k->rdma_leases, 1);
        gk_counter_add(c->local ? &k->shm_lease_bytes : &k->rdma_lease_bytes, bytes);
    }
    return rc;
}

/* Ends the lease. Status 0 promises the objects stayed pinned from the
 * LEASE answer until now, so what the client copied was theirs; a client
 * that saw as much in the lease word asks for no answer. */
static int op_release(struct server_conn *c)
{
    int32_t status = c->holds == CONN_HOLDS_LEASE ? 0
                     : c->hold_expired ? GDRKV_E_TIMEOUT : GDRKV_E_INVALID;
    server_ops_release(c);
    c->hold_expired = 0;
    if (c->req.flags & GK_RELEASE_UNANSWERED) {
        server_reply_none(c);
        return 0;
    }
    return server_reply_status(c, status);
}

/* ------------------------------------------------------------ put */

/* Reserves the frame's first n keys into the batch: SERVER_OPS_WAIT_ROOM
 * when the frame must wait for room first (server_ops.h), else 0. After
 * disk_full_wait_ms of waiting, the keys without room get NO_SPACE. */
static int reserve(struct server_conn *c, uint32_t n)
{
    struct store *s = store_of(c);
    struct server_batch *b = &c->batch;
    uint64_t now = gk_now_ns();
    int first = !c->room_deadline_ns;

    if (first)
        c->room_deadline_ns = now + c->worker->server->opts.disk_full_wait_ms * 1000000ull;
    if (now < c->room_deadline_ns) {
        if (store_reserve_batch_or_wait(s, &c->ns, b->entries, n, b->objs, b->status)) {
            if (first)
                gk_counter_add(&c->worker->counters.frames_waited_for_room, 1);
            return SERVER_OPS_WAIT_ROOM;
        }
    } else {
        store_reserve_batch(s, &c->ns, b->entries, n, b->objs, b->status);
    }
    c->room_deadline_ns = 0;
    return 0;
}

/* Reserves room for the values; the connection then reads the payload
 * straight into it (server_ops_finish_put answers once it is all there). */
static int op_put(struct server_conn *c)
{
    struct store *s = store_of(c);
    struct server_batch *b = &c->batch;

    if (reserve(c, c->req.count))
        return SERVER_OPS_WAIT_ROOM;
    c->holds = CONN_HOLDS_RESERVATIONS;
    server_payload_start(&c->payload, store_base(s), b->entries, b->objs, c->req.count, 1,
                         c->req.payload_len);
    return 0;
}

int server_ops_finish_put(struct server_conn *c)
{
    struct server_batch *b = &c->batch;
    uint32_t n = c->req.count;

    store_commit_batch(store_of(c), b->objs, n);
    c->holds = CONN_HOLDS_NOTHING;
    /* Put-if-absent: a key someone else already stored is a success. */
    for (uint32_t i = 0; i < n; i++)
        if (b->status[i] == STORE_PRESENT)
            b->status[i] = 0;
    return server_reply_results(c, n, b->status, NULL, 0);
}

/* Following a client's copy into staging (PUT_STAGED_FOLLOW). The client
 * copies at memory speed and raises the staged word every few tens of KiB,
 * so a word that stops rising means a client descheduled, or gone. The
 * worker spins while the word rose lately, then yields its core at each
 * look (the client may be waiting for that very core), and stops once the
 * word has not risen for FOLLOW_STALL_NS, or once the frame took longer
 * than a copy at FOLLOW_MIN_BYTES_PER_S would (a word raised a byte at a
 * time). The client then sends the frame again when its copy is done, and
 * the worker's other connections wait no longer than that. */
#define FOLLOW_SPIN_NS 50000ull
#define FOLLOW_STALL_NS 2000000ull
#define FOLLOW_MIN_BYTES_PER_S 1000000000ull
#define FOLLOW_CLOCK_EVERY 64       /* spins between two looks at the clock */

struct follow {
    uint64_t deadline_ns;
    uint64_t high;          /* the word's highest value yet */
    uint64_t rose_ns;       /* when it got there */
    uint32_t spins;
    int yielding;
};

static int follow_wait(void *arg, uint64_t have, uint64_t need)
{
    struct follow *f = arg;
    (void)need;
    if (have > f->high) {
        f->high = have;
        f->rose_ns = gk_now_ns();
        f->spins = 0;
        f->yielding = 0;
    } else if (!f->yielding && ++f->spins % FOLLOW_CLOCK_EVERY) {
        gk_cpu_relax();
        return 0;
    }
    uint64_t now = gk_now_ns();
    if (now - f->rose_ns > FOLLOW_STALL_NS || now > f->deadline_ns)
        return 1;
    f->yielding = now - f->rose_ns > FOLLOW_SPIN_NS;
    if (f->yielding)
        sched_yield();
    return 0;
}

/* Copies the planned values into the pool: behind the client's own copy
 * when it asked to be followed, else all at once (a large frame shared
 * with the helpers: one core's memory bandwidth is below what a GPU or
 * several clients put in staging). 0, or 1 when the client's copy stalled. */
static int copy_staged(struct server_conn *c, const struct gk_copy_list *copies)
{
    if (!(c->req.flags & GK_PUT_STAGED_FOLLOW)) {
        gk_copy_run(&c->worker->server->copier, copies);
        return 0;
    }
    uint64_t now = gk_now_ns();
    struct follow f = {.rose_ns = now,
                       .deadline_ns = now + FOLLOW_STALL_NS +
                                      copies->bytes * 1000000000ull / FOLLOW_MIN_BYTES_PER_S};
    gk_counter_add(&c->worker->counters.shm_staged_followed, 1);
    if (gk_copy_follow(copies, c->staging.base, c->staging.staged_word, follow_wait, &f) == 0)
        return 0;
    gk_counter_add(&c->worker->counters.shm_staged_follow_stalls, 1);
    return 1;
}

/* PUT_STAGED: the values are in the connection's staging memfd, laid out
 * as a PUT payload; each reserved object's bytes are copied from there
 * into its chunks, then committed. Values of keys already stored or
 * refused are skipped, as a PUT's payload would be. */
static int op_put_staged(struct server_conn *c)
{
    struct store *s = store_of(c);
    struct server_batch *b = &c->batch;
    uint32_t n = c->req.count;
    uint64_t total = 0, copied = 0;

    for (uint32_t i = 0; i < n; i++)
        total += b->entries[i].size;
    if (!c->staging.base || total > c->staging.len) {
        static const char none[] = "this connection has no staging memfd (HELLO first)";
        static const char big[] = "the values exceed the connection's staging memfd";
        return c->staging.base ? server_reply_error(c, GDRKV_E_TOO_LARGE, big, sizeof big - 1)
                               : server_reply_error(c, GDRKV_E_INVALID, none, sizeof none - 1);
    }
    if (reserve(c, n))
        return SERVER_OPS_WAIT_ROOM;
    c->holds = CONN_HOLDS_RESERVATIONS;
    uint8_t *base = store_base(s);
    const uint8_t *from = c->staging.base;
    struct gk_copy_list *copies = &c->worker->copies;
    int rc = 0;
    copies->streamed = 1;
    copies->demote_sources = 1;
    for (uint32_t i = 0; i < n && !rc; from += b->entries[i].size, i++) {
        uint32_t nchunks;
        if (!b->objs[i])
            continue;
        const struct store_chunk *ch = store_obj_chunks(b->objs[i], &nchunks);
        uint64_t off = 0;
        for (uint32_t k = 0; k < nchunks && !rc; off += ch[k].len, k++)
            rc = gk_copy_add(copies, base + ch[k].off, from + off, ch[k].len);
        copied += off;
    }
    int stalled = rc == 0 && copy_staged(c, copies);
    gk_copy_reset(copies);
    /* The reservations are aborted when the frame ends. */
    if (rc) {
        static const char oom[] = "out of memory planning the staged copies";
        return server_reply_error(c, GDRKV_E_INTERNAL, oom, sizeof oom - 1);
    }
    if (stalled) {
        static const char slow[] = "the staged word stood still: send the frame again";
        rc = server_reply_error(c, GDRKV_E_TIMEOUT, slow, sizeof slow - 1);
        if (rc == 0)
            server_reply_flags(c, GK_PUT_STAGED_FOLLOW);
        return rc;
    }
    struct server_counters *k = &c->worker->counters;
    gk_counter_add(&k->shm_staged_puts, 1);
    gk_counter_add(&k->shm_staged_bytes, copied);
    return server_ops_finish_put(c);
}

/* ------------------------------------------------------------ rdma put */

/* A PUT whose values the client will RDMA-WRITE into the reserved chunks
 * before COMMIT; the sizes answered are the value sizes. */
static int op_reserve(struct server_conn *c)
{
    struct server_batch *b = &c->batch;
    uint64_t bytes = 0;

    if (reserve(c, c->req.count))
        return SERVER_OPS_WAIT_ROOM;
    c->holds = CONN_HOLDS_RESERVATIONS;
    for (uint32_t i = 0; i < c->req.count; i++) {
        /* The value's size for every key not refused, stored ones (1) too. */
        b->sizes[i] = b->status[i] >= 0 ? b->entries[i].size : 0;
        bytes += b->objs[i] ? b->sizes[i] : 0;
    }
    int rc = respond_chunk_lists(c);
    c->reserved.bytes = bytes;
    if (rc == 0 && c->holds == CONN_HOLDS_RESERVATIONS) {
        struct server_counters *k = &c->worker->counters;
        gk_counter_add(c->rdma ? &k->rdma_reserved_bytes : &k->shm_reserved_bytes, bytes);
    }
    return rc;
}

/* Publishes the reserved objects the client says it wrote, drops the
 * others. The client has seen every WRITE complete before sending it. */
static int op_commit(struct server_conn *c)
{
    struct store *s = store_of(c);
    struct server_batch *b = &c->batch;
    uint32_t n = c->req.count;

    if (c->holds != CONN_HOLDS_COMMIT) {
        /* Expired: the QPs are dead too, so this connection is done. */
        c->close_after_write = 1;
        int32_t status = c->hold_expired ? GDRKV_E_TIMEOUT : GDRKV_E_INVALID;
        c->hold_expired = 0;
        return server_reply_status(c, status);
    }
    for (uint32_t i = 0; i < n; i++) {
        if (b->objs[i] && c->body[i] != 1) {
            /* The client says this key's bytes did not all arrive; a WRITE
             * of it may still be coming, so the QPs stop before the room
             * is given back, and the connection ends after this answer. */
            server_rdma_conn_kill(c);
            c->close_after_write = 1;
            store_abort_batch(s, &b->objs[i], 1);
            b->objs[i] = NULL;
            b->status[i] = GDRKV_E_INVALID;
        }
    }
    store_commit_batch(s, b->objs, n);
    c->holds = CONN_HOLDS_NOTHING;
    for (uint32_t i = 0; i < n; i++)
        if (b->status[i] == STORE_PRESENT)
            b->status[i] = 0;
    return server_reply_results(c, n, b->status, NULL, 0);
}

static int op_delete(struct server_conn *c)
{
    struct server_batch *b = &c->batch;
    store_delete_batch(store_of(c), &c->ns, b->entries, c->req.count, b->status);
    return server_reply_results(c, c->req.count, b->status, NULL, 0);
}

static int op_clear(struct server_conn *c)
{
    int32_t status = 0;
    uint64_t removed = store_clear_ns(store_of(c), &c->ns);
    return server_reply_results(c, 1, &status, &removed, 0);
}

/* ------------------------------------------------------------ rdma */

static int refuse_rdma(struct server_conn *c, int code, const char *msg)
{
    server_rdma_count_hello(c->worker->server, 0);
    GK_DEBUG("fd %d: rdma hello refused: %s", c->fd, msg);
    return server_reply_error(c, code, msg, strlen(msg));
}

/* RDMA_HELLO: the connection gets QPs connected to the client's, and the
 * answer carries the server's side and the pool's regions. A server
 * without rdma says so: the client goes on over the socket (auto) or
 * gives up on this server (transport rdma). */
static int op_rdma_hello(struct server_conn *c)
{
    struct gdrkv_server *s = c->worker->server;
    struct rdma_endpoint peer, mine;
    const char *why = NULL;

    if (!s->rdma) {
        static const char msg[] = "this server has no rdma";
        return server_reply_error(c, GDRKV_E_UNSUPPORTED, msg, sizeof msg - 1);
    }
    if (c->rdma)
        return refuse_rdma(c, GDRKV_E_INVALID, "the connection already has QPs");
    size_t used = rdma_endpoint_decode(c->body, c->req.body_len, &peer);
    if (used == 0 || used != c->req.body_len)
        return refuse_rdma(c, GDRKV_E_PROTOCOL, "malformed rdma endpoint");
    int rc = server_rdma_conn_create(c, &peer, &mine, &why);
    if (rc == GDRKV_E_INTERNAL)
        return rc;
    if (rc)
        return refuse_rdma(c, rc, why);

    uint32_t nregions;
    const struct rdma_region *regions = server_rdma_regions(s, &nregions);
    if (server_reply_rdma_hello(c, &mine, regions, nregions)) {
        server_rdma_conn_destroy(c);
        return GDRKV_E_INTERNAL;
    }
    server_rdma_count_hello(s, 1);
    return 0;
}

/* ------------------------------------------------------------ auth */

/* AUTH (common/auth.h): the first answers the client's nonce with ours and
 * our proof, the second checks the client's proof. A wrong proof ends the
 * connection: a guesser gets one try per connection. */
static int op_auth(struct server_conn *c)
{
    const struct gk_token *t = &c->worker->server->token;
    struct server_counters *counters = &c->worker->counters;

    if (!t->len) {
        static const char msg[] = "this server has no token (--auth-token-file)";
        return server_reply_error(c, GDRKV_E_UNSUPPORTED, msg, sizeof msg - 1);
    }
    if (c->auth == CONN_AUTH_NONE) {
        memcpy(c->client_nonce, c->body, GK_AUTH_NONCE_SIZE);
        uint8_t proof[GK_AUTH_PROOF_SIZE];
        if (gk_auth_nonce(c->server_nonce))
            return GDRKV_E_INTERNAL;
        gk_auth_proof(t, GK_AUTH_SERVER, c->client_nonce, c->server_nonce, proof);
        c->auth = CONN_AUTH_CHALLENGED;
        return server_reply_auth_challenge(c, c->server_nonce, proof);
    }
    if (c->auth == CONN_AUTH_DONE) {
        static const char msg[] = "the connection is authenticated already";
        return server_reply_error(c, GDRKV_E_INVALID, msg, sizeof msg - 1);
    }
    if (!gk_auth_check(t, GK_AUTH_CLIENT, c->client_nonce, c->server_nonce, c->body)) {
        static const char msg[] = "wrong token: the client's proof does not match this "
                                  "server's token";
        gk_counter_add(&counters->auth_denied, 1);
        c->close_after_write = 1;
        return server_reply_error(c, GDRKV_E_DENIED, msg, sizeof msg - 1);
    }
    c->auth = CONN_AUTH_DONE;
    gk_counter_add(&counters->auth_ok, 1);
    if (server_conn_authenticated(c) < 0) {
        static const char msg[] = "the server is full: max_connections, or this address's "
                                  "max_connections_per_peer, reached";
        c->close_after_write = 1;
        return server_reply_error(c, GDRKV_E_UNAVAILABLE, msg, sizeof msg - 1);
    }
    return server_reply_status(c, 0);
}

/* ------------------------------------------------------------ pin reports */

/* PINS: what the peer process pins of the pool, for the stats alone. */
static int op_pins(struct server_conn *c)
{
    struct gk_pins r;
    const char *why = "malformed pin report";
    int rc = gk_pins_decode(c->body, c->req.body_len, &r);
    if (!rc)
        rc = server_gpu_pins_report(c->worker->server->gpu_pins, c->pid, &r, &why);
    if (rc)
        return server_reply_error(c, rc, why, strlen(why));
    return server_reply_status(c, 0);
}

/* ------------------------------------------------------------ dispatch */

/* The dispatch table: op_<name> for every line of GK_OPS, so an op added
 * there without a handler here does not build. */
typedef int (*server_op_fn)(struct server_conn *c);

static const server_op_fn handlers[GK_OP_MAX + 1] = {
#define SERVER_OP_HANDLER(NAME, code, name, body, results, trans, in, out, after, reads, reach) \
    [code] = op_##name,
    GK_OPS(SERVER_OP_HANDLER)
#undef SERVER_OP_HANDLER
};

int server_ops_execute(struct server_conn *c)
{
    uint8_t op = c->req.opcode;

    c->worker->last_was_staged = op == GK_OP_PUT_STAGED;
    if (op == 0 || op > GK_OP_MAX)
        return GDRKV_E_UNSUPPORTED;   /* gk_check_request_hdr let none through */
    return handlers[op](c);
}

/* A local connection of a single-tenant server: it maps the pool writable. */
static int single_tenant_local(const struct server_conn *c)
{
    return c->local && c->worker->server->opts.single_tenant;
}

int server_ops_allowed(const struct server_conn *c, uint8_t op)
{
    switch (gk_op(op)->reach) {
    case GK_REACH_ANY: return 1;
    case GK_REACH_LOCAL: return c->local;
    case GK_REACH_READER: return c->local || server_rdma_conn_active(c);
    case GK_REACH_WRITER: return server_rdma_conn_active(c) || single_tenant_local(c);
    case GK_REACH_COMMITTER: return c->rdma != NULL || single_tenant_local(c);
    }
    return 0;
}

/* ------------------------------------------------------------ holds */

/* When a hold kept past its frame expires: the timeout, plus 1 ms per MiB
 * held: a batch of tens of GiB moving at 1 GB/s or more is never cut off,
 * a client that went away still is. */
static uint64_t hold_deadline(const struct server_conn *c, uint64_t bytes)
{
    return gk_now_ns() + (uint64_t)c->worker->server->opts.lease_timeout_ms * 1000000ull +
           (bytes >> 20) * 1000000ull;
}

void server_ops_frame_done(struct server_conn *c)
{
    if (c->req.opcode == GK_OP_LEASE && c->holds == CONN_HOLDS_PINS) {
        c->holds = CONN_HOLDS_LEASE;
        c->lease.count = c->req.count;
        c->lease.deadline_ns = hold_deadline(c, c->lease.bytes);
        return;
    }
    /* RESERVE's reservations wait for the client's WRITEs and COMMIT. */
    if (c->req.opcode == GK_OP_RESERVE && c->holds == CONN_HOLDS_RESERVATIONS) {
        c->holds = CONN_HOLDS_COMMIT;
        c->reserved.count = c->req.count;
        c->reserved.deadline_ns = hold_deadline(c, c->reserved.bytes);
        return;
    }
    server_ops_release(c);
}

void server_ops_release(struct server_conn *c)
{
    struct store *s = store_of(c);
    struct server_batch *b = &c->batch;

    switch (c->holds) {
    case CONN_HOLDS_NOTHING:
        break;
    case CONN_HOLDS_PINS:
        server_staging_lease(&c->staging, 0);
        store_unpin_batch(s, b->objs, c->req.count);
        break;
    case CONN_HOLDS_LEASE:
        server_staging_lease(&c->staging, 0);
        store_unpin_batch(s, b->objs, c->lease.count);
        break;
    case CONN_HOLDS_RESERVATIONS:
        store_abort_batch(s, b->objs, c->req.count);
        break;
    case CONN_HOLDS_COMMIT:
        /* The client may still be writing into them: stop its QPs first.
         * Without them the connection is no rdma one any more: it ends
         * after its next answer. */
        server_rdma_conn_kill(c);
        c->close_after_write = 1;
        store_abort_batch(s, b->objs, c->reserved.count);
        break;
    }
    c->holds = CONN_HOLDS_NOTHING;
    server_pins_credit(c->pin_account, c->pins_charged);
    c->pins_charged = 0;
}

int server_ops_frame_begin(struct server_conn *c, char *why, size_t len)
{
    const struct gk_hdr *h = &c->req;
    int ends_lease = h->opcode == GK_OP_RELEASE && c->holds == CONN_HOLDS_LEASE;
    int commits = h->opcode == GK_OP_COMMIT && c->holds == CONN_HOLDS_COMMIT;

    if (commits && h->count != c->reserved.count) {
        snprintf(why, len, "commit of %u keys, %u reserved", h->count, c->reserved.count);
        return GDRKV_E_PROTOCOL;
    }
    if (ends_lease || commits)
        return 0;
    /* A RELEASE or COMMIT that finds nothing held answers whether its hold
     * expired; any other frame starts afresh. */
    int asks_expiry = (h->opcode == GK_OP_RELEASE || h->opcode == GK_OP_COMMIT) &&
                      c->holds == CONN_HOLDS_NOTHING;
    server_ops_release(c);
    if (!asks_expiry)
        c->hold_expired = 0;
    return 0;
}

void server_ops_expire(struct server_conn *c, uint64_t now_ns)
{
    int leased = c->holds == CONN_HOLDS_LEASE, reserved = c->holds == CONN_HOLDS_COMMIT;
    if (!(leased && now_ns >= c->lease.deadline_ns) &&
        !(reserved && now_ns >= c->reserved.deadline_ns))
        return;
    GK_DEBUG("fd %d: %s of %u keys expired", c->fd, reserved ? "reservation" : "lease",
             reserved ? c->reserved.count : c->lease.count);
    server_ops_release(c);
    c->hold_expired = 1;
    gk_counter_add(&c->worker->counters.shm_leases_expired, 1);
}
