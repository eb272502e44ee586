/*
 * client_rdma.c - see client_rdma.h.
 */
#include "client_rdma.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_chunks.h"
#include "client_frame.h"
#include "client_gpu_call.h"
#include "common/common.h"
#include "common/grow.h"
#include "common/log.h"
#include "common/protocol.h"
#include "common/stats.h"
#include "gdrkv.h"
#include "rdma/rdma_dev.h"
#include "rdma/rdma_mr.h"
#include "rdma/rdma_qp.h"

static uint32_t env_u32(const char *name, uint32_t dflt, uint32_t lo, uint32_t hi)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    unsigned long x = strtoul(v, NULL, 10);
    return x < lo ? lo : x > hi ? hi : (uint32_t)x;
}

int client_rdma_init(struct client_rdma *r)
{
    memset(r, 0, sizeof *r);
    r->qps_per_conn = env_u32("GDRKV_IB_QPS", 4, 1, 16);
    r->sq_depth = env_u32("GDRKV_IB_SQ_DEPTH", 512, 2, 1u << 15);
    const char *flush = getenv("GDRKV_IB_FLUSH");
    r->flush_mode = flush && !strcmp(flush, "always") ? CLIENT_RDMA_FLUSH_ALWAYS
                    : flush && !strcmp(flush, "never") ? CLIENT_RDMA_FLUSH_NEVER
                    : CLIENT_RDMA_FLUSH_AUTO;
    if (flush && *flush && strcmp(flush, "auto") && r->flush_mode == CLIENT_RDMA_FLUSH_AUTO)
        GK_WARN("GDRKV_IB_FLUSH=%s is not auto, always or never: using auto", flush);
    if (pthread_mutex_init(&r->lock, NULL))
        return GDRKV_E_INTERNAL;
    return 0;
}

/* ------------------------------------------------------------ device, MRs */

void client_rdma_destroy(struct client_rdma *r)
{
    struct rdma_dev *d = r->dev;
    for (uint32_t i = 0; i < r->nmrs; i++)
        rdma_mr_deregister(d, r->mrs[i].mr, r->mrs[i].dmabuf_fd);
    free(r->mrs);
    if (d) {
        rdma_dev_close(d);
        free(d);
    }
    pthread_mutex_destroy(&r->lock);
}

static int ready_locked(struct client_rdma *r, const char *near_pci)
{
    if (r->state == 0) {
        struct rdma_dev *d = calloc(1, sizeof *d);
        int rc = d ? rdma_dev_open(d, near_pci, r->why, sizeof r->why) : GDRKV_E_INTERNAL;
        if (rc) {
            free(d);
            r->state = -1;
            GK_INFO("rdma unavailable: %s", r->why);
        } else {
            r->dev = d;
            r->state = 1;
        }
    }
    return r->state == 1 ? 0 : GDRKV_E_UNAVAILABLE;
}

/* Opens the device on first use: 0, or GDRKV_E_UNAVAILABLE (r->why). */
static int client_rdma_ready(struct client_rdma *r)
{
    pthread_mutex_lock(&r->lock);
    int rc = ready_locked(r, NULL);
    pthread_mutex_unlock(&r->lock);
    return rc;
}

/* Registration can take seconds for a large or GPU range: it runs
 * outside the lock, so other threads' calls go on meanwhile. The regions
 * table (client_regions.c) already refused overlapping ranges. */
