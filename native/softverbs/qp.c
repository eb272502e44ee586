/*
 * qp.c - RC queue pairs: creation with caps checked against the device,
 * the verbs state machine with the attr_mask each transition requires and
 * allows, and the QP's entry in the registry (state, remote QPN, read depth
 * and access flags), which is what initiators in other processes check.
 */
#include "sv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- create */

static void cq_link(struct sv_qp *qp)
{
    pthread_mutex_lock(&qp->scq->lock);
    qp->next_scq = qp->scq->qps;
    qp->scq->qps = qp;
    pthread_mutex_unlock(&qp->scq->lock);
    if (qp->rcq != qp->scq) {
        pthread_mutex_lock(&qp->rcq->lock);
        qp->next_rcq = qp->rcq->qps;
        qp->rcq->qps = qp;
        pthread_mutex_unlock(&qp->rcq->lock);
    }
}

static void qp_free(struct sv_qp *qp)
{
    free(qp->sq);
    free(qp->sq_sge);
    free(qp->sq_inline);
    free(qp->rq);
    free(qp->segs);
    free(qp->bounce);
    free(qp);
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *ibv_pd, struct ibv_qp_init_attr *init)
{
    const struct sv_config *cf = sv_config();
    if (!ibv_pd || !init || !init->send_cq || !init->recv_cq || init->srq) {
        errno = EINVAL;
        return NULL;
    }
    if (init->qp_type != IBV_QPT_RC) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    struct ibv_qp_cap *cap = &init->cap;
    if (cap->max_send_wr > (uint32_t)cf->max_qp_wr || cap->max_recv_wr > (uint32_t)cf->max_qp_wr ||
        cap->max_send_sge > (uint32_t)cf->max_sge || cap->max_recv_sge > (uint32_t)cf->max_sge ||
        cap->max_inline_data > SV_MAX_INLINE || init->send_cq->context != ibv_pd->context ||
        init->recv_cq->context != ibv_pd->context) {
        errno = EINVAL;
        return NULL;
    }
    struct sv_qp *qp = calloc(1, sizeof *qp);
    if (!qp) {
        errno = ENOMEM;
        return NULL;
    }
    qp->cap = *cap;
    size_t slots = cap->max_send_wr ? cap->max_send_wr : 1;
    qp->sq = calloc(slots, sizeof *qp->sq);
    qp->sq_sge = calloc(slots * (cap->max_send_sge ? cap->max_send_sge : 1), sizeof *qp->sq_sge);
    qp->sq_inline = cap->max_inline_data ? calloc(slots, cap->max_inline_data) : NULL;
    qp->rq = calloc(cap->max_recv_wr ? cap->max_recv_wr : 1, sizeof *qp->rq);
    qp->segs = calloc((size_t)cf->max_sge + 1, sizeof *qp->segs);
    if (!qp->sq || !qp->sq_sge || (cap->max_inline_data && !qp->sq_inline) || !qp->rq ||
        !qp->segs) {
        qp_free(qp);
        errno = ENOMEM;
        return NULL;
    }
    qp->slot = sv_reg_qp_claim();
    if (qp->slot < 0) {
        qp_free(qp);
        errno = ENOMEM;
        return NULL;
    }
    qp->pd = (struct sv_pd *)ibv_pd;
    atomic_fetch_add(&qp->pd->users, 1);
    qp->scq = (struct sv_cq *)init->send_cq;
    qp->rcq = (struct sv_cq *)init->recv_cq;
    qp->sq_sig_all = init->sq_sig_all;
    pthread_mutex_init(&qp->lock, NULL);

    qp->ibv.context = ibv_pd->context;
    qp->ibv.qp_context = init->qp_context;
    qp->ibv.pd = ibv_pd;
    qp->ibv.send_cq = init->send_cq;
    qp->ibv.recv_cq = init->recv_cq;
    qp->ibv.handle = (uint32_t)qp->slot;
    qp->ibv.qp_num = sv_reg_qp_publish(qp->slot, qp->pd->id);
    qp->ibv.state = IBV_QPS_RESET;
    qp->ibv.qp_type = IBV_QPT_RC;
    pthread_mutex_init(&qp->ibv.mutex, NULL);
    pthread_cond_init(&qp->ibv.cond, NULL);
    cq_link(qp);
    return &qp->ibv;
}

/* ------------------------------------------------------------ destroy */

static void cq_unlink(struct sv_cq *cq, struct sv_qp *qp)
{
    struct sv_qp **pp = &cq->qps;
    while (*pp && *pp != qp)
        pp = (*pp)->scq == cq ? &(*pp)->next_scq : &(*pp)->next_rcq;
    if (*pp)
        *pp = qp->scq == cq ? qp->next_scq : qp->next_rcq;
    /* Its completions go too (as drivers clean the CQ): nothing may point
     * at a freed QP. */
    int kept = 0;
    for (int i = 0; i < cq->count; i++) {
        struct sv_cqe *e = &cq->ring[(cq->head + i) % cq->size];
        if (e->qp != qp)
            cq->ring[(cq->head + kept++) % cq->size] = *e;
    }
    cq->count = kept;
}

