/*
 * cq.c - completion queues. poll_cq is where work happens: it first runs
 * the queued WRs of every QP that reports to this CQ (hardware would have
 * run them by now), then hands out completions. A completion handed out
 * retires its send-queue slot and every earlier one of its QP, which is
 * what frees room for unsignalled WRs.
 */
#include "sv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                             struct ibv_comp_channel *channel, int comp_vector)
{
    /* No completion channels: ibv_create_comp_channel is not provided. */
    if (!ctx || cqe < 1 || cqe > sv_config()->max_cqe || channel || comp_vector != 0) {
        errno = EINVAL;
        return NULL;
    }
    struct sv_cq *cq = calloc(1, sizeof *cq);
    struct sv_cqe *ring = calloc((size_t)cqe, sizeof *ring);
    if (!cq || !ring) {
        free(cq);
        free(ring);
        errno = ENOMEM;
        return NULL;
    }
    cq->ring = ring;
    cq->size = cqe;
    pthread_mutex_init(&cq->lock, NULL);
    cq->ibv.context = ctx;
    cq->ibv.cq_context = cq_context;
    cq->ibv.cqe = cqe;
    pthread_mutex_init(&cq->ibv.mutex, NULL);
    pthread_cond_init(&cq->ibv.cond, NULL);
    return &cq->ibv;
}

int ibv_destroy_cq(struct ibv_cq *ibv)
{
    if (!ibv)
        return EINVAL;
    struct sv_cq *cq = (struct sv_cq *)ibv;
    pthread_mutex_lock(&cq->lock);
    int busy = cq->qps != NULL;
    pthread_mutex_unlock(&cq->lock);
    if (busy)
        return EBUSY;
    pthread_mutex_destroy(&cq->lock);
    pthread_mutex_destroy(&cq->ibv.mutex);
    pthread_cond_destroy(&cq->ibv.cond);
    free(cq->ring);
    free(cq);
    return 0;
}

/* CQ locked. Past its size the CQ is broken for good, as on hardware. */
void sv_cq_push(struct sv_cq *cq, struct sv_qp *qp, uint64_t seq, const struct ibv_wc *wc)
{
    if (cq->overflowed)
        return;
    if (cq->count == cq->size) {
        cq->overflowed = 1;
        sv_count(SVC_CQ_OVERFLOWS, 1);
        return;
    }
    struct sv_cqe *e = &cq->ring[(cq->head + cq->count) % cq->size];
    e->wc = *wc;
    e->qp = qp;
    e->seq = seq;
    cq->count++;
    sv_count(SVC_COMPLETIONS, 1);
    if (wc->status != IBV_WC_SUCCESS)
        sv_count(SVC_ERROR_COMPLETIONS, 1);
}

static struct sv_qp *next_of(struct sv_cq *cq, struct sv_qp *qp)
{
    return qp->scq == cq ? qp->next_scq : qp->next_rcq;
}

int sv_poll_cq(struct ibv_cq *ibv, int num_entries, struct ibv_wc *wc)
{
    struct sv_cq *cq = (struct sv_cq *)ibv;
    if (!cq || num_entries < 0 || (num_entries > 0 && !wc))
        return -1;
    sv_count(SVC_POLL_CALLS, 1);
    pthread_mutex_lock(&cq->lock);
    for (struct sv_qp *qp = cq->qps; qp && !cq->overflowed; qp = next_of(cq, qp)) {
        pthread_mutex_lock(&qp->lock);
        if (qp->scq == cq)
            sv_qp_run(qp, cq);
        if (qp->rcq == cq)
            sv_qp_flush_rq(qp, cq);
        pthread_mutex_unlock(&qp->lock);
    }
    if (cq->overflowed) {
        pthread_mutex_unlock(&cq->lock);
        return -1;
    }
    int n = 0;
    while (n < num_entries && cq->count > 0) {
        struct sv_cqe *e = &cq->ring[cq->head];
        wc[n++] = e->wc;
        if (e->seq != UINT64_MAX) {
            uint64_t done = e->seq + 1;
            uint64_t cur = atomic_load(&e->qp->retired);
            if (done > cur)
                atomic_store(&e->qp->retired, done);
        }
        cq->head = (cq->head + 1) % cq->size;
        cq->count--;
    }
    pthread_mutex_unlock(&cq->lock);
    sv_count(SVC_CQES_POLLED, (uint64_t)n);
    return n;
}

int sv_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    (void)solicited_only;             /* no completion channels, so no events */
    return cq ? 0 : EINVAL;
}