int client_rdma_register(struct client_rdma *r, uint64_t ptr, uint64_t len, int device)
{
    char pci[32];
    pthread_mutex_lock(&r->lock);
    int rc = ready_locked(r, device >= 0 && r->state == 0
                                 ? rdma_gpu_pci_address(device, pci, sizeof pci) : NULL);
    pthread_mutex_unlock(&r->lock);
    if (rc)
        return rc;

    struct rdma_dev *d = r->dev;
    uint64_t t0 = gk_now_ns();
    /* Remote read only for the flush QP, which is connected to itself: the
     * data QPs grant the server no access at all. */
    int flush = r->flush_mode == CLIENT_RDMA_FLUSH_ALWAYS ||
                (r->flush_mode == CLIENT_RDMA_FLUSH_AUTO && device >= 0 &&
                 rdma_gpu_needs_flush(device));
    int dmabuf_fd;
    struct ibv_mr *mr = rdma_mr_register(d, ptr, len, device, flush, &dmabuf_fd);
    if (!mr) {
        GK_WARN("rdma: cannot register %llu bytes at 0x%llx on %s: %s", (unsigned long long)len,
                (unsigned long long)ptr, d->name, strerror(errno));
        return errno == ENOMEM ? GDRKV_E_NO_SPACE : GDRKV_E_INVALID;
    }
    GK_DEBUG("rdma: registered %llu bytes in %llu us", (unsigned long long)len,
             (unsigned long long)((gk_now_ns() - t0) / 1000));

    pthread_mutex_lock(&r->lock);
    if (gk_grow(&r->mrs, &r->cap, (size_t)r->nmrs + 1, sizeof *r->mrs, 8) == 0) {
        r->gpu_mrs += device >= 0;
        r->gpu_mrs_dmabuf += dmabuf_fd >= 0;
        r->mrs[r->nmrs++] = (struct client_mr){.ptr = ptr, .len = len, .mr = mr,
                                               .lkey = mr->lkey, .rkey = mr->rkey,
                                               .dmabuf_fd = dmabuf_fd, .flush = flush};
        mr = NULL;
    }
    pthread_mutex_unlock(&r->lock);
    if (mr) {
        rdma_mr_deregister(d, mr, dmabuf_fd);
        return GDRKV_E_INTERNAL;
    }
    return 0;
}

void client_rdma_unregister(struct client_rdma *r, uint64_t ptr)
{
    pthread_mutex_lock(&r->lock);
    for (uint32_t i = 0; i < r->nmrs; i++) {
        if (r->mrs[i].ptr == ptr) {
            rdma_mr_deregister(r->dev, r->mrs[i].mr, r->mrs[i].dmabuf_fd);
            r->mrs[i] = r->mrs[--r->nmrs];
            break;
        }
    }
    pthread_mutex_unlock(&r->lock);
}

/* The MR covering [ptr, ptr + len), or NULL; under the lock. */
static const struct client_mr *mr_of(struct client_rdma *r, uint64_t ptr, uint64_t len)
{
    for (uint32_t i = 0; i < r->nmrs; i++) {
        const struct client_mr *m = &r->mrs[i];
        if (ptr >= m->ptr && len <= m->len && ptr - m->ptr <= m->len - len)
            return m;
    }
    return NULL;
}

/* ------------------------------------------------------------ connections */

struct client_rdma_conn {
    struct client_rdma *owner;
    struct rdma_qps qps;
    struct rdma_region *regions;
    uint32_t nregions;
    uint64_t pool_size;
    struct rdma_pieces pieces;
    struct client_batch *batch;     /* of the run in progress, for failures */
    const struct client_frame *frame;
    uint8_t *flags;                 /* WRITE: the frame's commit flags */
    /* READ: one destination in each MR that needs a flush (one MR per GPU
     * is the usual engine layout), with the MR's rkey. */
    struct rdma_flush flush;
    /* The loopback QP its flush READs go on, made on first need: each
     * connection has its own, so a flush waits for nothing but itself. */
    struct rdma_flusher *flusher;
    int plan_err;                   /* why add_piece refused */
    /* The frame's run, stepped by the connection's poll loop. */
    struct rdma_run run;
    struct rdma_post_stats run_stats;
    int running;                    /* started: client_rdma_end follows */
    int timed_out;                  /* the call's deadline passed first */
};

/* The HELLO answer's body: the server's endpoint, then its regions. */
static int take_answer(struct client_rdma_conn *rc, const uint8_t *body, size_t len,
                       struct rdma_endpoint *peer)
{
    size_t used = rdma_endpoint_decode(body, len, peer);
    if (!used || peer->nqps != rc->qps.n || peer->rd_atomic > rc->qps.rd_atomic ||
        peer->sq_depth > rc->qps.sq_depth || peer->max_sge > rc->qps.max_sge)
        return GDRKV_E_PROTOCOL;
    rc->regions = calloc(RDMA_MAX_REGIONS, sizeof *rc->regions);
    if (!rc->regions)
        return GDRKV_E_INTERNAL;
    int n = rdma_regions_decode(body + used, len - used, rc->regions, RDMA_MAX_REGIONS);
    if (n <= 0)
        return GDRKV_E_PROTOCOL;
    rc->nregions = (uint32_t)n;
    rc->pool_size = rc->regions[n - 1].pool_off + rc->regions[n - 1].len;
    /* Granted, never more than asked: our send queues and SGE lists
     * shrink to what the server accepted. */
    rc->qps.sq_depth = peer->sq_depth;
    rc->qps.max_sge = peer->max_sge;
    rc->qps.max_sge_rd = GK_MIN(rc->qps.max_sge_rd, peer->max_sge);
    return 0;
}