int ibv_destroy_qp(struct ibv_qp *ibv)
{
    if (!ibv)
        return EINVAL;
    struct sv_qp *qp = (struct sv_qp *)ibv;
    sv_reg_qp_release(qp->slot);
    /* CQ locks in address order when there are two. */
    struct sv_cq *a = qp->scq, *b = qp->rcq;
    if (b < a) {
        struct sv_cq *t = a;
        a = b;
        b = t;
    }
    pthread_mutex_lock(&a->lock);
    if (b != a)
        pthread_mutex_lock(&b->lock);
    cq_unlink(qp->scq, qp);
    if (qp->rcq != qp->scq)
        cq_unlink(qp->rcq, qp);
    if (b != a)
        pthread_mutex_unlock(&b->lock);
    pthread_mutex_unlock(&a->lock);

    atomic_fetch_sub(&qp->pd->users, 1);
    pthread_mutex_destroy(&qp->lock);
    pthread_mutex_destroy(&qp->ibv.mutex);
    pthread_cond_destroy(&qp->ibv.cond);
    qp_free(qp);
    return 0;
}

/* -------------------------------------------------------------- modify */

/* QP locked. Keeps the local and the registry copies of the state equal. */
void sv_qp_set_state(struct sv_qp *qp, enum ibv_qp_state s)
{
    qp->ibv.state = s;
    qp->attr.qp_state = s;
    atomic_store(&sv_reg_qp_slot(qp->slot)->state, (uint32_t)s);
}

struct transition {
    enum ibv_qp_state from, to;
    unsigned required, optional;
};

/* RC transitions and their masks (IBTA 11.2.5 / verbs man page). */
static const struct transition transitions[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
         IBV_QP_MIN_RNR_TIMER,
     IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
         IBV_QP_MAX_QP_RD_ATOMIC,
     IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
         IBV_QP_PATH_MIG_STATE},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0,
     IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
         IBV_QP_MIN_RNR_TIMER},
};

static const struct transition *find_transition(enum ibv_qp_state from, enum ibv_qp_state to)
{
    static const struct transition to_reset = {0, IBV_QPS_RESET, 0, 0};
    static const struct transition to_err = {0, IBV_QPS_ERR, 0, 0};
    if (to == IBV_QPS_RESET)
        return &to_reset;
    if (to == IBV_QPS_ERR)
        return &to_err;
    for (size_t i = 0; i < sizeof transitions / sizeof transitions[0]; i++)
        if (transitions[i].from == from && transitions[i].to == to)
            return &transitions[i];
    return NULL;
}

static int check_av(const struct ibv_ah_attr *av)
{
    if (av->port_num != 0 && av->port_num != SV_PORT)
        return -1;
    if (sv_config()->link_ethernet) {
        /* RoCE has no LIDs: the destination is a GID. */
        static const union ibv_gid zero;
        return av->is_global && memcmp(&av->grh.dgid, &zero, sizeof zero) &&
                       av->grh.sgid_index < sv_gid_count()
                   ? 0
                   : -1;
    }
    if (av->dlid == 0 || av->dlid >= 0xc000)
        return -1;
    return av->is_global && av->grh.sgid_index >= sv_gid_count() ? -1 : 0;
}

static int check_values(const struct ibv_qp_attr *a, unsigned mask)
{
    const struct sv_config *cf = sv_config();
    if ((mask & IBV_QP_PORT) && a->port_num != SV_PORT)
        return -1;
    if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0)
        return -1;
    if ((mask & IBV_QP_ACCESS_FLAGS) &&
        (a->qp_access_flags & ~(unsigned)(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                          IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)))
        return -1;
    if ((mask & IBV_QP_PATH_MTU) &&
        (a->path_mtu < IBV_MTU_256 || (int)a->path_mtu > cf->active_mtu))
        return -1;
    if ((mask & IBV_QP_DEST_QPN) && (a->dest_qp_num == 0 || a->dest_qp_num >> 24))
        return -1;
    if ((mask & IBV_QP_AV) && check_av(&a->ah_attr))
        return -1;
    if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > cf->max_qp_rd_atom)
        return -1;
    if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > cf->max_qp_rd_atom)
        return -1;
    if ((mask & (IBV_QP_RQ_PSN)) && (a->rq_psn >> 24))
        return -1;
    if ((mask & (IBV_QP_SQ_PSN)) && (a->sq_psn >> 24))
        return -1;
    if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31)
        return -1;
    if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7)
        return -1;
    if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7)
        return -1;
    if ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31)
        return -1;
    return 0;
}

