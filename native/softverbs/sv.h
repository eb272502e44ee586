/*
 * sv.h - softverbs internals shared by its source files (softverbs.h says
 * what the library does; this says how the pieces fit).
 *
 * Objects handed to the application are our structs whose first member is
 * the verbs struct, so a struct ibv_qp * converts back with a cast.
 *
 * Locking: a CQ's mutex, then a QP's mutex, never the other way. poll_cq
 * holds its CQ while it runs the queued WRs of the QPs that report to it;
 * post_send and modify_qp take only the QP.
 */
#ifndef SV_H
#define SV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Every ibv_* function this library defines is exported; nothing else is
 * (the build uses -fvisibility=hidden). */
#pragma GCC visibility push(default)
#include "common/verbs_abi.h"
#include "softverbs.h"
#pragma GCC visibility pop

#define SV_UNUSED __attribute__((unused))

/* ---------------------------------------------------------------- config */

struct sv_config {
    int link_ethernet;
    long exec_delay_us;     /* SOFTVERBS_EXEC_DELAY_US: a slow link, for tests that race it */
    int max_qp_wr, max_sge, max_qp_rd_atom, max_cqe;
    int active_mtu;         /* enum ibv_mtu, from SOFTVERBS_MTU in bytes */
    uint64_t max_mr_size;
};

#define SV_MAX_QP 16384         /* QP table slots: QPN = slot | gen << 14 */
#define SV_QP_SLOT_BITS 14
#define SV_MAX_MR 65536         /* MR table slots: key = slot | gen << 16 */
#define SV_MR_SLOT_BITS 16
#define SV_SGE_LIMIT 1024       /* SOFTVERBS_MAX_SGE is clamped to this (IOV_MAX) */
#define SV_MAX_INLINE 256
#define SV_MAX_MSG (1u << 31)
#define SV_PORT 1

const struct sv_config *sv_config(void);
uint16_t sv_lid_of(pid_t pid);
int sv_gid_count(void);
void sv_gid(int index, union ibv_gid *gid);

/* -------------------------------------------------------------- registry */

/* A QP as other processes see it. */
struct sv_reg_qp {
    _Atomic int32_t owner;              /* pid, 0 when free */
    _Atomic uint32_t qpn;               /* 0 while being set up or torn down */
    _Atomic uint32_t gen;
    _Atomic uint32_t state;             /* enum ibv_qp_state */
    _Atomic uint32_t remote_qpn;
    _Atomic uint32_t max_dest_rd_atomic;
    _Atomic uint32_t access;            /* qp_access_flags */
    _Atomic uint32_t path_mtu;          /* enum ibv_mtu, 0 before RTR */
    _Atomic uint64_t pd_id;
};

enum sv_mr_kind { SV_MR_HOST = 1, SV_MR_DMABUF = 2 };

struct sv_reg_mr {
    _Atomic int32_t owner;
    _Atomic uint32_t key;               /* lkey == rkey; 0 while not valid */
    _Atomic uint32_t gen;
    _Atomic uint32_t access;
    _Atomic uint32_t kind;
    uint32_t pad;
    _Atomic uint64_t pd_id;
    _Atomic uint64_t addr;              /* host address (dma-buf: GPU address) */
    _Atomic uint64_t iova;              /* what SGEs and remote_addr use */
    _Atomic uint64_t length;
};

/* A consistent copy of an MR entry, taken by sv_reg_mr_get. */
struct sv_mr_view {
    pid_t owner;
    uint32_t access, kind;
    uint64_t pd_id, addr, iova, length;
};

struct sv_qp_view {
    pid_t owner;
    uint32_t state, remote_qpn, max_dest_rd_atomic, access, path_mtu;
    uint64_t pd_id;
};

int sv_registry_open(void);             /* 0 or an errno value */
pid_t sv_self(void);
int sv_pid_dead(pid_t pid);

/* Claim a slot (published with key/qpn 0) and return its index, or -1. */
int sv_reg_mr_claim(void);
uint32_t sv_reg_mr_publish(int slot, const struct sv_mr_view *v);
void sv_reg_mr_release(int slot);
int sv_reg_mr_get(uint32_t key, struct sv_mr_view *out);   /* 0 or -1 when stale */

