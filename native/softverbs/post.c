/*
 * post.c - ibv_post_send and ibv_post_recv (reached through context ops,
 * as verbs.h's inline functions call them). Posting only validates and
 * queues; nothing moves until the send CQ is polled. What a NIC checks at
 * doorbell time fails the post here; what it finds while executing (keys,
 * ranges, the remote side) becomes an error completion later.
 */
#include "sv.h"

#include <errno.h>
#include <string.h>

static const unsigned SEND_FLAGS_KNOWN =
    IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE;

/* QP locked. 0, or the errno value that fails the post at this WR. */
static int queue_send(struct sv_qp *qp, const struct ibv_send_wr *wr)
{
    enum ibv_qp_state st = qp->ibv.state;
    /* In ERR the WR is accepted and completes as flushed, as hardware does. */
    if (st != IBV_QPS_RTS && st != IBV_QPS_ERR)
        return EINVAL;
    if (wr->opcode != IBV_WR_RDMA_READ && wr->opcode != IBV_WR_RDMA_WRITE)
        return EINVAL;
    if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_send_sge ||
        (wr->num_sge > 0 && !wr->sg_list) || (wr->send_flags & ~SEND_FLAGS_KNOWN))
        return EINVAL;
    int is_inline = (wr->send_flags & IBV_SEND_INLINE) != 0;
    uint64_t inline_len = 0;
    if (is_inline) {
        if (wr->opcode != IBV_WR_RDMA_WRITE)
            return EINVAL;
        for (int i = 0; i < wr->num_sge; i++)
            inline_len += wr->sg_list[i].length;
        if (inline_len > qp->cap.max_inline_data)
            return EINVAL;
    }
    if (qp->post_seq - atomic_load(&qp->retired) >= qp->cap.max_send_wr)
        return ENOMEM;

    uint64_t seq = qp->post_seq;
    size_t idx = seq % qp->cap.max_send_wr;
    struct sv_wr *w = &qp->sq[idx];
    w->wr_id = wr->wr_id;
    w->opcode = wr->opcode;
    w->remote_addr = wr->wr.rdma.remote_addr;
    w->rkey = wr->wr.rdma.rkey;
    w->num_sge = wr->num_sge;
    w->signaled = qp->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
    w->is_inline = is_inline;
    w->inline_len = (uint32_t)inline_len;
    if (is_inline) {
        /* The data is taken now; lkeys are not looked at. */
        uint8_t *dst = qp->sq_inline + idx * qp->cap.max_inline_data;
        for (int i = 0; i < wr->num_sge; i++) {
            memcpy(dst, (const void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
            dst += wr->sg_list[i].length;
        }
    } else if (wr->num_sge > 0) {
        memcpy(qp->sq_sge + idx * qp->cap.max_send_sge, wr->sg_list,
               (size_t)wr->num_sge * sizeof *wr->sg_list);
    }
    qp->post_seq++;
    sv_count(SVC_WRS_POSTED, 1);
    sv_count(SVC_SGES, (uint64_t)wr->num_sge);
    return 0;
}

int sv_post_send(struct ibv_qp *ibv, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
    sv_count(SVC_POST_SEND_CALLS, 1);
    struct sv_qp *qp = (struct sv_qp *)ibv;
    if (!qp || !wr) {
        if (bad_wr)
            *bad_wr = wr;
        sv_count(SVC_POST_FAILURES, 1);
        return EINVAL;
    }
    int rc = 0;
    pthread_mutex_lock(&qp->lock);
    for (; wr; wr = wr->next) {
        rc = queue_send(qp, wr);
        if (rc)
            break;
    }
    pthread_mutex_unlock(&qp->lock);
    if (rc) {
        if (bad_wr)
            *bad_wr = wr;
        sv_count(SVC_POST_FAILURES, 1);
    }
    return rc;
}

int sv_post_recv(struct ibv_qp *ibv, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
    sv_count(SVC_POST_RECV_CALLS, 1);
    struct sv_qp *qp = (struct sv_qp *)ibv;
    if (!qp || !wr) {
        if (bad_wr)
            *bad_wr = wr;
        sv_count(SVC_POST_FAILURES, 1);
        return EINVAL;
    }
    int rc = 0;
    pthread_mutex_lock(&qp->lock);
    for (; wr; wr = wr->next) {
        if (qp->ibv.state == IBV_QPS_RESET || wr->num_sge < 0 ||
            (uint32_t)wr->num_sge > qp->cap.max_recv_sge || (wr->num_sge > 0 && !wr->sg_list)) {
            rc = EINVAL;
            break;
        }
        if (qp->rq_count >= qp->cap.max_recv_wr) {
            rc = ENOMEM;
            break;
        }
        qp->rq[(qp->rq_head + qp->rq_count) % qp->cap.max_recv_wr] = wr->wr_id;
        qp->rq_count++;
    }
    pthread_mutex_unlock(&qp->lock);
    if (rc) {
        if (bad_wr)
            *bad_wr = wr;
        sv_count(SVC_POST_FAILURES, 1);
    }
    return rc;
}