static void apply(struct sv_qp *qp, const struct ibv_qp_attr *a, unsigned mask)
{
    struct ibv_qp_attr *s = &qp->attr;
    struct sv_reg_qp *e = sv_reg_qp_slot(qp->slot);
    if (mask & IBV_QP_PORT)
        s->port_num = a->port_num;
    if (mask & IBV_QP_PKEY_INDEX)
        s->pkey_index = a->pkey_index;
    if (mask & IBV_QP_ACCESS_FLAGS) {
        s->qp_access_flags = a->qp_access_flags;
        atomic_store(&e->access, a->qp_access_flags);
    }
    if (mask & IBV_QP_AV)
        s->ah_attr = a->ah_attr;
    if (mask & IBV_QP_PATH_MTU) {
        s->path_mtu = a->path_mtu;
        atomic_store(&e->path_mtu, a->path_mtu);
    }
    if (mask & IBV_QP_DEST_QPN) {
        s->dest_qp_num = a->dest_qp_num;
        atomic_store(&e->remote_qpn, a->dest_qp_num);
    }
    if (mask & IBV_QP_RQ_PSN)
        s->rq_psn = a->rq_psn;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) {
        s->max_dest_rd_atomic = a->max_dest_rd_atomic;
        atomic_store(&e->max_dest_rd_atomic, a->max_dest_rd_atomic);
    }
    if (mask & IBV_QP_MIN_RNR_TIMER)
        s->min_rnr_timer = a->min_rnr_timer;
    if (mask & IBV_QP_SQ_PSN)
        s->sq_psn = a->sq_psn;
    if (mask & IBV_QP_TIMEOUT)
        s->timeout = a->timeout;
    if (mask & IBV_QP_RETRY_CNT)
        s->retry_cnt = a->retry_cnt;
    if (mask & IBV_QP_RNR_RETRY)
        s->rnr_retry = a->rnr_retry;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
        s->max_rd_atomic = a->max_rd_atomic;
}

/* QP locked: back to a fresh QP; queued WRs and receives are dropped. */
static void reset(struct sv_qp *qp)
{
    struct sv_reg_qp *e = sv_reg_qp_slot(qp->slot);
    memset(&qp->attr, 0, sizeof qp->attr);
    atomic_store(&e->remote_qpn, 0);
    atomic_store(&e->path_mtu, 0);
    atomic_store(&e->max_dest_rd_atomic, 0);
    atomic_store(&e->access, 0);
    qp->exec_seq = qp->post_seq;
    atomic_store(&qp->retired, qp->post_seq);
    qp->rq_head = qp->rq_count = 0;
}

int ibv_modify_qp(struct ibv_qp *ibv, struct ibv_qp_attr *attr, int attr_mask)
{
    if (!ibv || !attr)
        return EINVAL;
    struct sv_qp *qp = (struct sv_qp *)ibv;
    unsigned mask = (unsigned)attr_mask;
    pthread_mutex_lock(&qp->lock);
    enum ibv_qp_state cur = qp->ibv.state;
    enum ibv_qp_state to = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
    const struct transition *t = find_transition(cur, to);
    int rc = 0;
    unsigned given = mask & ~(unsigned)IBV_QP_STATE;
    if (!t || (given & t->required) != t->required ||
        (given & ~(t->required | t->optional | IBV_QP_CUR_STATE)) ||
        ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur) ||
        check_values(attr, given)) {
        rc = EINVAL;
    } else if (to == IBV_QPS_RESET) {
        reset(qp);
        sv_qp_set_state(qp, IBV_QPS_RESET);
    } else {
        apply(qp, attr, given);
        sv_qp_set_state(qp, to);
    }
    pthread_mutex_unlock(&qp->lock);
    if (rc)
        errno = rc;
    return rc;
}

int ibv_query_qp(struct ibv_qp *ibv, struct ibv_qp_attr *attr, int attr_mask,
                 struct ibv_qp_init_attr *init)
{
    (void)attr_mask;                    /* everything is cheap to fill in */
    if (!ibv || !attr || !init)
        return EINVAL;
    struct sv_qp *qp = (struct sv_qp *)ibv;
    pthread_mutex_lock(&qp->lock);
    *attr = qp->attr;
    attr->qp_state = qp->ibv.state;
    attr->cur_qp_state = qp->ibv.state;
    attr->cap = qp->cap;
    memset(init, 0, sizeof *init);
    init->qp_context = qp->ibv.qp_context;
    init->send_cq = qp->ibv.send_cq;
    init->recv_cq = qp->ibv.recv_cq;
    init->cap = qp->cap;
    init->qp_type = IBV_QPT_RC;
    init->sq_sig_all = qp->sq_sig_all;
    pthread_mutex_unlock(&qp->lock);
    return 0;
}
