/*
 * softverbs.h - the test-only exports of libsoftverbs.so.
 *
 * softverbs is a software implementation of the part of the libibverbs ABI
 * that gdrkv's rdma transport uses, so that transport runs unmodified across
 * processes on one host without RDMA hardware (GDRKV_IBVERBS_LIB points at
 * libsoftverbs.so; gdrkv.softverbs.library_path() gives its path).
 *
 * What is emulated
 * - One device "softverbs0" with one ACTIVE port 1, MTU 4096 (max) and an
 *   active MTU of SOFTVERBS_MTU bytes (4096; 256..4096). Link layer
 *   InfiniBand (LID 1 + pid-derived, one GID) or, with
 *   SOFTVERBS_LINK_LAYER=ethernet, RoCE (LID 0, GID 0 fe80::/64 link-local,
 *   GID 1 ::ffff:127.0.0.1). Device limits from the environment:
 *   SOFTVERBS_MAX_QP_WR (4096), SOFTVERBS_MAX_SGE (16, at most 1024),
 *   SOFTVERBS_MAX_QP_RD_ATOM (16), SOFTVERBS_MAX_CQE (65536),
 *   SOFTVERBS_MAX_MR_SIZE (1 TiB); max_qp 16384, max_mr 65535.
 *   SOFTVERBS_EXEC_DELAY_US (0) makes each WR take that long, a slow link
 *   for tests that must act while a batch is in flight.
 * - PDs, MRs (host memory and dma-buf), CQs, RC QPs with the verbs state
 *   machine, one-sided RDMA READ and RDMA WRITE (IBV_SEND_INLINE for WRITE
 *   up to 256 bytes), post_recv (queued only: no SEND is ever delivered).
 * - Processes find each other through a registry file mapped MAP_SHARED,
 *   $SOFTVERBS_DIR/softverbs-<uid> (default /dev/shm): QP and MR tables
 *   whose slots belong to a pid and are reclaimed when it is dead. A key is
 *   slot | generation << 16 and a QPN slot | generation << 14, so a
 *   deregistered key or a destroyed QP's number is stale, not reused.
 * - The initiator moves the bytes: process_vm_readv/writev to the process
 *   that owns the remote MR (memcpy when it is this one). A dma-buf MR's
 *   iova is the GPU virtual address; its bytes go through a bounce buffer
 *   with cuMemcpyHtoD/DtoH (libcuda.so.1 loaded on the first dma-buf
 *   registration), in the current CUDA context or else the primary context
 *   of the pointer's device. Another process's dma-buf MR cannot be
 *   reached: such a WR completes IBV_WC_REM_OP_ERR.
 * - Execution is deferred like hardware: ibv_post_send only validates and
 *   queues; the queued WRs of every QP whose send CQ is polled run (in post
 *   order per QP) inside ibv_poll_cq, before completions are returned.
 *
 * What is strict (each is a negative test in tests/native/test_softverbs.c)
 * - post_send: QP not in RTS -> EINVAL (in ERR it is accepted and flushed,
 *   as hardware does); opcode other than RDMA_READ/RDMA_WRITE -> EINVAL;
 *   num_sge above the QP's max_send_sge -> EINVAL; send queue full -> ENOMEM.
 *   A WR occupies the send queue until a signalled (or error) completion at
 *   or after it is polled, so unsignalled work piles up. *bad_wr is the
 *   first WR not posted; the ones before it stay posted.
 * - Completions: bad/stale lkey, range outside the MR, other PD, READ into
 *   an MR without LOCAL_WRITE -> IBV_WC_LOC_PROT_ERR; bad/stale rkey, MR of
 *   another PD than the responder QP's, range outside, missing REMOTE_READ /
 *   REMOTE_WRITE on the MR or on the responder QP -> IBV_WC_REM_ACCESS_ERR;
 *   READ on a QP whose max_rd_atomic exceeds the responder's
 *   max_dest_rd_atomic -> IBV_WC_REM_INV_REQ_ERR; responder QP gone, its
 *   process dead, not in RTR/RTS, not connected back to this QP, or (IB) a
 *   DLID that is not the responder's LID, or a message longer than the
 *   smaller path MTU when the two QPs' path MTUs differ (the receiver
 *   drops the oversized packets) -> IBV_WC_RETRY_EXC_ERR.
 *   After an error completion the QP is in ERR and every later WR completes
 *   IBV_WC_WR_FLUSH_ERR; error and flush completions are reported even for
 *   unsignalled WRs. vendor_err carries an errno where a system call failed.
 * - modify_qp: RESET->INIT->RTR->RTS (plus INIT->INIT, RTS->RTS, any->ERR,
 *   any->RESET) with exactly the required attr_mask bits and only the
 *   optional ones verbs allows; max_rd_atomic / max_dest_rd_atomic above
 *   max_qp_rd_atom, path_mtu above the port's active MTU, a missing GRH on Ethernet or
 *   DLID on IB, bad port or pkey index -> EINVAL.
 * - CQ: more completions than its size -> overflow; poll_cq returns -1 from
 *   then on. Destroying a QP drops its unexecuted WRs and its completions.
 */
#ifndef SOFTVERBS_H
#define SOFTVERBS_H

#include <stdint.h>

struct softverbs_counters {
    uint64_t post_send_calls;   /* ibv_post_send calls: doorbells */
    uint64_t post_recv_calls;
    uint64_t wrs_posted;        /* send WRs accepted */
    uint64_t wrs_executed;      /* send WRs run (not flushed) */
    uint64_t sges;              /* SGEs in the accepted send WRs */
    uint64_t completions;       /* CQEs generated */
    uint64_t cqes_polled;       /* CQEs returned by poll_cq */
    uint64_t poll_calls;
    uint64_t error_completions; /* CQEs whose status is not success, flushes included */
    uint64_t post_failures;     /* post_send/post_recv calls that returned an error */
    uint64_t cq_overflows;
};

/* This process's counters since it started or since the last reset. */
void softverbs_counters(struct softverbs_counters *out);
void softverbs_reset_counters(void);

/*
 * The send WR executed after_wrs WRs from now in this process (0: the next
 * one) completes with wc_status instead of moving its bytes; a status other
 * than IBV_WC_SUCCESS moves its QP to ERR like any error completion.
 */
void softverbs_inject_error(uint64_t after_wrs, int wc_status);

#endif