int sv_reg_qp_claim(void);
uint32_t sv_reg_qp_publish(int slot, uint64_t pd_id);
void sv_reg_qp_release(int slot);
struct sv_reg_qp *sv_reg_qp_slot(int slot);
int sv_reg_qp_get(uint32_t qpn, struct sv_qp_view *out);  /* 0 or -1 when gone */

/* --------------------------------------------------------------- objects */

struct sv_context {
    struct ibv_context ibv;
};

struct sv_pd {
    struct ibv_pd ibv;
    uint64_t id;
    _Atomic int users;                  /* MRs and QPs: dealloc_pd fails while any */
};

struct sv_mr {
    struct ibv_mr ibv;
    int slot;
};

/* One queued send WR; its SGEs live in the QP's sge array. */
struct sv_wr {
    uint64_t wr_id;
    uint64_t remote_addr;
    uint32_t rkey;
    uint32_t opcode;
    int num_sge;
    int signaled;
    uint32_t inline_len;                /* bytes in the QP's inline array */
    int is_inline;
};

struct sv_cqe {
    struct ibv_wc wc;
    struct sv_qp *qp;
    uint64_t seq;                       /* send WR sequence (UINT64_MAX: receive) */
};

struct sv_cq {
    struct ibv_cq ibv;
    pthread_mutex_t lock;
    struct sv_cqe *ring;
    int size, head, count;
    int overflowed;
    struct sv_qp *qps;                  /* QPs whose send or recv CQ this is */
};

struct sv_qp {
    struct ibv_qp ibv;
    pthread_mutex_t lock;
    int slot;
    struct sv_pd *pd;
    struct sv_cq *scq, *rcq;
    struct sv_qp *next_scq, *next_rcq;  /* links in scq->qps / rcq->qps */
    struct ibv_qp_cap cap;
    int sq_sig_all;

    /* attributes from modify_qp */
    struct ibv_qp_attr attr;

    /* Send queue: WR seq s is in slot s % max_send_wr. Queued WRs are
     * [exec_seq, post_seq); the SQ holds [retired, post_seq). */
    struct sv_wr *sq;
    struct ibv_sge *sq_sge;             /* max_send_sge per slot */
    uint8_t *sq_inline;                 /* max_inline_data per slot */
    uint64_t post_seq, exec_seq;
    _Atomic uint64_t retired;

    /* Receive queue: only counted and flushed (no SEND ever arrives). */
    uint64_t *rq;                       /* wr_ids, ring of max_recv_wr */
    uint32_t rq_head, rq_count;

    /* Scratch for executing one WR. */
    struct sv_seg *segs;
    uint8_t *bounce;
};

/* ------------------------------------------------------------ execution */

/* Where a run of bytes lives. */
struct sv_seg {
    uint64_t addr;
    uint64_t len;
    pid_t pid;
    int gpu;
};

void sv_qp_run(struct sv_qp *qp, struct sv_cq *cq);         /* QP locked, CQ locked */
void sv_qp_flush_rq(struct sv_qp *qp, struct sv_cq *cq);    /* QP locked, CQ locked */
void sv_cq_push(struct sv_cq *cq, struct sv_qp *qp, uint64_t seq, const struct ibv_wc *wc);
void sv_qp_set_state(struct sv_qp *qp, enum ibv_qp_state s);

enum ibv_wc_status sv_copy(int read, const struct sv_seg *local, int nlocal,
                           const struct sv_seg *remote, uint8_t **bounce,
                           uint32_t *vendor_err);

/* ----------------------------------------------------------------- CUDA */

int sv_cuda_load(void);                 /* 0 or an errno value */
int sv_cuda_copy(int to_device, uint64_t dptr, void *host, size_t len);  /* 0 or -1 */

/* -------------------------------------------------------------- counters */

enum sv_counter {
    SVC_POST_SEND_CALLS, SVC_POST_RECV_CALLS, SVC_WRS_POSTED, SVC_WRS_EXECUTED, SVC_SGES,
    SVC_COMPLETIONS, SVC_CQES_POLLED, SVC_POLL_CALLS, SVC_ERROR_COMPLETIONS,
    SVC_POST_FAILURES, SVC_CQ_OVERFLOWS, SVC_COUNT
};

void sv_count(enum sv_counter c, uint64_t n);
/* IBV_WC_SUCCESS, or the status the next executed WR must take instead. */
enum ibv_wc_status sv_injected_status(void);

int sv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int sv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int sv_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
int sv_req_notify_cq(struct ibv_cq *cq, int solicited_only);

#endif
