/*
 * client_call.c - turns a call into jobs. A keyed batch's pass (which keys
 * go where: client_keyed.c): each key is checked, its entries (one per
 * server it goes to) failed at once if their server is in backoff, else
 * gathered with the other keys of its server; each server's share is
 * striped over connections and cut into frames within the protocol's
 * limits. A keyless call (PING, STATS, CLEAR) is one frame per server.
 * Then client_run.c drives the jobs.
 *
 * Memory: two allocations per call whatever its size, one for the per-key
 * tables and one for the jobs, frames and frame buffers. Each is laid out
 * by running the same function twice, first only to measure.
 */
#include "client_call.h"

#include <stdlib.h>
#include <string.h>

#include "client_gpu_call.h"
#include "client_run.h"
#include "client_server.h"
#include "client_shm.h"
#include "common/common.h"
#include "client_table.h"

/* Value bytes a stripe must carry to be worth a connection of its own:
 * below it another connection costs more in syscalls and wakeups than
 * the parallelism gains. */
#define CLIENT_STRIPE_MIN_BYTES (256u << 10)

/* Value bytes a stripe of a PUT through shm staging must carry: each of
 * its bytes is copied twice (client, then server), so it must carry more
 * than CLIENT_STRIPE_MIN_BYTES to pay for its connection. */
#define CLIENT_SHM_PUT_STRIPE_MIN_BYTES (512u << 10)

/* The first frame of a GPU GET carries this part of its stripe's bytes. */
#define CLIENT_GPU_FIRST_FRAME_PART 8

#define NO_SERVER CLIENT_NO_SERVER

/* One server's part in a call. */
struct server_share {
    int admitted;
    int refusal;            /* not admitted: the error its keys get */
    uint32_t count;         /* keys it gets */
    uint64_t key_bytes;
    uint64_t bytes;         /* of their values (PUT) or capacities (GET) */
    uint32_t fill_pos;      /* where its next key is gathered */
    uint64_t fill_key_off;
    uint64_t staged_frame;  /* its PUT values go through shm staging in frames
                               of this many bytes (0: they don't; staged_frame()) */
};

/* Per-key tables of a keyed call, indexed like the caller's keys (the
 * per-entry ones: e = r * n + i, see struct client_round). */
struct key_tables {
    struct server_share *shares;    /* one per server of the table */
    const struct gpu_call *gpu;     /* bad[i]: key i was refused for its GPU segments */
    /* Several servers or copies only (one server's keys are gathered as
     * they are checked): */
    uint32_t *server;       /* per entry: where it goes, or NO_SERVER */
    uint64_t *size;         /* value bytes (PUT) or capacity (GET) */
    uint64_t *first_seg;    /* the key's first segment */
    uint64_t *key_off;      /* the key's bytes in the caller's keys */
};

/* ------------------------------------------------------------ memory */

struct arena {
    uint8_t *base;          /* NULL while measuring */
    size_t used;
};

static void *arena_take(struct arena *a, size_t bytes)
{
    void *p = a->base ? a->base + a->used : NULL;
    a->used += (bytes + 7) & ~(size_t)7;
    return p;
}

/* n keys of key_bytes, entries = n * copies positions at most. */
static void lay_out_keys(struct arena *a, struct key_tables *t, struct client_batch *b,
                         uint32_t n, uint32_t copies, uint32_t nservers, int routed,
                         uint64_t key_bytes)
{
    size_t entries = (size_t)n * copies;
    t->shares = arena_take(a, nservers * sizeof *t->shares);
    t->size = routed ? arena_take(a, n * sizeof *t->size) : NULL;
    t->first_seg = routed ? arena_take(a, n * sizeof *t->first_seg) : NULL;
    t->key_off = routed ? arena_take(a, n * sizeof *t->key_off) : NULL;
    t->server = routed ? arena_take(a, entries * sizeof *t->server) : NULL;
    b->sizes = arena_take(a, entries * sizeof *b->sizes);
    b->first_seg = arena_take(a, entries * sizeof *b->first_seg);
    b->got = arena_take(a, entries * sizeof *b->got);
    b->index = arena_take(a, entries * sizeof *b->index);
    b->slot = copies > 1 ? arena_take(a, entries * sizeof *b->slot) : NULL;
    b->key_lens = arena_take(a, entries * sizeof *b->key_lens);
    b->keys = arena_take(a, key_bytes * copies);
}

