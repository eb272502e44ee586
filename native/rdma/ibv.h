/*
 * ibv.h - libibverbs, loaded at run time (the way NCCL does it) so one
 * build runs on hosts with and without RDMA: $GDRKV_IBVERBS_LIB when set
 * (softverbs in the tests), else the system's libibverbs.so.1.
 *
 * The ABI is declared in the repository (common/verbs_abi.h), so every
 * build has the transport, rdma-core's headers or not. The data path
 * (post_send, poll_cq) goes through the context's ops table as rdma-core's
 * inline wrappers do; every exported function comes from the table below.
 */
#ifndef GDRKV_IBV_H
#define GDRKV_IBV_H

#include <string.h>

#include "common/log.h"
#include "common/verbs_abi.h"
#include "gdrkv.h"

struct gk_ibv {
    struct ibv_device **(*get_device_list)(int *num);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *dev);
    struct ibv_context *(*open_device)(struct ibv_device *dev);
    int (*close_device)(struct ibv_context *ctx);
    int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
    int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
    int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
    /* Optional: NULL on libraries too old to have them. */
    struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
                                   unsigned int access);
    struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len,
                                    uint64_t iova, int fd, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
                                struct ibv_comp_channel *channel, int comp_vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
    int (*destroy_qp)(struct ibv_qp *qp);
    const char *(*wc_status_str)(enum ibv_wc_status status);
};

/* The table, loaded once; NULL when the library or one of its required
 * functions is missing, and *why says which. */
const struct gk_ibv *gk_ibv_load(const char **why);

/* The hot verbs, one convention for both (NCCL's ibvwrap style): through
 * the context's ops table, no library call; a failure is logged here, once,
 * and comes back as GDRKV_E_UNAVAILABLE. */
static inline int gk_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
                               struct ibv_send_wr **bad)
{
    int rc = ibv_post_send(qp, wr, bad);
    if (rc)
        GK_WARN("rdma: post_send on QP %u failed: %s", qp->qp_num, strerror(rc));
    return rc ? GDRKV_E_UNAVAILABLE : 0;
}

/* Completions taken (0 or more), or GDRKV_E_UNAVAILABLE. */
static inline int gk_poll_cq(struct ibv_cq *cq, int max, struct ibv_wc *wc)
{
    int n = ibv_poll_cq(cq, max, wc);
    if (n < 0)
        GK_WARN("rdma: poll_cq failed (%d)", n);
    return n < 0 ? GDRKV_E_UNAVAILABLE : n;
}

/* The library gk_ibv_load opens (or opened): the env override or the
 * system's; for reports. */
const char *gk_ibv_library(void);

#endif
