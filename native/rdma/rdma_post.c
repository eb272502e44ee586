/*
 * rdma_post.c - see rdma_post.h.
 */
#include "rdma_post.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/grow.h"
#include "gdrkv.h"
#include "common/log.h"

int rdma_pieces_add(struct rdma_pieces *p, const struct rdma_piece *piece)
{
    if (gk_grow(&p->list, &p->cap, (size_t)p->count + 1, sizeof *p->list, 256) < 0)
        return -1;
    p->list[p->count++] = *piece;
    return 0;
}

/* Idle connections keep a small list only. */
void rdma_pieces_reset(struct rdma_pieces *p)
{
    p->count = 0;
    if (p->cap > 4096)
        rdma_pieces_free(p);
}

void rdma_pieces_free(struct rdma_pieces *p)
{
    free(p->list);
    p->list = NULL;
    p->count = p->cap = 0;
}

#define RDMA_POST_MAX_SGE 16
#define RDMA_POLL_BATCH 32

static int error_of(enum ibv_wc_status s)
{
    switch (s) {
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
        return GDRKV_E_INVALID;         /* the caller's memory, not the server */
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
        return GDRKV_E_PROTOCOL;        /* the server described memory it doesn't grant */
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_WR_FLUSH_ERR:
        return GDRKV_E_UNAVAILABLE;
    default:
        return GDRKV_E_INTERNAL;
    }
}

static void fail_wr(struct rdma_run *r, const struct rdma_wr_rec *w, int err)
{
    for (uint32_t k = 0; k < w->nsge; k++)
        r->fail(r->arg, r->p->list[w->first + k].key, err);
}

/* A QP broke: what it had not confirmed, and what it never posted, fails. */
static void qp_dies(struct rdma_run *r, uint32_t j, int err)
{
    struct rdma_qp_run *qr = &r->qps[j];
    for (uint32_t s = qr->confirmed; s < qr->total; s++)
        fail_wr(r, &r->recs[qr->wrs[s]], err);
    qr->dead = 1;
    qr->posted = qr->confirmed = qr->total;
    r->broken = 1;
}

/* Pieces -> WRs: merges a piece into the previous WR when it continues
 * the same remote range of the same key. */
static int plan(struct rdma_run *r)
{
    const struct rdma_piece *pc = r->p->list;
    r->recs = malloc((size_t)GK_MAX(r->p->count, 1u) * sizeof *r->recs);
    if (!r->recs)
        return -1;
    r->nrecs = 0;
    for (uint32_t i = 0; i < r->p->count; i++) {
        struct rdma_wr_rec *last = r->nrecs ? &r->recs[r->nrecs - 1] : NULL;
        if (last && last->nsge < r->max_sge) {
            const struct rdma_piece *prev = &pc[last->first + last->nsge - 1];
            uint64_t wr_len = 0;
            for (uint32_t k = 0; k < last->nsge; k++)
                wr_len += pc[last->first + k].len;
            if (prev->key == pc[i].key && prev->rkey == pc[i].rkey &&
                prev->remote + prev->len == pc[i].remote && wr_len + pc[i].len <= (1u << 30)) {
                last->nsge++;
                continue;
            }
        }
        r->recs[r->nrecs++] = (struct rdma_wr_rec){.first = i, .nsge = 1};
    }
    /* Blocks of `chain` WRs per QP, round-robin, so each post is one chain. */
    uint32_t n = r->q->n;
    uint32_t *order = malloc((size_t)GK_MAX(r->nrecs, 1u) * sizeof *order);
    if (!order)
        return -1;
    uint32_t counts[RDMA_MAX_QPS] = {0};
    for (uint32_t i = 0; i < r->nrecs; i++) {
        r->recs[i].qp = (uint8_t)((i / r->chain) % n);
        counts[r->recs[i].qp]++;
    }
    uint32_t at = 0;
    for (uint32_t j = 0; j < n; j++) {
        r->qps[j].wrs = order + at;
        at += counts[j];
    }
    for (uint32_t i = 0; i < r->nrecs; i++) {
        struct rdma_qp_run *qr = &r->qps[r->recs[i].qp];
        r->recs[i].seq = qr->total;
        qr->wrs[qr->total++] = i;
    }
    return 0;
}