int client_rdma_conn_new(struct client_rdma *r, struct client_rdma_conn **out, uint8_t *req,
                         size_t cap, size_t *req_len)
{
    if (client_rdma_ready(r))
        return GDRKV_E_UNSUPPORTED;
    struct rdma_dev *d = r->dev;
    struct client_rdma_conn *rc = calloc(1, sizeof *rc);
    if (!rc)
        return GDRKV_E_INTERNAL;
    rc->owner = r;
    uint32_t depth = GK_MIN(r->sq_depth, (uint32_t)GK_MAX(d->attr.max_qp_wr, 2));
    uint32_t sge = GK_MIN(16u, (uint32_t)GK_MAX(d->attr.max_sge, 1));
    if (rdma_qps_create(d, &rc->qps, r->qps_per_conn, depth, sge, 0)) {
        free(rc);
        return GDRKV_E_UNAVAILABLE;
    }
    /* What we ask the server for: as many READs in flight per QP as our
     * device can issue (it answers with what it can take, maybe fewer). */
    rc->qps.rd_atomic = (uint32_t)GK_MAX(GK_MIN(d->attr.max_qp_init_rd_atom, 16), 1);
    /* Multi-SGE READs are bounded by max_sge_rd, below max_sge on some NICs. */
    rc->qps.max_sge_rd = d->attr.max_sge_rd > 0 ? GK_MIN(rc->qps.max_sge,
                                                          (uint32_t)d->attr.max_sge_rd)
                                                : rc->qps.max_sge;

    struct rdma_endpoint mine;
    rdma_qps_describe(d, &rc->qps, &mine);
    if (cap < GK_HDR_SIZE + rdma_endpoint_size(&mine)) {
        client_rdma_conn_close(rc);
        return GDRKV_E_INTERNAL;
    }
    size_t body_len = rdma_endpoint_encode(&mine, req + GK_HDR_SIZE);
    struct gk_hdr h = {.magic = GK_MAGIC, .version = GK_VERSION, .opcode = GK_OP_RDMA_HELLO,
                       .body_len = (uint32_t)body_len, .req_id = 1};
    gk_hdr_encode(&h, req);
    *req_len = GK_HDR_SIZE + body_len;
    *out = rc;
    return 0;
}

int client_rdma_conn_answer(struct client_rdma_conn *rc, int32_t status, const uint8_t *body,
                            size_t len)
{
    struct rdma_endpoint peer;
    if (status) {
        GK_DEBUG("rdma hello refused (%s): %.*s", gdrkv_strerror(status),
                 (int)GK_MIN(len, (size_t)200), (const char *)body);
        /* UNSUPPORTED: the server has no rdma; the socket is still fine. */
        return status == GDRKV_E_UNSUPPORTED ? GDRKV_E_UNSUPPORTED : GDRKV_E_UNAVAILABLE;
    }
    int err = take_answer(rc, body, len, &peer);
    if (err == 0 && rdma_qps_connect(rc->owner->dev, &rc->qps, &peer, 1))
        err = GDRKV_E_UNAVAILABLE;
    return err;
}

void client_rdma_conn_close(struct client_rdma_conn *rc)
{
    if (!rc)
        return;
    struct rdma_dev *d = rc->owner->dev;
    if (rc->qps.n || rc->qps.cq) {
        /* Stop the NIC before anything it could still be moving is freed
         * or handed back to the caller. */
        rdma_qps_kill(d, &rc->qps);
        rdma_qps_destroy(d, &rc->qps);
    }
    if (rc->running)
        rdma_post_end(&rc->run, 1);     /* the QPs are gone: nothing is in flight */
    if (rc->flusher)
        rdma_flusher_free(d, rc->flusher);
    rdma_pieces_free(&rc->pieces);
    free(rc->regions);
    free(rc);
}

/* ------------------------------------------------------------ frames */

