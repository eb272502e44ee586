/*
 * rdma_qp.h - the RC queue pairs one client connection uses, both sides:
 * creating them with one CQ, describing them to the peer (the RDMA_HELLO
 * body, docs/protocol.md), and bringing them to RTS against the peer's.
 *
 * A client connection owns several QPs so its RDMA READs are not limited
 * to one QP's max_rd_atomic outstanding; each client QP is connected to
 * one server QP. The client only initiates, the server only responds: the
 * client's QPs grant no remote access at all.
 *
 *   endpoint: u8 eth | u8 mtu | u16 lid | u8 gid[16] | u32 rd_atomic |
 *             u32 sq_depth | u32 max_sge | u32 nqps | nqps x (u32 qpn | u32 psn)
 *   server answer: its endpoint | u32 nregions | u32 reserved |
 *             nregions x (u64 pool_off | u64 len | u64 addr | u32 rkey | u32 reserved)
 *
 * In the request rd_atomic, sq_depth and max_sge are what the client asks
 * for; in the answer, what the server granted (never more).
 */
#ifndef GDRKV_RDMA_QP_H
#define GDRKV_RDMA_QP_H

#include <stddef.h>
#include <stdint.h>

#define RDMA_MAX_QPS 16
#define RDMA_MAX_REGIONS 4096
#define RDMA_ENDPOINT_MIN 40        /* the fixed part */
#define RDMA_QP_WIRE_SIZE 8
#define RDMA_REGION_WIRE_SIZE 32

struct rdma_endpoint {
    uint8_t eth;
    uint8_t mtu;
    uint16_t lid;
    uint8_t gid[16];
    uint32_t rd_atomic;
    uint32_t sq_depth;
    uint32_t max_sge;
    uint32_t nqps;
    uint32_t qpn[RDMA_MAX_QPS];
    uint32_t psn[RDMA_MAX_QPS];
};

/* A registered piece of the server's pool: offsets [pool_off, pool_off +
 * len) are at addr under rkey. */
struct rdma_region {
    uint64_t pool_off, len, addr;
    uint32_t rkey;
};

size_t rdma_endpoint_size(const struct rdma_endpoint *e);
size_t rdma_endpoint_encode(const struct rdma_endpoint *e, uint8_t *out);
/* Returns the bytes consumed, or 0 when malformed. */
size_t rdma_endpoint_decode(const uint8_t *in, size_t len, struct rdma_endpoint *e);
void rdma_region_encode(const struct rdma_region *r, uint8_t *out);
/* Fills regions from the answer's tail; returns the count or -1 when
 * malformed (counts, lengths, overlaps, regions out of pool order). */
int rdma_regions_decode(const uint8_t *in, size_t len, struct rdma_region *out, uint32_t max);

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