/* ------------------------------------------------------------ planning */

/* The measuring pass notes the frames it plans, up to PLANNED_MAX of
 * them, and the filling pass replays the notes: a batch of small pages
 * walks its keys once, not twice, which halves its planning
 * (docs/benchmarks-log.md, "Where a small-page GPU GET's time goes;
 * planning once"). A call of more frames is planned again. */
#define PLANNED_MAX 64

struct planned_frame {
    uint32_t server;        /* of its job, when it starts one */
    int starts_job;
    uint32_t first, count;
    uint64_t body_len, payload_len, key_bytes;
};

struct planner {
    const struct client_batch *b;
    uint32_t conns;
    struct client_job *jobs;        /* NULL while measuring */
    struct client_frame *frames;
    uint8_t *bufs;
    uint32_t njobs, nframes;
    size_t buf_bytes;
    uint64_t key_off;
    struct planned_frame planned[PLANNED_MAX];  /* while measuring */
    uint32_t job_server;    /* the job the next noted frame starts, if any */
    int job_starts;
};

static void add_job(struct planner *pl, uint32_t server)
{
    if (pl->jobs)
        pl->jobs[pl->njobs] = (struct client_job){.server = server,
                                                  .frames = pl->frames + pl->nframes};
    pl->njobs++;
    pl->job_server = server;
    pl->job_starts = 1;
}

static void add_frame(struct planner *pl, uint32_t first, uint32_t count, uint64_t body_len,
                      uint64_t payload_len, uint64_t key_bytes)
{
    uint64_t response = (uint64_t)gk_op_result_count(pl->b->opcode, count) * GK_RESULT_SIZE;
    size_t cap = GK_HDR_SIZE + (size_t)GK_MAX(body_len, response);

    if (pl->frames) {
        pl->frames[pl->nframes] = (struct client_frame){
            .first = first,
            .count = count,
            .key_off = pl->key_off,
            .body_len = (uint32_t)body_len,
            .payload_len = payload_len,
            .buf = pl->bufs + pl->buf_bytes,
            .buf_cap = cap,
        };
        pl->jobs[pl->njobs - 1].nframes++;
    } else if (pl->nframes < PLANNED_MAX) {
        pl->planned[pl->nframes] = (struct planned_frame){
            .server = pl->job_server, .starts_job = pl->job_starts, .first = first,
            .count = count, .body_len = body_len, .payload_len = payload_len,
            .key_bytes = key_bytes};
    }
    pl->job_starts = 0;
    pl->nframes++;
    pl->buf_bytes += cap;
    pl->key_off += key_bytes;
}

/* Cuts positions [first, end) into frames, each as large as the limits on
 * keys, body and payload per frame allow (the first, at most first_cap
 * value bytes). */
static void cut_frames(struct planner *pl, const struct server_share *sh, uint32_t first,
                       uint32_t end, uint64_t first_cap)
{
    const struct client_batch *b = pl->b;
    uint32_t p = first;
    /* A PUT through shm staging is cut as client.c says; tcp GPU
     * values pass through per-connection staging of GPU_FRAME_BYTES, and a
     * GPU PUT to a single-tenant server is cut alike (fewer round trips
     * per launch); a GET answer may pin at most GK_MAX_GET_CAPACITY. */
    uint64_t max_payload = sh->staged_frame           ? sh->staged_frame
                           : b->gpu                   ? GPU_FRAME_BYTES
                           : b->opcode == GK_OP_GET ? GK_MAX_GET_CAPACITY
                                                    : GK_MAX_PAYLOAD;

    while (p < end) {
        uint32_t start = p;
        uint64_t body = 1 + (uint64_t)b->ns->len, values = 0, key_bytes = 0;
        uint64_t cap = p == first ? GK_MIN(max_payload, first_cap) : max_payload;
        do {
            body += GK_ENTRY_HDR_SIZE + b->key_lens[p];
            key_bytes += b->key_lens[p];
            values += b->sizes[p];
            p++;
        } while (p < end && p - start < GK_MAX_KEYS &&
                 body + GK_ENTRY_HDR_SIZE + b->key_lens[p] <= GK_MAX_BODY &&
                 values + b->sizes[p] <= cap);
        add_frame(pl, start, p - start, body, b->opcode == GK_OP_PUT ? values : 0, key_bytes);
    }
}