int client_rdma_frame_ok(struct client_rdma_conn *rc, const struct client_batch *b,
                         const struct client_frame *f)
{
    struct client_rdma *r = rc->owner;
    int ok = 1;
    pthread_mutex_lock(&r->lock);
    for (uint32_t p = f->first; ok && p < f->first + f->count; p++) {
        uint32_t i = b->index[p];
        for (uint32_t s = 0; ok && s < b->seg_counts[i]; s++) {
            uint64_t seg = b->first_seg[p] + s;
            ok = b->seg_lens[seg] == 0 || mr_of(r, b->seg_ptrs[seg], b->seg_lens[seg]);
        }
    }
    pthread_mutex_unlock(&r->lock);
    if (!ok)
        gk_counter_add(&r->fallback_frames, 1);
    return ok;
}

/* The region of the server's pool holding [off, off + len). */
static const struct rdma_region *region_of(const struct client_rdma_conn *rc, uint64_t off,
                                           uint64_t len)
{
    uint32_t lo = 0, hi = rc->nregions;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        const struct rdma_region *g = &rc->regions[mid];
        if (off < g->pool_off)
            hi = mid;
        else if (off - g->pool_off >= g->len)
            lo = mid + 1;
        else
            return len <= g->len - (off - g->pool_off) ? g : NULL;
    }
    return NULL;
}

/* A piece of the walk becomes one SGE-sized piece (or several, past the
 * 1 GiB an SGE may carry). The caller holds the owner's lock (lkeys). */
static int add_piece(void *arg, uint32_t p, uint64_t seg, uint64_t seg_off, uint64_t pool_off,
                     uint64_t len)
{
    struct client_rdma_conn *rc = arg;
    /* seg_ptrs is the caller's address, GPU memory included (its MR is a
     * dma-buf one). */
    uint64_t seg_addr = rc->batch->seg_ptrs[seg] + seg_off;
    const struct rdma_region *g = region_of(rc, pool_off, len);
    const struct client_mr *m = mr_of(rc->owner, seg_addr, len);
    struct rdma_piece piece = {.key = p};
    if (!g || !m) {
        /* A chunk outside the server's regions is the server's fault; a
         * segment no MR covers any more (unregistered meanwhile), ours. */
        rc->plan_err = !g ? GDRKV_E_PROTOCOL : GDRKV_E_INVALID;
        return -1;
    }
    piece.lkey = m->lkey;
    piece.rkey = g->rkey;
    if (m->flush && len > 0) {
        struct rdma_flush *fl = &rc->flush;
        uint32_t i = 0;
        while (i < fl->n && fl->rkey[i] != m->rkey)
            i++;
        /* More MRs than slots: the last slot's MR stands for the rest,
         * which is right when they are on the same GPU. */
        i = GK_MIN(i, (uint32_t)RDMA_FLUSH_MAX - 1);
        fl->addr[i] = seg_addr;
        fl->rkey[i] = m->rkey;
        fl->n = GK_MAX(fl->n, i + 1);
    }
    while (len > 0) {
        piece.len = (uint32_t)GK_MIN(len, 1ull << 30);
        piece.local = seg_addr;
        piece.remote = g->addr + (pool_off - g->pool_off);
        if (rdma_pieces_add(&rc->pieces, &piece)) {
            rc->plan_err = GDRKV_E_INTERNAL;
            return -1;
        }
        seg_addr += piece.len, pool_off += piece.len, len -= piece.len;
    }
    return 0;
}

static void fail_key(void *arg, uint32_t p, int err)
{
    struct client_rdma_conn *rc = arg;
    struct client_batch *b = rc->batch;
    if (rc->flags)
        rc->flags[p - rc->frame->first] = 0;
    b->results[b->index[p]] = err;
}

/* Plans the frame's pieces and starts their run, which the connection's
 * poll loop steps (client_rdma_poll) and ends (client_rdma_end). 0, or an
 * error before anything was posted. */
