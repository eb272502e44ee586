/*
 * exec.c - running queued send WRs, inside poll_cq of the QP's send CQ.
 * Each WR goes through the checks a responder and the local NIC make, in
 * the order they would meet them (is the remote QP there and connected to
 * us, local keys, remote key), then its bytes move (copy.c). The first
 * error completion moves the QP to ERR; what is still queued behind it
 * completes as flushed.
 */
#include "sv.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

/* Is the responder there, connected back to us and reachable? */
static enum ibv_wc_status check_responder(struct sv_qp *qp, struct sv_qp_view *rv)
{
    if (sv_reg_qp_get(qp->attr.dest_qp_num, rv))
        return IBV_WC_RETRY_EXC_ERR;
    if (rv->owner != sv_self() && sv_pid_dead(rv->owner))
        return IBV_WC_RETRY_EXC_ERR;
    if (rv->state != IBV_QPS_RTR && rv->state != IBV_QPS_RTS)
        return IBV_WC_RETRY_EXC_ERR;
    /* An RC responder drops packets from a QP it is not connected to. */
    if (rv->remote_qpn != qp->ibv.qp_num)
        return IBV_WC_RETRY_EXC_ERR;
    /* On IB each process is its own port; a wrong DLID reaches nobody. */
    if (!sv_config()->link_ethernet && qp->attr.ah_attr.dlid != sv_lid_of(rv->owner))
        return IBV_WC_RETRY_EXC_ERR;
    return IBV_WC_SUCCESS;
}

/* Local SGEs -> segments; *total gets the message length. */
static enum ibv_wc_status local_segments(struct sv_qp *qp, const struct sv_wr *w, size_t idx,
                                         int *nseg, uint64_t *total)
{
    *total = 0;
    *nseg = 0;
    if (w->is_inline) {
        qp->segs[0] = (struct sv_seg){
            .addr = (uintptr_t)(qp->sq_inline + idx * qp->cap.max_inline_data),
            .len = w->inline_len, .pid = sv_self(), .gpu = 0,
        };
        *nseg = 1;
        *total = w->inline_len;
        return IBV_WC_SUCCESS;
    }
    const struct ibv_sge *sge = qp->sq_sge + idx * qp->cap.max_send_sge;
    int read = w->opcode == IBV_WR_RDMA_READ;
    for (int i = 0; i < w->num_sge; i++) {
        struct sv_mr_view mr;
        if (sv_reg_mr_get(sge[i].lkey, &mr) || mr.owner != sv_self() || mr.pd_id != qp->pd->id)
            return IBV_WC_LOC_PROT_ERR;
        if (sge[i].addr < mr.iova || sge[i].length > mr.length ||
            sge[i].addr - mr.iova > mr.length - sge[i].length)
            return IBV_WC_LOC_PROT_ERR;
        /* The NIC writes into a READ's local buffers. */
        if (read && !(mr.access & IBV_ACCESS_LOCAL_WRITE))
            return IBV_WC_LOC_PROT_ERR;
        qp->segs[i] = (struct sv_seg){
            .addr = mr.addr + (sge[i].addr - mr.iova), .len = sge[i].length,
            .pid = sv_self(), .gpu = mr.kind == SV_MR_DMABUF,
        };
        *total += sge[i].length;
    }
    *nseg = w->num_sge;
    return *total > SV_MAX_MSG ? IBV_WC_LOC_LEN_ERR : IBV_WC_SUCCESS;
}

static enum ibv_wc_status remote_segment(const struct sv_wr *w, const struct sv_qp_view *rv,
                                         uint64_t len, struct sv_seg *out)
{
    unsigned need = w->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_REMOTE_READ
                                                  : IBV_ACCESS_REMOTE_WRITE;
    if (!(rv->access & need))
        return IBV_WC_REM_ACCESS_ERR;
    struct sv_mr_view mr;
    if (sv_reg_mr_get(w->rkey, &mr) || mr.owner != rv->owner || mr.pd_id != rv->pd_id ||
        !(mr.access & need))
        return IBV_WC_REM_ACCESS_ERR;
    if (w->remote_addr < mr.iova || len > mr.length || w->remote_addr - mr.iova > mr.length - len)
        return IBV_WC_REM_ACCESS_ERR;
    *out = (struct sv_seg){
        .addr = mr.addr + (w->remote_addr - mr.iova), .len = len,
        .pid = mr.owner, .gpu = mr.kind == SV_MR_DMABUF,
    };
    /* GPU memory of another process is out of reach of this emulation. */
    if (out->gpu && out->pid != sv_self())
        return IBV_WC_REM_OP_ERR;
    return IBV_WC_SUCCESS;
}