/* Plans one server's jobs. Its keys [first, end) are split into up to
 * `conns` stripes of about equal value bytes, each a job of its own, when
 * there are enough bytes to gain from parallel connections. */
static void plan_server(struct planner *pl, uint32_t server, const struct server_share *sh,
                        uint32_t first, uint32_t end)
{
    const struct client_batch *b = pl->b;

    if (!gk_op_has_keys(b->opcode)) {
        add_job(pl, server);
        /* CLEAR's body is its namespace, no entries. */
        uint64_t body_len = gk_op_is_keyed(b->opcode) ? gk_request_body_size(b->ns->len, 0, NULL)
                                                      : 0;
        add_frame(pl, 0, 0, body_len, 0, 0);
        return;
    }
    uint64_t bytes = sh->bytes;
    uint64_t stripes =
        bytes / (sh->staged_frame ? CLIENT_SHM_PUT_STRIPE_MIN_BYTES : CLIENT_STRIPE_MIN_BYTES);
    stripes = GK_MAX(1, GK_MIN(stripes, GK_MIN(pl->conns, end - first)));

    uint32_t p = first;
    uint64_t done = 0;
    for (uint64_t s = 1; s <= stripes; s++) {
        uint32_t start = p;
        uint64_t goal = s == stripes ? UINT64_MAX : bytes / stripes * s;
        uint32_t last = end - (uint32_t)(stripes - s);  /* a key left for each later stripe */
        do
            done += b->sizes[p++];
        while (p < last && done < goal);
        add_job(pl, server);
        /* A striped GPU GET's first frame is small: its answer is back,
         * and its copy running, while the other stripes are still being
         * sent and looked up, instead of the GPU idling until a whole
         * stripe is. (Alone on one connection, it would only add a round
         * trip before the rest.) */
        uint64_t first_cap = pl->nframes == 0 && stripes > 1 && b->gpu && b->opcode == GK_OP_GET
                                 ? GK_MAX(1, bytes / stripes / CLIENT_GPU_FIRST_FRAME_PART)
                                 : UINT64_MAX;
        cut_frames(pl, sh, start, p, first_cap);
    }
}

static void plan_all(struct planner *pl, const struct server_share *shares, uint32_t nservers)
{
    uint32_t first = 0;
    for (uint32_t s = 0; s < nservers; s++) {
        if (shares[s].admitted)
            plan_server(pl, s, &shares[s], first, first + shares[s].count);
        first += shares[s].count;
    }
}

static void lay_out_jobs(struct arena *a, struct client_call *call, struct planner *pl)
{
    call->jobs = arena_take(a, pl->njobs * sizeof *call->jobs);
    call->pollfds = arena_take(a, pl->njobs * sizeof *call->pollfds);
    pl->frames = arena_take(a, pl->nframes * sizeof *pl->frames);
    pl->bufs = arena_take(a, pl->buf_bytes);
}

/* Fills call->jobs for the admitted servers. The jobs head the allocation
 * that also holds the frames and their buffers: free(call->jobs) releases
 * it all. */
static int plan(struct gdrkv_client *c, struct client_call *call,
                const struct server_share *shares, uint32_t nservers)
{
    struct planner pl = {.b = &call->batch, .conns = c->opts.conns};
    struct arena a = {0};

    plan_all(&pl, shares, nservers);
    if (!pl.njobs)
        return 0;
    lay_out_jobs(&a, call, &pl);
    if (!(a.base = malloc(a.used)))
        return GDRKV_E_INTERNAL;
    a.used = 0;
    lay_out_jobs(&a, call, &pl);
    uint32_t nframes = pl.nframes;
    pl.jobs = call->jobs;
    pl.njobs = pl.nframes = 0;
    pl.buf_bytes = 0;
    pl.key_off = 0;
    if (nframes <= PLANNED_MAX) {
        for (uint32_t f = 0; f < nframes; f++) {
            const struct planned_frame *p = &pl.planned[f];
            if (p->starts_job)
                add_job(&pl, p->server);
            add_frame(&pl, p->first, p->count, p->body_len, p->payload_len, p->key_bytes);
        }
    } else {
        plan_all(&pl, shares, nservers);
    }
    call->njobs = pl.njobs;
    call->batch.frames_unstarted = nframes;
    return 0;
}

