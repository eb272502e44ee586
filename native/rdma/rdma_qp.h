/*
 * rdma_qp.h - the RC queue pairs one client connection uses, both sides:
 * creating them with one CQ, describing them to the peer (the RDMA_HELLO
 * body, whose wire format is common/protocol.h's), and bringing them to
 * RTS against the peer's.
 *
 * A client connection owns several QPs so its RDMA READs are not limited
 * to one QP's max_rd_atomic outstanding; each client QP is connected to
 * one server QP. The client only initiates, the server only responds: the
 * client's QPs grant no remote access at all.
 */
#ifndef GDRKV_RDMA_QP_H
#define GDRKV_RDMA_QP_H

#include <stddef.h>
#include <stdint.h>

#include "common/protocol.h"
#include "rdma_dev.h"

struct rdma_qps {
    struct ibv_cq *cq;
    struct ibv_qp *qp[RDMA_MAX_QPS];
    uint32_t psn[RDMA_MAX_QPS];
    uint32_t n;
    uint32_t sq_depth;              /* WRs each send queue holds */
    uint32_t max_sge;
    uint32_t max_sge_rd;            /* of which a READ may use (max_sge_rd) */
    uint32_t rd_atomic;             /* READs each QP may have in flight */
};

/* Creates n QPs sharing one CQ sized for all their send queues; `remote`
 * grants remote read and write on them (the server's). Returns 0 or -1
 * (errno from verbs, logged). */
int rdma_qps_create(const struct rdma_dev *d, struct rdma_qps *q, uint32_t n, uint32_t sq_depth,
                    uint32_t max_sge, int remote);
/* Moves every QP through INIT, RTR and RTS against the peer's QPs; the
 * peer's rd_atomic is the negotiated read depth, programmed as the READs
 * this side issues (initiator) or accepts (responder); the other
 * direction gets 1, which every device supports. */
int rdma_qps_connect(const struct rdma_dev *d, struct rdma_qps *q,
                     const struct rdma_endpoint *peer, int initiator);
/* The local side, for the peer. */
void rdma_qps_describe(const struct rdma_dev *d, const struct rdma_qps *q,
                       struct rdma_endpoint *e);
/* Moves every QP to ERR: from then on the NIC refuses the peer's READs and
 * WRITEs, so memory they targeted can be handed to someone else. */
void rdma_qps_kill(const struct rdma_dev *d, struct rdma_qps *q);
void rdma_qps_destroy(const struct rdma_dev *d, struct rdma_qps *q);

#endif