/* Posts the next chain of QP j, as much as its send queue has room for. */
static void post_chain(struct rdma_run *r, uint32_t j)
{
    struct rdma_qp_run *qr = &r->qps[j];
    uint32_t room = r->q->sq_depth - (qr->posted - qr->confirmed);
    uint32_t count = GK_MIN(GK_MIN(r->chain, qr->total - qr->posted), room);
    if (count == 0)
        return;

    struct ibv_send_wr wrs[RDMA_POST_CHAIN];
    struct ibv_sge sges[RDMA_POST_CHAIN * RDMA_POST_MAX_SGE];
    uint32_t nsge = 0;
    for (uint32_t k = 0; k < count; k++) {
        uint32_t s = qr->posted + k;
        const struct rdma_wr_rec *w = &r->recs[qr->wrs[s]];
        const struct rdma_piece *pc = &r->p->list[w->first];
        struct ibv_send_wr *wr = &wrs[k];
        memset(wr, 0, sizeof *wr);
        wr->wr_id = qr->wrs[s];
        wr->sg_list = &sges[nsge];
        wr->num_sge = w->nsge;
        wr->opcode = (enum ibv_wr_opcode)r->opcode;
        wr->wr.rdma.remote_addr = pc[0].remote;
        wr->wr.rdma.rkey = pc[0].rkey;
        for (uint32_t g = 0; g < w->nsge; g++) {
            sges[nsge++] = (struct ibv_sge){.addr = pc[g].local, .length = pc[g].len,
                                            .lkey = pc[g].lkey};
            r->stats->bytes += pc[g].len;
        }
        if (++qr->unsignalled >= r->sig_every || s + 1 == qr->total) {
            wr->send_flags = IBV_SEND_SIGNALED;
            qr->unsignalled = 0;
        }
        wr->next = k + 1 < count ? &wrs[k + 1] : NULL;
    }
    struct ibv_qp *qp = r->q->qp[j];
    struct ibv_send_wr *bad = NULL;
    int rc = gk_post_send(qp, wrs, &bad);
    r->stats->posts++;
    if (rc) {
        /* The WRs before *bad were posted and may still run: nothing of
         * this QP can be vouched for, and the connection must go. */
        qp_dies(r, j, GDRKV_E_INTERNAL);
        r->lost = 1;
        return;
    }
    r->stats->wrs += count;
    qr->posted += count;
}

static uint32_t qp_index(const struct rdma_run *r, uint32_t qp_num)
{
    for (uint32_t j = 0; j < r->q->n; j++)
        if (r->q->qp[j]->qp_num == qp_num)
            return j;
    return UINT32_MAX;
}

/* Returns the completions taken, or -1 when the CQ itself failed. */
static int poll_completions(struct rdma_run *r)
{
    struct ibv_wc wc[RDMA_POLL_BATCH];
    struct ibv_cq *cq = r->q->cq;
    int n = gk_poll_cq(cq, RDMA_POLL_BATCH, wc);
    if (n < 0)
        return -1;
    r->stats->completions += (uint64_t)n;
    for (int i = 0; i < n; i++) {
        uint32_t j = qp_index(r, wc[i].qp_num);
        if (j == UINT32_MAX || wc[i].wr_id >= r->nrecs)
            continue;           /* not this run's: a QP of ours only carries our WRs */
        struct rdma_qp_run *qr = &r->qps[j];
        if (qr->dead)
            continue;           /* the flush of a QP already failed */
        const struct rdma_wr_rec *w = &r->recs[wc[i].wr_id];
        if (wc[i].status == IBV_WC_SUCCESS) {
            qr->confirmed = GK_MAX(qr->confirmed, w->seq + 1);
            continue;
        }
        GK_WARN("rdma: %s on QP %u completed with status %d", r->opcode == IBV_WR_RDMA_READ ?
                "READ" : "WRITE", wc[i].qp_num, (int)wc[i].status);
        /* An RC queue completes in order: the WRs before this one are done.
         * This one carries its own error, the ones after it were flushed. */
        qr->confirmed = GK_MAX(qr->confirmed, w->seq);
        qp_dies(r, j, GDRKV_E_UNAVAILABLE);
        fail_wr(r, w, error_of(wc[i].status));
    }
    return n;
}