/* ------------------------------------------------------------ keyed calls */

static int key_len_ok(uint32_t len)
{
    return len >= 1 && len <= GK_MAX_KEY_LEN;
}

/* Checks key i before anything is sent; a bad key fails alone.
 * first_seg is the index of its first segment. */
static inline int check_key(const struct client_keys *k, uint32_t i, uint64_t first_seg,
                            uint64_t *size)
{
    uint32_t len = k->key_lens[i];

    *size = 0;
    /* Key length and segment count are the caller's arguments (INVALID);
     * TOO_LARGE is kept for the object's size. */
    if (!key_len_ok(len))
        return GDRKV_E_INVALID;
    if (!k->seg_counts)
        return 0;
    if (k->seg_counts[i] > GK_MAX_SEGMENTS)
        return GDRKV_E_INVALID;
    for (uint64_t s = first_seg; s < first_seg + k->seg_counts[i]; s++) {
        /* (A destination the answer allocates has none yet.) */
        if (k->seg_lens[s] && !k->seg_ptrs[s] && !k->alloc_ptrs)
            return GDRKV_E_INVALID;
        if (k->seg_lens[s] > GK_MAX_OBJECT - *size)
            return GDRKV_E_TOO_LARGE;
        *size += k->seg_lens[s];
    }
    return 0;
}

/* Several servers or copies: checks every key and counts what each
 * server gets from the round's targets. */
static void assign_keys(const struct client_keys *k, const struct client_round *r,
                        struct key_tables *t)
{
    uint64_t seg = 0, key_off = 0;
    uint32_t n = k->n;

    for (uint32_t i = 0; i < n; i++) {
        int rc = check_key(k, i, seg, &t->size[i]);
        if (!rc && t->gpu && t->gpu->bad && t->gpu->bad[i])
            rc = GDRKV_E_INVALID;
        t->first_seg[i] = seg;
        t->key_off[i] = key_off;
        for (uint32_t e = i; e < n * r->copies; e += n) {
            uint32_t s = r->targets[e];
            t->server[e] = rc ? NO_SERVER : s;
            if (s == NO_SERVER)
                continue;
            if (rc) {
                r->results[e] = rc;
                continue;
            }
            t->shares[s].count++;
            t->shares[s].key_bytes += k->key_lens[i];
            t->shares[s].bytes += t->size[i];
        }
        seg += k->seg_counts ? k->seg_counts[i] : 0;
        key_off += k->key_lens[i];
    }
}

/* The value bytes of a server's PUT frames when they most likely go
 * through shm staging, else 0. They do when it has a unix socket and the
 * pool mapped from it (if any yet) is not a single-tenant server's, into
 * which the client copies the values itself (over tcp after all, they are
 * merely smaller). The client's frame size (client.c), cut to the staging
 * the server gives, so that a smaller --shm-staging does not send every
 * frame on the socket. Decided once per call: both planning passes must
 * cut the same frames. */
static uint64_t staged_frame(const struct gdrkv_client *c, struct client_endpoint *ep, uint8_t op)
{
    if (op != GK_OP_PUT || !ep->unix_path[0])
        return 0;
    uint64_t room = client_shm_staging_room(ep);
    return room ? GK_MIN(room, c->shm_put_frame_bytes) : 0;
}

/* The health short-circuit: a server in backoff gets nothing sent. Then
 * each admitted server's group gets its place in the gathered arrays.
 * Returns how many entries will be sent. */
static uint32_t admit_servers(struct gdrkv_client *c, struct client_server **servers,
                              uint32_t nservers, struct server_share *shares, uint8_t op,
                              uint64_t now)
{
    uint32_t pos = 0;
    uint64_t key_off = 0, refused = 0;

    for (uint32_t s = 0; s < nservers; s++) {
        struct server_share *sh = &shares[s];
        if (sh->count && (sh->refusal = client_server_admit(servers[s], now))) {
            refused += sh->count;
            sh->count = 0;
            sh->key_bytes = 0;
            sh->bytes = 0;
        } else {
            sh->admitted = sh->count > 0;
            sh->staged_frame = sh->admitted ? staged_frame(c, &servers[s]->ep, op) : 0;
        }
        sh->fill_pos = pos;
        sh->fill_key_off = key_off;
        pos += sh->count;
        key_off += sh->key_bytes;
    }
    gk_counter_add(&c->counters.shortcircuit_keys, refused);
    return pos;
}