static int run_start(struct client_rdma_conn *rc, int opcode, const uint8_t *lists, size_t len,
                     struct client_batch *b, const struct client_frame *f,
                     const uint8_t *listed, const uint64_t *lens)
{
    struct client_rdma *r = rc->owner;
    rdma_pieces_reset(&rc->pieces);
    rc->flush.n = 0;
    rc->batch = b;
    rc->frame = f;
    pthread_mutex_lock(&r->lock);
    int rc_plan = client_chunks_walk(lists, len, rc->pool_size, b, f->first, f->count, listed,
                                     lens, add_piece, rc);
    pthread_mutex_unlock(&r->lock);
    if (rc_plan == GDRKV_E_INTERNAL && rc->plan_err == GDRKV_E_INVALID) {
        /* Nothing was posted: the frame's keys fail, the connection stays. */
        for (uint32_t p = f->first; p < f->first + f->count; p++)
            if (b->results[b->index[p]] >= 0)
                b->results[b->index[p]] = GDRKV_E_INVALID;
        if (rc->flags)
            memset(rc->flags, 0, f->count);
        rc->flags = NULL;
        return 0;
    }
    if (rc_plan) {
        rc->flags = NULL;
        return rc_plan == GDRKV_E_INTERNAL ? rc->plan_err : rc_plan;
    }

    /* READs into memory a GPU before Hopper reads: their bytes are the
     * GPU's only after a flush READ of the destination, which the run posts
     * once they are confirmed and takes in the same completion loop. */
    struct rdma_flush *flush = NULL;
    if (opcode == IBV_WR_RDMA_READ && rc->flush.n) {
        if (!rc->flusher)
            rc->flusher = rdma_flusher_new(r->dev);
        if (rc->flusher) {
            flush = &rc->flush;
            rdma_flusher_target(rc->flusher, flush);
            flush->done = 0;
            flush->err = 0;
        }
    }
    rc->run_stats = (struct rdma_post_stats){0};
    rdma_post_start(&rc->run, &rc->qps, opcode, &rc->pieces, flush, fail_key, rc,
                    &rc->run_stats);
    rc->running = 1;
    return 0;
}

int client_rdma_poll(struct client_rdma_conn *rc, uint64_t deadline_ns)
{
    if (!rc->running || rdma_post_step(&rc->run))
        return 1;
    if (rc->run.idle && gk_now_ns() >= deadline_ns) {
        rc->timed_out = 1;
        return 1;
    }
    return 0;
}

int client_rdma_end(struct client_rdma_conn *rc)
{
    struct client_rdma *r = rc->owner;
    struct client_batch *b = rc->batch;
    const struct client_frame *f = rc->frame;
    if (!rc->running)
        return 0;
    int opcode = rc->run.opcode;
    struct rdma_flush *flush = rc->run.flush;
    const struct rdma_post_stats *st = &rc->run_stats;
    int err = rdma_post_end(&rc->run, rc->timed_out);
    rc->running = 0;
    rc->timed_out = 0;
    rc->flags = NULL;
    if (opcode == IBV_WR_RDMA_READ && rc->flush.n && err != GDRKV_E_TIMEOUT &&
        (!flush || flush->done < flush->n)) {
        int ferr = !flush ? GDRKV_E_UNAVAILABLE : flush->err ? flush->err : GDRKV_E_INTERNAL;
        GK_WARN("rdma: flush READ failed (%s)", gdrkv_strerror(ferr));
        for (uint32_t p = f->first; p < f->first + f->count; p++)
            if (b->results[b->index[p]] >= 0)
                b->results[b->index[p]] = ferr;
        if (rc->flusher) {
            rdma_flusher_free(r->dev, rc->flusher);
            rc->flusher = NULL;
        }
    }
    if (flush)
        gk_counter_add(&r->flush_reads, flush->done + (flush->done < flush->n));
    gk_counter_add(opcode == IBV_WR_RDMA_READ ? &r->read_frames : &r->write_frames, 1);
    gk_counter_add(&r->work_requests, st->wrs);
    gk_counter_add(&r->doorbells, st->posts);
    gk_counter_add(&r->completions, st->completions);
    gk_counter_add(&r->bytes, st->bytes);
    return err;
}

/* GPU memory the NIC reads or writes: only after the work queued before
 * the call on the caller's stream (or the legacy default stream) is done,
 * as the staged transports order their copies. On failure the frame's keys
 * fail (INTERNAL) and 0 is returned. */
static int stream_ordered(struct client_batch *b, const struct client_frame *f)
{
    if (!b->gpu || gpu_call_order(b->gpu) == 0)
        return 1;
    for (uint32_t p = f->first; p < f->first + f->count; p++)
        if (b->results[b->index[p]] >= 0)
            b->results[b->index[p]] = GDRKV_E_INTERNAL;
    return 0;
}

int client_rdma_read(struct client_rdma_conn *rc, const uint8_t *lists, size_t len,
                     struct client_batch *b, const struct client_frame *f)
{
    rc->running = 0;
    if (!stream_ordered(b, f))
        return 0;
    return run_start(rc, IBV_WR_RDMA_READ, lists, len, b, f, NULL, b->got);
}

