/*
 * rdma_qp.c - see rdma_qp.h.
 */
#include "rdma_qp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/log.h"

/* ------------------------------------------------------------ QPs */

int rdma_qps_create(const struct rdma_dev *d, struct rdma_qps *q, uint32_t n, uint32_t sq_depth,
                    uint32_t max_sge, int remote)
{
    memset(q, 0, sizeof *q);
    q->max_sge = q->max_sge_rd = max_sge;
    int cqe = (int)GK_MIN((uint64_t)n * sq_depth + n, (uint64_t)GK_MAX(d->attr.max_cqe, 1));
    q->cq = d->ibv->create_cq(d->ctx, cqe, NULL, NULL, 0);
    if (!q->cq) {
        GK_WARN("rdma: cannot create a CQ of %d entries on %s: %s", cqe, d->name,
                strerror(errno));
        return -1;
    }
    /* After an error every outstanding WR completes, signalled or not: the
     * send queues together must never hold more than the CQ can take. */
    q->sq_depth = GK_MIN(sq_depth, (uint32_t)GK_MAX(q->cq->cqe - (int)n, (int)n) / n);
    if (q->sq_depth < 2 && sq_depth >= 2) {
        GK_WARN("rdma: a CQ of %d entries on %s is too small for %u QPs", q->cq->cqe, d->name,
                n);
        rdma_qps_destroy(d, q);
        return -1;
    }
    sq_depth = q->sq_depth;
    for (uint32_t i = 0; i < n; i++) {
        struct ibv_qp_init_attr init = {
            .send_cq = q->cq,
            .recv_cq = q->cq,
            .cap = {.max_send_wr = sq_depth, .max_recv_wr = 1,
                    .max_send_sge = max_sge, .max_recv_sge = 1},
            .qp_type = IBV_QPT_RC,
        };
        q->qp[i] = d->ibv->create_qp(d->pd, &init);
        if (!q->qp[i]) {
            GK_WARN("rdma: cannot create QP %u of %u on %s: %s", i + 1, n, d->name,
                    strerror(errno));
            rdma_qps_destroy(d, q);
            return -1;
        }
        q->n++;
        q->psn[i] = (uint32_t)(gk_mix64(gk_now_ns() + i) & 0xffffff);
        struct ibv_qp_attr a = {
            .qp_state = IBV_QPS_INIT,
            .pkey_index = 0,
            .port_num = d->port,
            .qp_access_flags = remote ? IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE : 0,
        };
        if (d->ibv->modify_qp(q->qp[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                                IBV_QP_ACCESS_FLAGS)) {
            GK_WARN("rdma: QP to INIT failed on %s: %s", d->name, strerror(errno));
            rdma_qps_destroy(d, q);
            return -1;
        }
    }
    return 0;
}

void rdma_qps_describe(const struct rdma_dev *d, const struct rdma_qps *q,
                       struct rdma_endpoint *e)
{
    memset(e, 0, sizeof *e);
    e->eth = (uint8_t)d->eth;
    e->mtu = d->mtu;
    e->lid = d->lid;
    memcpy(e->gid, d->gid.raw, 16);
    e->rd_atomic = q->rd_atomic;
    e->sq_depth = q->sq_depth;
    e->max_sge = q->max_sge;
    e->nqps = q->n;
    for (uint32_t i = 0; i < q->n; i++) {
        e->qpn[i] = q->qp[i]->qp_num;
        e->psn[i] = q->psn[i];
    }
}

static int to_rtr(const struct rdma_dev *d, struct ibv_qp *qp, const struct rdma_endpoint *peer,
                  uint32_t i, uint32_t dest_rd_atomic)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = (enum ibv_mtu)GK_MIN(d->mtu, peer->mtu),
        .dest_qp_num = peer->qpn[i],
        .rq_psn = peer->psn[i],
        .max_dest_rd_atomic = (uint8_t)dest_rd_atomic,
        .min_rnr_timer = 12,
        .ah_attr = {.port_num = d->port, .dlid = peer->lid},
    };
    if (d->eth) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
        a.ah_attr.grh.hop_limit = 64;
    }
    return d->ibv->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                         IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int to_rts(const struct rdma_dev *d, struct ibv_qp *qp, uint32_t psn, uint32_t rd_atomic)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTS,
        .sq_psn = psn,
        .timeout = 14,          /* 4.096 us * 2^14 = 67 ms per retry */
        .retry_cnt = 7,
        .rnr_retry = 7,
        .max_rd_atomic = (uint8_t)rd_atomic,
    };
    return d->ibv->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
                                         IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                         IBV_QP_MAX_QP_RD_ATOMIC);
}

int rdma_qps_connect(const struct rdma_dev *d, struct rdma_qps *q,
                     const struct rdma_endpoint *peer, int initiator)
{
    if (peer->nqps != q->n || peer->eth != d->eth)
        return -1;
    q->rd_atomic = peer->rd_atomic;
    uint32_t out = initiator ? peer->rd_atomic : 1, in = initiator ? 1 : peer->rd_atomic;
    for (uint32_t i = 0; i < q->n; i++) {
        if (to_rtr(d, q->qp[i], peer, i, in) || to_rts(d, q->qp[i], q->psn[i], out)) {
            GK_WARN("rdma: QP to RTR/RTS failed on %s: %s", d->name, strerror(errno));
            return -1;
        }
    }
    return 0;
}

void rdma_qps_kill(const struct rdma_dev *d, struct rdma_qps *q)
{
    for (uint32_t i = 0; i < q->n; i++) {
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
        d->ibv->modify_qp(q->qp[i], &a, IBV_QP_STATE);
    }
}

void rdma_qps_destroy(const struct rdma_dev *d, struct rdma_qps *q)
{
    for (uint32_t i = 0; i < q->n; i++)
        d->ibv->destroy_qp(q->qp[i]);
    if (q->cq)
        d->ibv->destroy_cq(q->cq);
    memset(q, 0, sizeof *q);
}