/* Copies the entries of admitted servers into their groups; the entries
 * of refused servers fail here. */
static void gather_keys(const struct client_keys *k, const struct client_round *r,
                        const struct key_tables *t, struct client_batch *b)
{
    uint32_t n = k->n;
    for (uint32_t e = 0; e < n * r->copies; e++) {
        uint32_t s = t->server[e], i = e % n;
        if (s == NO_SERVER)
            continue;
        struct server_share *sh = &t->shares[s];
        if (!sh->admitted) {
            r->results[e] = sh->refusal;
            continue;
        }
        uint32_t p = sh->fill_pos++;
        b->index[p] = i;
        if (b->slot)
            b->slot[p] = e;
        b->key_lens[p] = k->key_lens[i];
        b->sizes[p] = t->size[i];
        b->first_seg[p] = t->first_seg[i];
        memcpy(b->keys + sh->fill_key_off, k->keys + t->key_off[i], k->key_lens[i]);
        sh->fill_key_off += k->key_lens[i];
    }
}

/* Copies the keys that were not refused into b->keys, in order. */
static void gather_kept_keys(const struct client_keys *k, struct client_batch *b, uint32_t kept)
{
    uint64_t key_off = 0, kept_off = 0;
    for (uint32_t i = 0, p = 0; i < k->n && p < kept; i++) {
        if (b->index[p] == i) {
            memcpy(b->keys + kept_off, k->keys + key_off, k->key_lens[i]);
            kept_off += k->key_lens[i];
            p++;
        }
        key_off += k->key_lens[i];
    }
}

/* One server: its group is every good key in the caller's order, so
 * each key is checked and gathered in one pass, and the keys move in one
 * copy unless one was refused (a third less time than routing, then
 * gathering: docs/benchmarks-log.md, "Planning a small-page GPU GET in
 * fewer passes; deletes fetched ahead"). Nothing in the loop is copied
 * bytewise, so the compiler keeps the arrays' addresses in registers.
 * Returns how many keys will be sent. */
static uint32_t gather_for_one_server(struct gdrkv_client *c, struct client_server *server,
                                      const struct client_keys *k, const struct key_tables *t,
                                      struct client_batch *b, uint8_t op, uint64_t now)
{
    struct server_share *sh = &t->shares[0];
    const uint8_t *bad = t->gpu ? t->gpu->bad : NULL;
    uint64_t seg = 0, kept_off = 0, bytes = 0;
    uint32_t p = 0;

    for (uint32_t i = 0; i < k->n; i++) {
        uint32_t len = k->key_lens[i];
        uint64_t size;
        int rc = check_key(k, i, seg, &size);
        if (!rc && bad && bad[i])
            rc = GDRKV_E_INVALID;
        if (rc) {
            b->results[i] = rc;
        } else {
            b->index[p] = i;
            b->key_lens[p] = len;
            b->sizes[p] = size;
            b->first_seg[p] = seg;
            kept_off += len;
            bytes += size;
            p++;
        }
        seg += k->seg_counts ? k->seg_counts[i] : 0;
    }
    if (p == k->n)
        memcpy(b->keys, k->keys, kept_off);
    else
        gather_kept_keys(k, b, p);
    if (p && (sh->refusal = client_server_admit(server, now))) {
        for (uint32_t q = 0; q < p; q++)
            b->results[b->index[q]] = sh->refusal;
        gk_counter_add(&c->counters.shortcircuit_keys, p);
        return 0;
    }
    sh->count = p;
    sh->key_bytes = kept_off;
    sh->bytes = bytes;
    sh->admitted = p > 0;
    sh->staged_frame = sh->admitted ? staged_frame(c, &server->ep, op) : 0;
    return p;
}