static int finished(const struct rdma_run *r)
{
    for (uint32_t j = 0; j < r->q->n; j++)
        if (r->qps[j].confirmed < r->qps[j].total)
            return 0;
    return 1;
}

/* The next flush READ (its QP takes one at a time). The flushes are
 * counted by the caller (rdma_flush_reads), not with the data's WRs. */
static int post_flush(struct rdma_flush *f)
{
    struct ibv_sge sge = {.addr = f->scratch, .length = 1, .lkey = f->lkey};
    struct ibv_send_wr wr = {.wr_id = f->done, .sg_list = &sge, .num_sge = 1,
                             .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
                             .wr = {.rdma = {.remote_addr = f->addr[f->done],
                                             .rkey = f->rkey[f->done]}}};
    struct ibv_send_wr *bad = NULL;
    return gk_post_send(f->qp, &wr, &bad);
}

/* Takes the flush READ's completion, if it came: 1, 0 (not yet), or a
 * negative error in f->err. */
static int poll_flush(struct rdma_flush *f)
{
    struct ibv_wc wc;
    int n = gk_poll_cq(f->cq, 1, &wc);
    if (n <= 0) {
        f->err = n;
        return n;
    }
    if (wc.status != IBV_WC_SUCCESS) {
        GK_WARN("rdma: flush READ completed with status %d", (int)wc.status);
        f->err = GDRKV_E_UNAVAILABLE;
        return f->err;
    }
    f->done++;
    return 1;
}

int rdma_post_start(struct rdma_run *r, struct rdma_qps *q, int opcode,
                    const struct rdma_pieces *p, struct rdma_flush *flush, rdma_fail_fn fail,
                    void *arg, struct rdma_post_stats *stats)
{
    *r = (struct rdma_run){
        .q = q, .opcode = opcode, .p = p, .flush = flush, .fail = fail, .arg = arg,
        .stats = stats,
        .max_sge = GK_MIN(GK_MAX(opcode == IBV_WR_RDMA_READ ? q->max_sge_rd : q->max_sge, 1u),
                          (uint32_t)RDMA_POST_MAX_SGE),
    };
    r->chain = GK_MAX(GK_MIN((uint32_t)RDMA_POST_CHAIN, q->sq_depth / 2), 1u);
    r->sig_every = GK_MAX(q->sq_depth / 2, 1u);
    if (p->count == 0) {
        r->over = 1;
        return 0;
    }
    if (plan(r)) {
        for (uint32_t i = 0; i < p->count; i++)
            fail(arg, p->list[i].key, GDRKV_E_INTERNAL);
        r->over = 1;
    }
    return 0;
}

int rdma_post_step(struct rdma_run *r)
{
    struct rdma_flush *flush = r->flush;
    int n = 0;

    if (r->over)
        return 1;
    if (!finished(r)) {
        for (uint32_t j = 0; j < r->q->n; j++)
            if (!r->qps[j].dead && r->qps[j].posted < r->qps[j].total)
                post_chain(r, j);
        n = poll_completions(r);
        if (n < 0) {
            for (uint32_t j = 0; j < r->q->n; j++)
                if (!r->qps[j].dead)
                    qp_dies(r, j, GDRKV_E_INTERNAL);
            r->lost = 1;
            r->over = 1;
        }
    } else if (flush && !r->lost && flush->done < flush->n && !flush->err) {
        /* Every data READ is confirmed: now the flushes, in this loop. */
        if (!r->flushing && post_flush(flush)) {
            flush->err = GDRKV_E_UNAVAILABLE;
            r->over = 1;
            return 1;
        }
        r->flushing = 1;
        n = poll_flush(flush);
        r->over = n < 0;
        if (n > 0)
            r->flushing = 0;
    } else {
        r->over = 1;
    }
    r->idle = !r->over && n == 0;
    return r->over;
}

int rdma_post_end(struct rdma_run *r, int timed_out)
{
    int rc = 0;
    if (timed_out && !r->over) {
        rc = GDRKV_E_TIMEOUT;
        if (r->flushing)
            r->flush->err = GDRKV_E_TIMEOUT;
    }
    free(r->qps[0].wrs);
    free(r->recs);
    r->qps[0].wrs = NULL;
    r->recs = NULL;
    return rc ? rc : r->lost ? GDRKV_E_INTERNAL : r->broken ? GDRKV_E_UNAVAILABLE : 0;
}