int client_rdma_write(struct client_rdma_conn *rc, const uint8_t *lists, size_t len,
                      struct client_batch *b, const struct client_frame *f, uint8_t *flags)
{
    rc->running = 0;
    if (!stream_ordered(b, f)) {
        for (uint32_t p = f->first; p < f->first + f->count; p++)
            flags[p - f->first] = 0;
        return 0;
    }
    rc->flags = flags;
    return run_start(rc, IBV_WR_RDMA_WRITE, lists, len, b, f, flags, b->sizes);
}


/* ------------------------------------------------------------ exchanges */

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
        return client_frame_broken(c, "bad chunk lists");
    if (rc)
        c->why = rc == GDRKV_E_TIMEOUT ? "rdma completions did not come in time" : "rdma failed";
    return rc;
}

/* The LEASE answered over rdma: starts the READs of the objects into the
 * caller's segments (the release follows; nothing to READ, nothing to
 * confirm). */
static int read_leased(struct client_conn *c)
{
    uint64_t bytes;
    size_t len;

    int rc = client_frame_take_results(c, &bytes);
    if (rc || bytes == 0)
        return rc;
    const uint8_t *lists = client_frame_chunk_lists(c, &len);
    rc = client_rdma_read(c->rdma, lists, len, c->batch, c->frame);
    if (rc)
        return rdma_outcome(c, rc);
    c->phase = CLIENT_CONN_WAIT;
    return 0;
}

/* The READs are over: the lease ends. */
static int read_waited(struct client_conn *c)
{
    int rc = rdma_outcome(c, client_rdma_end(c->rdma));
    if (rc == 0)
        client_frame_send_followup(c, c->release, 0, 0, 0);
    return rc;
}

/* The RESERVE answered over rdma: starts the WRITEs of the values of the
 * reserved keys (COMMIT follows). */
static int write_reserved(struct client_conn *c)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;
    const uint8_t *lists;
    uint8_t *flags;
    size_t len;

    int rc = client_frame_take_reservations(c, &flags, &lists, &len);
    if (rc)
        return rc;
    rc = client_rdma_write(c->rdma, lists, len, b, f, flags);
    if (rc)
        return rdma_outcome(c, rc);
    c->phase = CLIENT_CONN_WAIT;
    return 0;
}

/* The WRITEs are over: COMMIT goes for the keys whose bytes all arrived. */
static int write_waited(struct client_conn *c)
{
    const struct client_frame *f = c->frame;
    const uint8_t *flags = c->commit + GK_HDR_SIZE;

    int rc = rdma_outcome(c, client_rdma_end(c->rdma));
    if (rc)
        return rc;
    /* Reserved keys COMMIT drops make the server stop this connection's
     * QPs (it can't know no WRITE is still coming): don't reuse it. */
    for (uint32_t k = 0; k < f->count; k++) {
        struct gk_result r = client_frame_key_result(c, k);
        if (r.status == 0 && !flags[k])
            c->rdma_broken = 1;
    }
    client_frame_send_followup(c, c->commit, f->count, f->count, 0);
    return 0;
}

/* The frame's READs or WRITEs, stepped by the poll loop (CLIENT_CONN_WAIT). */
static int poll_run(struct client_conn *c)
{
    return client_rdma_poll(c->rdma, c->batch->deadline_ns);
}

/* rdma GET into registered memory: READ by the NIC, then confirmed. */
static const struct client_exchange rdma_lease = {
    .request = GK_OP_LEASE, .answer = read_leased,
    .followup = GK_OP_RELEASE, .followup_answer = client_frame_end_lease,
    .poll = poll_run, .waited = read_waited,
};

/* rdma PUT from registered memory: WRITTEN into reserved chunks, then committed. */
static const struct client_exchange rdma_reserve = {
    .request = GK_OP_RESERVE, .answer = write_reserved,
    .followup = GK_OP_COMMIT, .followup_answer = client_frame_take_commit,
    .poll = poll_run, .waited = write_waited,
};

const struct client_exchange *client_rdma_exchange(const struct client_conn *c)
{
    uint8_t op = c->batch->opcode;

    if ((op == GK_OP_GET || op == GK_OP_PUT) &&
        client_rdma_frame_ok(c->rdma, c->batch, c->frame))
        return op == GK_OP_GET ? &rdma_lease : &rdma_reserve;
    return NULL;
}