int client_round_run(struct gdrkv_client *c, uint8_t op, const struct client_keys *k,
                     const struct client_round *r)
{
    struct client_table *table = r->table;
    struct client_call call = {
        .batch = {
            .opcode = op,
            .ns = &c->ns,
            .seg_ptrs = k->seg_ptrs,
            .seg_lens = k->seg_lens,
            .seg_counts = k->seg_counts,
            .results = r->results,
            .alloc_ptrs = k->alloc_ptrs,
            .alloc_lens = k->alloc_lens,
            .copier = &c->copier,
            .deadline_ns = r->deadline_ns,
        },
        .servers = table->all,
        .deadline_ns = r->deadline_ns,
    };
    struct client_batch *b = &call.batch;
    struct key_tables t;
    struct arena a = {0};
    uint64_t key_bytes = 0;
    uint64_t start = gk_now_ns();
    int routed = r->targets != NULL;

    for (uint32_t i = 0; i < k->n; i++)
        if (key_len_ok(k->key_lens[i]))
            key_bytes += k->key_lens[i];
    lay_out_keys(&a, &t, b, k->n, r->copies, table->nall, routed, key_bytes);
    if (!(a.base = malloc(a.used)))
        goto fail_all;
    a.used = 0;
    lay_out_keys(&a, &t, b, k->n, r->copies, table->nall, routed, key_bytes);
    memset(t.shares, 0, table->nall * sizeof *t.shares);

    int rc = 0;
    /* Memory the call allocates is host memory. */
    t.gpu = b->gpu = k->alloc_ptrs ? NULL
                                   : gpu_call_prepare(&c->regions, c->opts.gpu_copy, op, k,
                                                      &c->gpu_put_streams, &rc);
    if (rc) {
        free(a.base);
        goto fail_all;
    }
    uint32_t nsend;
    if (!routed) {
        nsend = gather_for_one_server(c, table->all[0], k, &t, b, op, start);
    } else {
        assign_keys(k, r, &t);
        nsend = admit_servers(c, table->all, table->nall, t.shares, op, start);
        gather_keys(k, r, &t, b);
    }
    rc = plan(c, &call, t.shares, table->nall);
    if (rc == 0)
        client_run(c, &call);
    else
        for (uint32_t p = 0; p < nsend; p++)
            *client_result(b, p) = rc;
    free(call.jobs);
    free(a.base);
    gpu_call_free(b->gpu);
    return rc;

fail_all:
    rc = rc ? rc : GDRKV_E_INTERNAL;
    for (uint32_t e = 0; e < k->n * r->copies; e++)
        if (!r->targets || r->targets[e] != NO_SERVER)
            r->results[e] = rc;
    return rc;
}

void client_record_call(struct gdrkv_client *c, uint8_t op, uint32_t keys, uint64_t start)
{
    gk_counter_add(&c->counters.calls[op], 1);
    gk_counter_add(&c->counters.keys[op], keys);
    gk_latency_record(&c->counters.latency[op], (gk_now_ns() - start) / 1000);
}

/* ------------------------------------------------------------ keyless calls */

int client_server_call(struct gdrkv_client *c, struct client_table *t, uint8_t op,
                       uint32_t first, uint32_t count, int64_t *results, char *text,
                       size_t text_cap)
{
    if (!c)
        return GDRKV_E_CLOSED;
    uint64_t start = gk_now_ns();
    struct client_call call = {
        .batch = {.opcode = op, .ns = &c->ns, .text = text, .text_cap = text_cap},
        .servers = t->all,
        .deadline_ns = start + (uint64_t)c->opts.timeout_ms * 1000000u,
    };
    struct server_share *shares = calloc(t->nall ? t->nall : 1, sizeof *shares);
    if (!shares)
        return GDRKV_E_INTERNAL;
    for (uint32_t s = first; s < first + count; s++) {
        int refusal = client_server_admit(t->all[s], start);
        shares[s].admitted = !refusal;
        /* An admitted server's frame overwrites this, unless planning fails. */
        results[s - first] = refusal ? refusal : GDRKV_E_INTERNAL;
    }
    int rc = plan(c, &call, shares, t->nall);
    if (rc == 0) {
        client_run(c, &call);
        for (uint32_t j = 0; j < call.njobs; j++)
            results[call.jobs[j].server - first] = call.jobs[j].frames[0].result;
    }
    free(call.jobs);
    free(shares);
    client_record_call(c, op, 0, start);
    return rc;
}