static enum ibv_wc_status execute(struct sv_qp *qp, const struct sv_wr *w, size_t idx,
                                  uint32_t *byte_len, uint32_t *vendor_err)
{
    enum ibv_wc_status st = sv_injected_status();
    if (st != IBV_WC_SUCCESS)
        return st;
    struct sv_qp_view rv;
    st = check_responder(qp, &rv);
    if (st != IBV_WC_SUCCESS)
        return st;
    int read = w->opcode == IBV_WR_RDMA_READ;
    if (read && qp->attr.max_rd_atomic > rv.max_dest_rd_atomic)
        return IBV_WC_REM_INV_REQ_ERR;
    int nseg;
    uint64_t total;
    st = local_segments(qp, w, idx, &nseg, &total);
    if (st != IBV_WC_SUCCESS)
        return st;
    *byte_len = (uint32_t)total;
    /* Both ends must agree on the path MTU: a packet longer than the
     * receiver's is dropped and the requester retries until it gives up. */
    unsigned smaller = qp->attr.path_mtu < rv.path_mtu ? qp->attr.path_mtu : rv.path_mtu;
    if (qp->attr.path_mtu != rv.path_mtu && total > 128u << smaller)
        return IBV_WC_RETRY_EXC_ERR;
    if (total == 0)                     /* a zero-length message names no remote memory */
        return IBV_WC_SUCCESS;
    struct sv_seg remote;
    st = remote_segment(w, &rv, total, &remote);
    if (st != IBV_WC_SUCCESS)
        return st;
    return sv_copy(read, qp->segs, nseg, &remote, &qp->bounce, vendor_err);
}

static void complete(struct sv_qp *qp, struct sv_cq *cq, const struct sv_wr *w, uint64_t seq,
                     enum ibv_wc_status st, uint32_t byte_len, uint32_t vendor_err)
{
    struct ibv_wc wc;
    memset(&wc, 0, sizeof wc);
    wc.wr_id = w->wr_id;
    wc.status = st;
    wc.opcode = w->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
    wc.vendor_err = vendor_err;
    wc.byte_len = byte_len;
    wc.qp_num = qp->ibv.qp_num;
    sv_cq_push(cq, qp, seq, &wc);
}

void sv_qp_run(struct sv_qp *qp, struct sv_cq *cq)
{
    while (qp->exec_seq < qp->post_seq && !cq->overflowed) {
        uint64_t seq = qp->exec_seq++;
        size_t idx = seq % qp->cap.max_send_wr;
        const struct sv_wr *w = &qp->sq[idx];
        if (qp->ibv.state == IBV_QPS_ERR) {
            complete(qp, cq, w, seq, IBV_WC_WR_FLUSH_ERR, 0, 0);
            continue;
        }
        uint32_t byte_len = 0, vendor_err = 0;
        if (sv_config()->exec_delay_us)
            usleep((useconds_t)sv_config()->exec_delay_us);
        enum ibv_wc_status st = execute(qp, w, idx, &byte_len, &vendor_err);
        sv_count(SVC_WRS_EXECUTED, 1);
        if (st != IBV_WC_SUCCESS) {
            sv_qp_set_state(qp, IBV_QPS_ERR);
            complete(qp, cq, w, seq, st, 0, vendor_err);
        } else if (w->signaled) {
            complete(qp, cq, w, seq, st, byte_len, 0);
        }
    }
}

/* Receives never complete (no SEND is delivered) except as flushed. */
void sv_qp_flush_rq(struct sv_qp *qp, struct sv_cq *cq)
{
    if (qp->ibv.state != IBV_QPS_ERR)
        return;
    while (qp->rq_count > 0 && !cq->overflowed) {
        struct ibv_wc wc;
        memset(&wc, 0, sizeof wc);
        wc.wr_id = qp->rq[qp->rq_head];
        wc.status = IBV_WC_WR_FLUSH_ERR;
        wc.opcode = IBV_WC_RECV;
        wc.qp_num = qp->ibv.qp_num;
        sv_cq_push(cq, qp, UINT64_MAX, &wc);
        qp->rq_head = (qp->rq_head + 1) % qp->cap.max_recv_wr;
        qp->rq_count--;
    }
}
