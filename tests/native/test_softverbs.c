/*
 * test_softverbs.c - softverbs against the verbs API as a program uses it
 * (verbs.h's inline ibv_post_send/ibv_poll_cq through the context ops),
 * across processes: a forked responder registers an MR in memory shared
 * with the parent (MAP_SHARED, so the parent checks writes without going
 * through softverbs), creates a QP, sends its QPN/LID/rkeys through a pipe
 * and serves commands until the parent closes the pipe.
 *
 * Every contract rule softverbs enforces has a negative test here; the
 * positive tests check bytes and the counters the transport's tests rely
 * on. The registry lives in a private directory (SOFTVERBS_DIR).
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/verbs_abi.h"

#include "check.h"
#include "softverbs/softverbs.h"

#define RSIZE (4u << 20)                /* responder buffer */
#define LSIZE (4u << 20)                /* initiator buffer */

/* ------------------------------------------------------------ endpoint */

struct ep {
    struct ibv_context *ctx;
    struct ibv_pd *pd, *pd2;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    uint8_t *buf;
    uint16_t lid;
};

struct ep_opts {
    int cqe;
    uint32_t max_send_wr, max_recv_wr, max_send_sge, max_inline;
    int sig_all;
};

static const struct ep_opts DEFAULT_OPTS = {256, 256, 16, 16, 0, 0};

static struct ibv_context *open_dev(void)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n == 1, "device list");
    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx, "open: %s", strerror(errno));
    ibv_free_device_list(list);
    return ctx;
}

static void ep_open(struct ep *e, const struct ep_opts *o, uint8_t *buf, size_t len, int access)
{
    memset(e, 0, sizeof *e);
    e->ctx = open_dev();
    e->pd = ibv_alloc_pd(e->ctx);
    e->pd2 = ibv_alloc_pd(e->ctx);
    CHECK(e->pd && e->pd2, "pd");
    e->cq = ibv_create_cq(e->ctx, o->cqe, NULL, NULL, 0);
    CHECK(e->cq, "cq: %s", strerror(errno));
    struct ibv_qp_init_attr ia = {
        .send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC, .sq_sig_all = o->sig_all,
        .cap = {o->max_send_wr, o->max_recv_wr, o->max_send_sge, 1, o->max_inline},
    };
    e->qp = ibv_create_qp(e->pd, &ia);
    CHECK(e->qp, "qp: %s", strerror(errno));
    e->buf = buf;
    e->mr = ibv_reg_mr(e->pd, buf, len, access);
    CHECK(e->mr, "mr: %s", strerror(errno));
    struct ibv_port_attr pa;
    CHECK_EQ(ibv_query_port(e->ctx, 1, &pa), 0);
    e->lid = pa.lid;
}

static void ep_close(struct ep *e)
{
    CHECK_EQ(ibv_dereg_mr(e->mr), 0);
    CHECK_EQ(ibv_destroy_qp(e->qp), 0);
    CHECK_EQ(ibv_destroy_cq(e->cq), 0);
    CHECK_EQ(ibv_dealloc_pd(e->pd), 0);
    CHECK_EQ(ibv_dealloc_pd(e->pd2), 0);
    CHECK_EQ(ibv_close_device(e->ctx), 0);
}

static int to_init(struct ibv_qp *qp, unsigned access)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = access};
    return ibv_modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int to_rtr_mtu(struct ibv_qp *qp, uint32_t dest_qpn, uint16_t dlid, uint8_t max_dest_rd,
                      enum ibv_mtu mtu)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR, .path_mtu = mtu, .dest_qp_num = dest_qpn,
        .rq_psn = 7, .max_dest_rd_atomic = max_dest_rd, .min_rnr_timer = 12,
        .ah_attr = {.dlid = dlid, .port_num = 1},
    };
    return ibv_modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                             IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int to_rtr(struct ibv_qp *qp, uint32_t dest_qpn, uint16_t dlid, uint8_t max_dest_rd)
{
    return to_rtr_mtu(qp, dest_qpn, dlid, max_dest_rd, IBV_MTU_4096);
}

static int to_rts(struct ibv_qp *qp, uint8_t max_rd)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTS, .sq_psn = 7, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
        .max_rd_atomic = max_rd,
    };
    return ibv_modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                             IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest_qpn, uint16_t dlid, uint8_t max_rd,
                       uint8_t max_dest_rd)
{
    CHECK_EQ(to_init(qp, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE), 0);
    CHECK_EQ(to_rtr(qp, dest_qpn, dlid, max_dest_rd), 0);
    CHECK_EQ(to_rts(qp, max_rd), 0);
}

/* ----------------------------------------------------------- responder */

/* How the forked responder sets itself up. */
struct resp_opts {
    unsigned mr_access;
    unsigned qp_access;
    uint8_t max_dest_rd;
    int stop_at_init;               /* leave its QP in INIT */
    int connect_elsewhere;          /* connect its QP to another QPN than ours */
};

static const struct resp_opts RESP_DEFAULT = {
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE,
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE, 16, 0, 0,
};

struct resp_info {
    uint32_t qpn;
    uint16_t lid;
    uint32_t rkey;                  /* covers the whole buffer */
    uint32_t rkey_other_pd;         /* an MR on the same buffer in another PD */
    uint32_t rkey_ro;               /* remote read only, first half */
    uint64_t addr;
};

struct responder {
    pid_t pid;
    int to, from;                   /* pipes: commands to it, answers from it */
    struct resp_info info;
    uint8_t *buf;                   /* MAP_SHARED with it */
};

enum { CMD_DEREG = 'd', CMD_DESTROY_QP = 'q' };

static void xwrite(int fd, const void *p, size_t n)
{
    CHECK(write(fd, p, n) == (ssize_t)n, "pipe write: %s", strerror(errno));
}

static int xread(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

static void responder_main(struct responder *r, const struct resp_opts *o, int to, int from)
{
    struct ep e;
    ep_open(&e, &DEFAULT_OPTS, r->buf, RSIZE, (int)o->mr_access);
    struct ibv_mr *other = ibv_reg_mr(e.pd2, r->buf, RSIZE,
                                      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
                                          IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *ro = ibv_reg_mr(e.pd, r->buf, RSIZE / 2, IBV_ACCESS_REMOTE_READ);
    CHECK(other && ro, "responder MRs");
    struct resp_info info = {e.qp->qp_num, e.lid, e.mr->rkey, other->rkey, ro->rkey,
                             (uintptr_t)r->buf};
    xwrite(from, &info, sizeof info);
    uint32_t peer;
    uint16_t peer_lid;
    CHECK(xread(to, &peer, sizeof peer) == 0 && xread(to, &peer_lid, sizeof peer_lid) == 0,
          "peer");
    CHECK_EQ(to_init(e.qp, o->qp_access), 0);
    if (!o->stop_at_init) {
        CHECK_EQ(to_rtr(e.qp, o->connect_elsewhere ? peer ^ 0x4000 : peer, peer_lid,
                        o->max_dest_rd), 0);
        CHECK_EQ(to_rts(e.qp, 1), 0);
    }
    xwrite(from, "r", 1);
    char cmd;
    while (read(to, &cmd, 1) == 1) {
        if (cmd == CMD_DEREG)
            CHECK_EQ(ibv_dereg_mr(e.mr), 0);
        if (cmd == CMD_DESTROY_QP)
            CHECK_EQ(ibv_destroy_qp(e.qp), 0);
        xwrite(from, "k", 1);
    }
    _exit(0);
}

/* Forks a responder, connects ep's QP to it (max_rd_atomic max_rd). */
static void responder_start(struct responder *r, const struct resp_opts *o, struct ep *e,
                            uint8_t max_rd)
{
    int to[2], from[2];
    CHECK(pipe(to) == 0 && pipe(from) == 0, "pipe");
    r->buf = mmap(NULL, RSIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(r->buf != MAP_FAILED, "mmap");
    for (size_t i = 0; i < RSIZE; i++)
        r->buf[i] = (uint8_t)(i * 7 + 3);
    fflush(NULL);
    r->pid = fork();
    CHECK(r->pid >= 0, "fork");
    if (r->pid == 0) {
        close(to[1]);
        close(from[0]);
        responder_main(r, o, to[0], from[1]);
    }
    close(to[0]);
    close(from[1]);
    r->to = to[1];
    r->from = from[0];
    CHECK(xread(r->from, &r->info, sizeof r->info) == 0, "responder info");
    xwrite(r->to, &e->qp->qp_num, sizeof e->qp->qp_num);
    xwrite(r->to, &e->lid, sizeof e->lid);
    char c;
    CHECK(xread(r->from, &c, 1) == 0 && c == 'r', "responder ready");
    connect_qp(e->qp, r->info.qpn, r->info.lid, max_rd, 16);
}

static void responder_cmd(struct responder *r, char cmd)
{
    xwrite(r->to, &cmd, 1);
    char c;
    CHECK(xread(r->from, &c, 1) == 0 && c == 'k', "responder command %c", cmd);
}

static void responder_stop(struct responder *r)
{
    close(r->to);
    int status;
    CHECK(waitpid(r->pid, &status, 0) == r->pid, "waitpid");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "responder failed: status %d", status);
    close(r->from);
    munmap(r->buf, RSIZE);
}

/* ------------------------------------------------------------- helpers */

static uint8_t *local_buf(void)
{
    uint8_t *b = malloc(LSIZE);
    CHECK(b, "malloc");
    memset(b, 0xee, LSIZE);
    return b;
}

static struct ibv_send_wr wr_rdma(enum ibv_wr_opcode op, struct ibv_sge *sge, int nsge,
                                  uint64_t raddr, uint32_t rkey, int signaled)
{
    struct ibv_send_wr w;
    memset(&w, 0, sizeof w);
    w.wr_id = raddr;
    w.sg_list = sge;
    w.num_sge = nsge;
    w.opcode = op;
    w.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    w.wr.rdma.remote_addr = raddr;
    w.wr.rdma.rkey = rkey;
    return w;
}

/* Posts one WR and polls for its completion; returns the status. */
static enum ibv_wc_status one(struct ep *e, enum ibv_wr_opcode op, uint64_t laddr, uint32_t len,
                              uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
    struct ibv_sge sge = {laddr, len, lkey};
    struct ibv_send_wr w = wr_rdma(op, &sge, 1, raddr, rkey, 1), *bad = NULL;
    CHECK_EQ(ibv_post_send(e->qp, &w, &bad), 0);
    struct ibv_wc wc;
    int n = ibv_poll_cq(e->cq, 1, &wc);
    CHECK_EQ(n, 1);
    CHECK_EQ(wc.wr_id, raddr);
    CHECK_EQ(wc.qp_num, e->qp->qp_num);
    return wc.status;
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    CHECK_EQ(ibv_query_qp(qp, &a, IBV_QP_STATE, &ia), 0);
    return a.qp_state;
}

static struct softverbs_counters counters(void)
{
    struct softverbs_counters c;
    softverbs_counters(&c);
    return c;
}

/* A fresh initiator connected to a fresh default responder. */
struct pair {
    struct ep e;
    struct responder r;
    uint8_t *lbuf;
};

static void pair_start_opts(struct pair *p, const struct ep_opts *eo, const struct resp_opts *ro,
                            uint8_t max_rd)
{
    p->lbuf = local_buf();
    ep_open(&p->e, eo, p->lbuf, LSIZE,
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
    responder_start(&p->r, ro, &p->e, max_rd);
}

static void pair_start(struct pair *p)
{
    pair_start_opts(p, &DEFAULT_OPTS, &RESP_DEFAULT, 16);
}

static void pair_stop(struct pair *p)
{
    responder_stop(&p->r);
    ep_close(&p->e);
    free(p->lbuf);
}

/* ------------------------------------------------- post-time failures */

static void test_post_not_rts(void)
{
    uint8_t *b = local_buf();
    struct ep e;
    ep_open(&e, &DEFAULT_OPTS, b, LSIZE, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_sge sge = {(uintptr_t)b, 64, e.mr->lkey};
    struct ibv_send_wr w = wr_rdma(IBV_WR_RDMA_READ, &sge, 1, 0x1000, 1, 1), *bad = NULL;
    softverbs_reset_counters();
    CHECK_EQ(ibv_post_send(e.qp, &w, &bad), EINVAL);            /* RESET */
    CHECK(bad == &w, "bad_wr");
    CHECK_EQ(to_init(e.qp, 0), 0);
    bad = NULL;
    CHECK_EQ(ibv_post_send(e.qp, &w, &bad), EINVAL);            /* INIT */
    CHECK(bad == &w, "bad_wr");
    CHECK_EQ(to_rtr(e.qp, 0x4001, 1, 1), 0);
    CHECK_EQ(ibv_post_send(e.qp, &w, &bad), EINVAL);            /* RTR */
    struct softverbs_counters c = counters();
    CHECK_EQ(c.post_send_calls, 3);
    CHECK_EQ(c.post_failures, 3);
    CHECK_EQ(c.wrs_posted, 0);
    ep_close(&e);
    free(b);
}

static void test_post_bad_wr(void)
{
    struct pair p;
    struct ep_opts o = DEFAULT_OPTS;
    o.max_send_sge = 2;
    pair_start_opts(&p, &o, &RESP_DEFAULT, 16);
    struct ibv_sge sge[3];
    for (int i = 0; i < 3; i++)
        sge[i] = (struct ibv_sge){(uintptr_t)p.lbuf + (uint64_t)i * 64, 64, p.e.mr->lkey};
    struct ibv_send_wr ok = wr_rdma(IBV_WR_RDMA_READ, sge, 2, p.r.info.addr, p.r.info.rkey, 1);
    struct ibv_send_wr w = wr_rdma(IBV_WR_RDMA_READ, sge, 3, p.r.info.addr, p.r.info.rkey, 1);
    struct ibv_send_wr *bad = NULL;
    /* num_sge above max_send_sge: the WRs before it stay posted. */
    ok.next = &w;
    CHECK_EQ(ibv_post_send(p.e.qp, &ok, &bad), EINVAL);
    CHECK(bad == &w, "bad_wr is the 3-SGE WR");
    ok.next = NULL;
    /* Opcodes the transport never uses. */
    enum ibv_wr_opcode ops[] = {IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE_WITH_IMM,
                                IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD,
                                IBV_WR_LOCAL_INV, (enum ibv_wr_opcode)77};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        w = wr_rdma(ops[i], sge, 1, p.r.info.addr, p.r.info.rkey, 1);
        CHECK_EQ(ibv_post_send(p.e.qp, &w, &bad), EINVAL);
        CHECK(bad == &w, "bad_wr");
    }
    w = wr_rdma(IBV_WR_RDMA_READ, sge, -1, p.r.info.addr, p.r.info.rkey, 1);
    CHECK_EQ(ibv_post_send(p.e.qp, &w, &bad), EINVAL);
    w = wr_rdma(IBV_WR_RDMA_READ, NULL, 1, p.r.info.addr, p.r.info.rkey, 1);
    CHECK_EQ(ibv_post_send(p.e.qp, &w, &bad), EINVAL);
    w = wr_rdma(IBV_WR_RDMA_READ, sge, 1, p.r.info.addr, p.r.info.rkey, 1);
    w.send_flags |= IBV_SEND_INLINE;                            /* inline READ */
    CHECK_EQ(ibv_post_send(p.e.qp, &w, &bad), EINVAL);
    /* Only the first, valid WR was posted. */
    struct ibv_wc wc[4];
    CHECK_EQ(ibv_poll_cq(p.e.cq, 4, wc), 1);
    CHECK_EQ(wc[0].status, IBV_WC_SUCCESS);
    pair_stop(&p);
}

/* Unsignalled WRs keep their send-queue slots until a signalled completion
 * at or after them is polled. */
static void test_sq_overflow(void)
{
    struct pair p;
    struct ep_opts o = DEFAULT_OPTS;
    o.max_send_wr = 8;
    pair_start_opts(&p, &o, &RESP_DEFAULT, 16);
    struct ibv_sge sge = {(uintptr_t)p.lbuf, 64, p.e.mr->lkey};
    struct ibv_send_wr w[9], *bad = NULL;
    for (int i = 0; i < 9; i++) {
        w[i] = wr_rdma(IBV_WR_RDMA_READ, &sge, 1, p.r.info.addr + (uint64_t)i, p.r.info.rkey, 0);
        w[i].next = i < 8 ? &w[i + 1] : NULL;
    }
    softverbs_reset_counters();
    CHECK_EQ(ibv_post_send(p.e.qp, w, &bad), ENOMEM);
    CHECK(bad == &w[8], "the 9th WR does not fit");
    /* Executed, but nothing signalled: the slots stay taken. */
    struct ibv_wc wc[8];
    CHECK_EQ(ibv_poll_cq(p.e.cq, 8, wc), 0);
    w[8].next = NULL;
    CHECK_EQ(ibv_post_send(p.e.qp, &w[8], &bad), ENOMEM);
    struct softverbs_counters c = counters();
    CHECK_EQ(c.wrs_posted, 8);
    CHECK_EQ(c.wrs_executed, 8);
    CHECK_EQ(c.post_failures, 2);
    pair_stop(&p);

    /* 7 unsignalled + 1 signalled: polling that one frees all 8. */
    pair_start_opts(&p, &o, &RESP_DEFAULT, 16);
    sge = (struct ibv_sge){(uintptr_t)p.lbuf, 64, p.e.mr->lkey};
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 8; i++) {
            w[i] = wr_rdma(IBV_WR_RDMA_READ, &sge, 1, p.r.info.addr, p.r.info.rkey, i == 7);
            w[i].next = i < 7 ? &w[i + 1] : NULL;
        }
        CHECK_EQ(ibv_post_send(p.e.qp, w, &bad), 0);
        CHECK_EQ(ibv_poll_cq(p.e.cq, 8, wc), 1);
    }
    pair_stop(&p);
}

static void test_post_recv(void)
{
    uint8_t *b = local_buf();
    struct ep e;
    struct ep_opts o = DEFAULT_OPTS;
    o.max_recv_wr = 2;
    ep_open(&e, &o, b, LSIZE, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_sge sge = {(uintptr_t)b, 64, e.mr->lkey};
    struct ibv_recv_wr r[3] = {{.wr_id = 1, .sg_list = &sge, .num_sge = 1},
                               {.wr_id = 2, .sg_list = &sge, .num_sge = 1},
                               {.wr_id = 3, .sg_list = &sge, .num_sge = 1}};
    r[0].next = &r[1];
    r[1].next = &r[2];
    struct ibv_recv_wr *bad = NULL;
    CHECK_EQ(ibv_post_recv(e.qp, r, &bad), EINVAL);             /* RESET */
    CHECK(bad == &r[0], "bad_wr");
    CHECK_EQ(to_init(e.qp, 0), 0);
    CHECK_EQ(ibv_post_recv(e.qp, r, &bad), ENOMEM);             /* depth 2 */
    CHECK(bad == &r[2], "bad_wr");
    r[2].num_sge = 2;
    r[2].next = NULL;
    CHECK_EQ(ibv_post_recv(e.qp, &r[2], &bad), EINVAL);         /* max_recv_sge 1 */
    /* In ERR the receives complete as flushed. */
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    CHECK_EQ(ibv_modify_qp(e.qp, &a, IBV_QP_STATE), 0);
    struct ibv_wc wc[4];
    CHECK_EQ(ibv_poll_cq(e.cq, 4, wc), 2);
    CHECK(wc[0].wr_id == 1 && wc[1].wr_id == 2, "flushed in order");
    CHECK(wc[0].status == IBV_WC_WR_FLUSH_ERR && wc[0].opcode == IBV_WC_RECV, "flush");
    ep_close(&e);
    free(b);
}

/* -------------------------------------------------- error completions */

static void expect_error(struct pair *p, enum ibv_wr_opcode op, uint64_t laddr, uint32_t len,
                         uint32_t lkey, uint64_t raddr, uint32_t rkey, enum ibv_wc_status want)
{
    enum ibv_wc_status st = one(&p->e, op, laddr, len, lkey, raddr, rkey);
    CHECK(st == want, "status %s, expected %s", ibv_wc_status_str(st), ibv_wc_status_str(want));
    CHECK_EQ(qp_state(p->e.qp), IBV_QPS_ERR);
}

/* Each case on a fresh pair: the error leaves the QP in ERR. */
#define ERROR_CASE(op, laddr, len, lkey, raddr, rkey, want)                    \
    do {                                                                       \
        struct pair p_;                                                        \
        pair_start(&p_);                                                       \
        struct pair *p = &p_;                                                  \
        expect_error(p, op, laddr, len, lkey, raddr, rkey, want);              \
        pair_stop(p);                                                          \
    } while (0)

#define L(p) ((uintptr_t)(p)->lbuf)
#define R(p) ((p)->r.info.addr)

static void test_local_protection(void)
{
    /* Unknown lkey, lkey off by a generation. */
    ERROR_CASE(IBV_WR_RDMA_READ, L(p), 64, 0x12345678, R(p), p->r.info.rkey, IBV_WC_LOC_PROT_ERR);
    ERROR_CASE(IBV_WR_RDMA_READ, L(p), 64, p->e.mr->lkey + (1u << 16), R(p), p->r.info.rkey,
               IBV_WC_LOC_PROT_ERR);
    /* Local range past either end of the MR. */
    ERROR_CASE(IBV_WR_RDMA_READ, L(p) + LSIZE - 10, 64, p->e.mr->lkey, R(p), p->r.info.rkey,
               IBV_WC_LOC_PROT_ERR);
    ERROR_CASE(IBV_WR_RDMA_WRITE, L(p) - 1, 64, p->e.mr->lkey, R(p), p->r.info.rkey,
               IBV_WC_LOC_PROT_ERR);
    /* The responder's key is no lkey of ours (another process's MR). */
    ERROR_CASE(IBV_WR_RDMA_WRITE, R(p), 64, p->r.info.rkey, R(p), p->r.info.rkey,
               IBV_WC_LOC_PROT_ERR);

    /* An MR of another PD, and a READ into an MR without LOCAL_WRITE. */
    struct pair p;
    pair_start(&p);
    struct ibv_mr *other_pd = ibv_reg_mr(p.e.pd2, p.lbuf, 4096, IBV_ACCESS_LOCAL_WRITE);
    CHECK(other_pd, "mr");
    expect_error(&p, IBV_WR_RDMA_READ, L(&p), 64, other_pd->lkey, R(&p), p.r.info.rkey,
                 IBV_WC_LOC_PROT_ERR);
    CHECK_EQ(ibv_dereg_mr(other_pd), 0);
    pair_stop(&p);

    pair_start(&p);
    struct ibv_mr *ro = ibv_reg_mr(p.e.pd, p.lbuf, 4096, 0);
    CHECK(ro, "mr");
    /* A WRITE only reads local memory: fine without LOCAL_WRITE. */
    CHECK_EQ(one(&p.e, IBV_WR_RDMA_WRITE, L(&p), 64, ro->lkey, R(&p), p.r.info.rkey),
             IBV_WC_SUCCESS);
    expect_error(&p, IBV_WR_RDMA_READ, L(&p), 64, ro->lkey, R(&p), p.r.info.rkey,
                 IBV_WC_LOC_PROT_ERR);
    CHECK_EQ(ibv_dereg_mr(ro), 0);
    pair_stop(&p);
}

static void test_remote_access(void)
{
    ERROR_CASE(IBV_WR_RDMA_READ, L(p), 64, p->e.mr->lkey, R(p), 0x7777, IBV_WC_REM_ACCESS_ERR);
    ERROR_CASE(IBV_WR_RDMA_READ, L(p), 64, p->e.mr->lkey, R(p), p->r.info.rkey ^ (1u << 20),
               IBV_WC_REM_ACCESS_ERR);
    /* Past the end, before the start, a length that wraps. */
    ERROR_CASE(IBV_WR_RDMA_READ, L(p), 64, p->e.mr->lkey, R(p) + RSIZE - 63, p->r.info.rkey,
               IBV_WC_REM_ACCESS_ERR);
    ERROR_CASE(IBV_WR_RDMA_WRITE, L(p), 64, p->e.mr->lkey, R(p) - 64, p->r.info.rkey,
               IBV_WC_REM_ACCESS_ERR);
    ERROR_CASE(IBV_WR_RDMA_READ, L(p), 64, p->e.mr->lkey, UINT64_MAX - 10, p->r.info.rkey,
               IBV_WC_REM_ACCESS_ERR);
    /* An MR of another PD than the responder QP's. */
    ERROR_CASE(IBV_WR_RDMA_READ, L(p), 64, p->e.mr->lkey, R(p), p->r.info.rkey_other_pd,
               IBV_WC_REM_ACCESS_ERR);
    /* Our own MR's key used as rkey: not the responder's. */
    ERROR_CASE(IBV_WR_RDMA_READ, L(p) + 4096, 64, p->e.mr->lkey, L(p), p->e.mr->rkey,
               IBV_WC_REM_ACCESS_ERR);
    /* A read-only MR: READ fine, WRITE refused. */
    ERROR_CASE(IBV_WR_RDMA_WRITE, L(p), 64, p->e.mr->lkey, R(p), p->r.info.rkey_ro,
               IBV_WC_REM_ACCESS_ERR);
    struct pair p;
    pair_start(&p);
    CHECK_EQ(one(&p.e, IBV_WR_RDMA_READ, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey_ro),
             IBV_WC_SUCCESS);
    pair_stop(&p);

    /* MR without REMOTE_READ; responder QP without REMOTE_WRITE. */
    struct resp_opts ro = RESP_DEFAULT;
    ro.mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    pair_start_opts(&p, &DEFAULT_OPTS, &ro, 16);
    CHECK_EQ(one(&p.e, IBV_WR_RDMA_WRITE, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey),
             IBV_WC_SUCCESS);
    expect_error(&p, IBV_WR_RDMA_READ, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey,
                 IBV_WC_REM_ACCESS_ERR);
    pair_stop(&p);
    ro = RESP_DEFAULT;
    ro.qp_access = IBV_ACCESS_REMOTE_READ;
    pair_start_opts(&p, &DEFAULT_OPTS, &ro, 16);
    CHECK_EQ(one(&p.e, IBV_WR_RDMA_READ, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey),
             IBV_WC_SUCCESS);
    expect_error(&p, IBV_WR_RDMA_WRITE, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey,
                 IBV_WC_REM_ACCESS_ERR);
    pair_stop(&p);
}

static void test_stale_rkey(void)
{
    struct pair p;
    pair_start(&p);
    CHECK_EQ(one(&p.e, IBV_WR_RDMA_READ, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey),
             IBV_WC_SUCCESS);
    responder_cmd(&p.r, CMD_DEREG);
    expect_error(&p, IBV_WR_RDMA_READ, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey,
                 IBV_WC_REM_ACCESS_ERR);
    pair_stop(&p);

    /* Our own lkey after dereg: the slot may be reused, the key is not. */
    pair_start(&p);
    struct ibv_mr *mr = ibv_reg_mr(p.e.pd, p.lbuf, 4096, IBV_ACCESS_LOCAL_WRITE);
    uint32_t old = mr->lkey;
    CHECK_EQ(ibv_dereg_mr(mr), 0);
    mr = ibv_reg_mr(p.e.pd, p.lbuf, 4096, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr->lkey != old, "a new key");
    expect_error(&p, IBV_WR_RDMA_READ, L(&p), 64, old, R(&p), p.r.info.rkey, IBV_WC_LOC_PROT_ERR);
    CHECK_EQ(ibv_dereg_mr(mr), 0);
    pair_stop(&p);
}

static void test_rd_atomic(void)
{
    /* Our max_rd_atomic 8 against the responder's max_dest_rd_atomic 4. */
    struct pair p;
    struct resp_opts ro = RESP_DEFAULT;
    ro.max_dest_rd = 4;
    pair_start_opts(&p, &DEFAULT_OPTS, &ro, 8);
    CHECK_EQ(one(&p.e, IBV_WR_RDMA_WRITE, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey),
             IBV_WC_SUCCESS);           /* WRITEs take no read resources */
    expect_error(&p, IBV_WR_RDMA_READ, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey,
                 IBV_WC_REM_INV_REQ_ERR);
    pair_stop(&p);
    pair_start_opts(&p, &DEFAULT_OPTS, &ro, 4);
    CHECK_EQ(one(&p.e, IBV_WR_RDMA_READ, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey),
             IBV_WC_SUCCESS);
    pair_stop(&p);
}

static void test_responder_gone(void)
{
    /* Its QP destroyed. */
    struct pair p;
    pair_start(&p);
    responder_cmd(&p.r, CMD_DESTROY_QP);
    expect_error(&p, IBV_WR_RDMA_READ, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey,
                 IBV_WC_RETRY_EXC_ERR);
    pair_stop(&p);

    /* Its process dead (killed, reaped). */
    pair_start(&p);
    kill(p.r.pid, SIGKILL);
    CHECK(waitpid(p.r.pid, NULL, 0) == p.r.pid, "waitpid");
    expect_error(&p, IBV_WR_RDMA_READ, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey,
                 IBV_WC_RETRY_EXC_ERR);
    close(p.r.to);
    close(p.r.from);
    munmap(p.r.buf, RSIZE);
    ep_close(&p.e);
    free(p.lbuf);

    /* Its QP left in INIT. */
    struct resp_opts ro = RESP_DEFAULT;
    ro.stop_at_init = 1;
    pair_start_opts(&p, &DEFAULT_OPTS, &ro, 16);
    expect_error(&p, IBV_WR_RDMA_READ, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey,
                 IBV_WC_RETRY_EXC_ERR);
    pair_stop(&p);

    /* Its QP connected to another QPN. */
    ro = RESP_DEFAULT;
    ro.connect_elsewhere = 1;
    pair_start_opts(&p, &DEFAULT_OPTS, &ro, 16);
    expect_error(&p, IBV_WR_RDMA_WRITE, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey,
                 IBV_WC_RETRY_EXC_ERR);
    pair_stop(&p);

    /* Our AV names another LID. */
    p.lbuf = local_buf();
    ep_open(&p.e, &DEFAULT_OPTS, p.lbuf, LSIZE, IBV_ACCESS_LOCAL_WRITE);
    responder_start(&p.r, &RESP_DEFAULT, &p.e, 16);
    CHECK_EQ(ibv_modify_qp(p.e.qp, &(struct ibv_qp_attr){.qp_state = IBV_QPS_RESET}, IBV_QP_STATE), 0);
    CHECK_EQ(to_init(p.e.qp, 0), 0);
    CHECK_EQ(to_rtr(p.e.qp, p.r.info.qpn, (uint16_t)(p.r.info.lid % 0xbffe + 1), 1), 0);
    CHECK_EQ(to_rts(p.e.qp, 1), 0);
    expect_error(&p, IBV_WR_RDMA_READ, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey,
                 IBV_WC_RETRY_EXC_ERR);
    pair_stop(&p);
}

/* An error completion moves the QP to ERR; what follows is flushed, and
 * both are reported although unsignalled. */
static void test_error_flush(void)
{
    struct pair p;
    pair_start(&p);
    struct ibv_sge sge = {L(&p), 64, p.e.mr->lkey};
    struct ibv_send_wr w[4], *bad;
    for (int i = 0; i < 4; i++) {
        w[i] = wr_rdma(IBV_WR_RDMA_READ, &sge, 1, R(&p) + (uint64_t)i, p.r.info.rkey, 0);
        w[i].next = i < 3 ? &w[i + 1] : NULL;
    }
    w[1].wr.rdma.rkey = 0x4242;
    softverbs_reset_counters();
    CHECK_EQ(ibv_post_send(p.e.qp, w, &bad), 0);
    struct ibv_wc wc[8];
    CHECK_EQ(ibv_poll_cq(p.e.cq, 8, wc), 3);
    CHECK(wc[0].wr_id == R(&p) + 1 && wc[0].status == IBV_WC_REM_ACCESS_ERR, "the error");
    CHECK(wc[1].wr_id == R(&p) + 2 && wc[1].status == IBV_WC_WR_FLUSH_ERR, "flush");
    CHECK(wc[2].wr_id == R(&p) + 3 && wc[2].status == IBV_WC_WR_FLUSH_ERR, "flush");
    CHECK_EQ(qp_state(p.e.qp), IBV_QPS_ERR);
    /* Posting in ERR is accepted; the WR is flushed, nothing moves. */
    memset(p.lbuf, 0xee, 64);
    w[0].next = NULL;
    CHECK_EQ(ibv_post_send(p.e.qp, w, &bad), 0);
    CHECK_EQ(ibv_poll_cq(p.e.cq, 8, wc), 1);
    CHECK_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
    CHECK_EQ(p.lbuf[0], 0xee);
    struct softverbs_counters c = counters();
    CHECK_EQ(c.wrs_posted, 5);
    CHECK_EQ(c.wrs_executed, 2);
    CHECK_EQ(c.completions, 4);
    CHECK_EQ(c.error_completions, 4);

    /* RESET, then connected again, works again. */
    CHECK_EQ(ibv_modify_qp(p.e.qp, &(struct ibv_qp_attr){.qp_state = IBV_QPS_RESET}, IBV_QP_STATE), 0);
    connect_qp(p.e.qp, p.r.info.qpn, p.r.info.lid, 16, 16);
    CHECK_EQ(one(&p.e, IBV_WR_RDMA_READ, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey),
             IBV_WC_SUCCESS);
    CHECK(memcmp(p.lbuf, p.r.buf, 64) == 0, "bytes after reconnect");
    pair_stop(&p);
}

static void test_cq_overflow(void)
{
    struct pair p;
    struct ep_opts o = DEFAULT_OPTS;
    o.cqe = 4;
    pair_start_opts(&p, &o, &RESP_DEFAULT, 16);
    struct ibv_sge sge = {L(&p), 64, p.e.mr->lkey};
    struct ibv_send_wr w[5], *bad;
    /* 4 signalled fit the CQ. */
    for (int i = 0; i < 5; i++) {
        w[i] = wr_rdma(IBV_WR_RDMA_READ, &sge, 1, R(&p), p.r.info.rkey, 1);
        w[i].next = i < 3 ? &w[i + 1] : NULL;
    }
    struct ibv_wc wc[8];
    CHECK_EQ(ibv_post_send(p.e.qp, w, &bad), 0);
    CHECK_EQ(ibv_poll_cq(p.e.cq, 1, wc), 1);
    CHECK_EQ(ibv_poll_cq(p.e.cq, 8, wc), 3);
    /* 5 do not. */
    w[3].next = &w[4];
    softverbs_reset_counters();
    CHECK_EQ(ibv_post_send(p.e.qp, w, &bad), 0);
    CHECK_EQ(ibv_poll_cq(p.e.cq, 8, wc), -1);
    CHECK_EQ(ibv_poll_cq(p.e.cq, 8, wc), -1);                   /* for good */
    CHECK_EQ(counters().cq_overflows, 1);
    pair_stop(&p);
}

static void test_inject_error(void)
{
    struct pair p;
    pair_start(&p);
    struct ibv_sge sge = {L(&p), 64, p.e.mr->lkey};
    struct ibv_send_wr w[3], *bad;
    for (int i = 0; i < 3; i++) {
        w[i] = wr_rdma(IBV_WR_RDMA_READ, &sge, 1, R(&p) + (uint64_t)i, p.r.info.rkey, 1);
        w[i].next = i < 2 ? &w[i + 1] : NULL;
    }
    softverbs_inject_error(1, IBV_WC_REM_OP_ERR);
    CHECK_EQ(ibv_post_send(p.e.qp, w, &bad), 0);
    struct ibv_wc wc[4];
    CHECK_EQ(ibv_poll_cq(p.e.cq, 4, wc), 3);
    CHECK_EQ(wc[0].status, IBV_WC_SUCCESS);
    CHECK_EQ(wc[1].status, IBV_WC_REM_OP_ERR);
    CHECK_EQ(wc[2].status, IBV_WC_WR_FLUSH_ERR);
    pair_stop(&p);
    /* It fires once. */
    pair_start(&p);
    CHECK_EQ(one(&p.e, IBV_WR_RDMA_READ, L(&p), 64, p.e.mr->lkey, R(&p), p.r.info.rkey),
             IBV_WC_SUCCESS);
    pair_stop(&p);
}

/* Two QPs of one process connected to each other (max_rd_atomic 4). */
static void loop_open(struct ep *x, struct ep *y, uint8_t *a, uint8_t *b, const struct ep_opts *o)
{
    unsigned all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    ep_open(x, o, a, LSIZE, (int)all);
    ep_open(y, o, b, LSIZE, (int)all);
    connect_qp(x->qp, y->qp->qp_num, y->lid, 4, 4);
    connect_qp(y->qp, x->qp->qp_num, x->lid, 4, 4);
}

/* Destroying a QP drops its queued WRs and its completions still in the
 * CQ: nothing moves, nothing is reported. */
static void test_destroy_drops(void)
{
    struct pair p;
    pair_start(&p);
    struct ibv_sge sge = {L(&p), 64, p.e.mr->lkey};
    struct ibv_send_wr w = wr_rdma(IBV_WR_RDMA_READ, &sge, 1, R(&p), p.r.info.rkey, 1), *bad;
    CHECK_EQ(ibv_post_send(p.e.qp, &w, &bad), 0);
    CHECK_EQ(ibv_destroy_qp(p.e.qp), 0);
    struct ibv_wc wc;
    CHECK_EQ(ibv_poll_cq(p.e.cq, 1, &wc), 0);
    CHECK_EQ(p.lbuf[0], 0xee);
    struct ibv_qp_init_attr ia = {.send_cq = p.e.cq, .recv_cq = p.e.cq, .qp_type = IBV_QPT_RC,
                                  .cap = {16, 1, 1, 1, 0}};
    p.e.qp = ibv_create_qp(p.e.pd, &ia);
    CHECK(p.e.qp, "qp");
    pair_stop(&p);

    uint8_t *a = local_buf(), *b = local_buf();
    struct ep x, y;
    loop_open(&x, &y, a, b, &DEFAULT_OPTS);
    sge = (struct ibv_sge){(uintptr_t)a, 64, x.mr->lkey};
    w = wr_rdma(IBV_WR_RDMA_READ, &sge, 1, (uintptr_t)b, y.mr->rkey, 1);
    CHECK_EQ(ibv_post_send(x.qp, &w, &bad), 0);
    CHECK_EQ(ibv_poll_cq(x.cq, 0, &wc), 0);     /* runs the WR, its CQE waits */
    CHECK_EQ(ibv_destroy_qp(x.qp), 0);
    CHECK_EQ(ibv_poll_cq(x.cq, 1, &wc), 0);
    ia.send_cq = ia.recv_cq = x.cq;
    x.qp = ibv_create_qp(x.pd, &ia);
    CHECK(x.qp, "qp");
    ep_close(&x);
    ep_close(&y);
    free(a);
    free(b);
}

/* Posting threads and a polling thread on one CQ shared by two QPs. */
struct hammer {
    struct ep *e;
    uint32_t rkey;
    uint64_t raddr;
    int rounds;
};

static void *post_thread(void *arg)
{
    struct hammer *h = arg;
    struct ibv_sge sge[8];
    struct ibv_send_wr w[8], *bad;
    for (int r = 0; r < h->rounds; r++) {
        for (int i = 0; i < 8; i++) {
            sge[i] = (struct ibv_sge){(uintptr_t)h->e->buf + (uint64_t)i * 512, 512, h->e->mr->lkey};
            w[i] = wr_rdma(i % 2 ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ, &sge[i], 1,
                           h->raddr + (uint64_t)i * 512, h->rkey, i == 7);
            w[i].next = i < 7 ? &w[i + 1] : NULL;
        }
        int rc;
        while ((rc = ibv_post_send(h->e->qp, w, &bad)) == ENOMEM && bad == w)
            sched_yield();              /* the poller has not retired our slots yet */
        CHECK_EQ(rc, 0);
    }
    return NULL;
}

static void test_threads(void)
{
    uint8_t *a = local_buf(), *b = local_buf(), *c = local_buf();
    struct ep_opts o = DEFAULT_OPTS;
    o.max_send_wr = 32;
    o.cqe = 64;
    unsigned all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    /* x and z share x's CQ; RC is one to one, so z's responder is y2, a
     * second QP next to y. */
    struct ep x, y;
    loop_open(&x, &y, a, b, &o);
    struct ibv_qp_init_attr ia = {.send_cq = x.cq, .recv_cq = x.cq, .qp_type = IBV_QPT_RC,
                                  .cap = {32, 1, 1, 1, 0}};
    struct ibv_qp *z = ibv_create_qp(x.pd, &ia);
    ia.send_cq = ia.recv_cq = y.cq;
    struct ibv_qp *y2 = ibv_create_qp(y.pd, &ia);
    CHECK(z && y2, "qps");
    connect_qp(z, y2->qp_num, y.lid, 4, 4);
    connect_qp(y2, z->qp_num, x.lid, 4, 4);
    struct ibv_mr *cmr = ibv_reg_mr(x.pd, c, LSIZE, (int)all);
    CHECK(cmr, "mr");
    struct ep zep = {.qp = z, .buf = c, .mr = cmr};

    enum { ROUNDS = 300 };
    struct hammer h1 = {&x, y.mr->rkey, (uintptr_t)b, ROUNDS};
    struct hammer h2 = {&zep, y.mr->rkey, (uintptr_t)b + 8192, ROUNDS};
    softverbs_reset_counters();
    pthread_t t1, t2;
    CHECK(pthread_create(&t1, NULL, post_thread, &h1) == 0, "thread");
    CHECK(pthread_create(&t2, NULL, post_thread, &h2) == 0, "thread");
    int got = 0;
    struct ibv_wc wc[16];
    while (got < 2 * ROUNDS) {
        int n = ibv_poll_cq(x.cq, 16, wc);
        CHECK(n >= 0, "poll");
        for (int i = 0; i < n; i++)
            CHECK(wc[i].status == IBV_WC_SUCCESS, "status %s", ibv_wc_status_str(wc[i].status));
        got += n;
    }
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    struct softverbs_counters k = counters();
    CHECK_EQ(k.wrs_posted, 2 * ROUNDS * 8);
    CHECK_EQ(k.wrs_executed, 2 * ROUNDS * 8);
    CHECK_EQ(k.completions, 2 * ROUNDS);
    CHECK_EQ(ibv_dereg_mr(cmr), 0);
    CHECK_EQ(ibv_destroy_qp(z), 0);
    CHECK_EQ(ibv_destroy_qp(y2), 0);
    ep_close(&x);
    ep_close(&y);
    free(a);
    free(b);
    free(c);
}

/* Run in a re-executed copy with SOFTVERBS_LINK_LAYER=ethernet (the link
 * layer is read once per process). */
static void test_ethernet_child(void)
{
    struct ibv_context *ctx = open_dev();
    struct ibv_port_attr pa;
    CHECK_EQ(ibv_query_port(ctx, 1, &pa), 0);
    CHECK_EQ(pa.link_layer, IBV_LINK_LAYER_ETHERNET);
    CHECK_EQ(pa.lid, 0);
    CHECK_EQ(pa.gid_tbl_len, 2);
    union ibv_gid gid;
    CHECK_EQ(ibv_query_gid(ctx, 1, 1, &gid), 0);
    static const uint8_t v4[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
    CHECK(memcmp(gid.raw, v4, 16) == 0, "::ffff:127.0.0.1");
    CHECK_EQ(ibv_close_device(ctx), 0);

    uint8_t *a = local_buf(), *b = local_buf();
    struct ep x, y;
    unsigned all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    ep_open(&x, &DEFAULT_OPTS, a, LSIZE, (int)all);
    ep_open(&y, &DEFAULT_OPTS, b, LSIZE, (int)all);
    struct ibv_qp *qps[2] = {x.qp, y.qp};
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(to_init(qps[i], all), 0);
        struct ibv_qp_attr at = {
            .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = qps[1 - i]->qp_num,
            .max_dest_rd_atomic = 4, .ah_attr = {.dlid = 0, .port_num = 1},
        };
        unsigned rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        CHECK_EQ(ibv_modify_qp(qps[i], &at, (int)rtr), EINVAL);   /* RoCE needs a GRH */
        at.ah_attr.is_global = 1;
        CHECK_EQ(ibv_modify_qp(qps[i], &at, (int)rtr), EINVAL);   /* ... with a DGID */
        at.ah_attr.grh.dgid = gid;
        at.ah_attr.grh.sgid_index = 2;
        CHECK_EQ(ibv_modify_qp(qps[i], &at, (int)rtr), EINVAL);   /* GID index 2 */
        at.ah_attr.grh.sgid_index = 1;
        CHECK_EQ(ibv_modify_qp(qps[i], &at, (int)rtr), 0);
        CHECK_EQ(to_rts(qps[i], 4), 0);
    }
    CHECK_EQ(one(&x, IBV_WR_RDMA_READ, (uintptr_t)a, 4096, x.mr->lkey, (uintptr_t)b + 1,
                 y.mr->rkey), IBV_WC_SUCCESS);
    CHECK(memcmp(a, b + 1, 4096) == 0, "RoCE READ");
    ep_close(&x);
    ep_close(&y);
    free(a);
    free(b);
}

/* Runs this program again as `test_softverbs mode` with one more
 * SOFTVERBS_* variable: the configuration is read once per process. */
static void run_child(const char *mode, const char *name, const char *value)
{
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        setenv(name, value, 1);
        execl("/proc/self/exe", "test_softverbs", mode, (char *)NULL);
        _exit(127);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s child: status %d", mode, status);
}

static void test_ethernet(void)
{
    run_child("ethernet", "SOFTVERBS_LINK_LAYER", "ethernet");
}

/* SOFTVERBS_MTU=1024: the port says so, and a path MTU above it is refused. */
static void test_port_mtu_child(void)
{
    struct ibv_context *ctx = open_dev();
    struct ibv_port_attr pa;
    CHECK_EQ(ibv_query_port(ctx, 1, &pa), 0);
    CHECK_EQ(pa.active_mtu, IBV_MTU_1024);
    CHECK_EQ(pa.max_mtu, IBV_MTU_4096);
    CHECK_EQ(ibv_close_device(ctx), 0);
    uint8_t *b = local_buf();
    struct ep e;
    ep_open(&e, &DEFAULT_OPTS, b, LSIZE, IBV_ACCESS_LOCAL_WRITE);
    CHECK_EQ(to_init(e.qp, IBV_ACCESS_LOCAL_WRITE), 0);
    CHECK_EQ(to_rtr_mtu(e.qp, e.qp->qp_num, e.lid, 4, IBV_MTU_2048), EINVAL);
    CHECK_EQ(to_rtr_mtu(e.qp, e.qp->qp_num, e.lid, 4, IBV_MTU_1024), 0);
    ep_close(&e);
    free(b);
}

static void test_port_mtu(void)
{
    run_child("mtu", "SOFTVERBS_MTU", "1024");
}

/* Two QPs whose path MTUs differ: a message that fits the smaller one
 * goes, a longer one is dropped by the receiver until the retries end. */
static void test_path_mtu_mismatch(void)
{
    uint8_t *a = local_buf(), *b = local_buf();
    struct ep x, y;
    unsigned all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    ep_open(&x, &DEFAULT_OPTS, a, LSIZE, (int)all);
    ep_open(&y, &DEFAULT_OPTS, b, LSIZE, (int)all);
    CHECK_EQ(to_init(x.qp, all), 0);
    CHECK_EQ(to_rtr_mtu(x.qp, y.qp->qp_num, y.lid, 4, IBV_MTU_4096), 0);
    CHECK_EQ(to_rts(x.qp, 4), 0);
    CHECK_EQ(to_init(y.qp, all), 0);
    CHECK_EQ(to_rtr_mtu(y.qp, x.qp->qp_num, x.lid, 4, IBV_MTU_1024), 0);
    CHECK_EQ(to_rts(y.qp, 4), 0);
    CHECK_EQ(one(&x, IBV_WR_RDMA_READ, (uintptr_t)a, 1024, x.mr->lkey, (uintptr_t)b, y.mr->rkey),
             IBV_WC_SUCCESS);
    CHECK_EQ(one(&y, IBV_WR_RDMA_WRITE, (uintptr_t)b, 1025, y.mr->lkey, (uintptr_t)a, x.mr->rkey),
             IBV_WC_RETRY_EXC_ERR);
    CHECK_EQ(one(&x, IBV_WR_RDMA_READ, (uintptr_t)a, 1025, x.mr->lkey, (uintptr_t)b, y.mr->rkey),
             IBV_WC_RETRY_EXC_ERR);
    ep_close(&x);
    ep_close(&y);
    free(a);
    free(b);
}

/* ------------------------------------------------------- verbs objects */

static void test_modify_qp(void)
{
    uint8_t *b = local_buf();
    struct ep e;
    ep_open(&e, &DEFAULT_OPTS, b, LSIZE, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR};
    /* Illegal transitions. */
    CHECK_EQ(ibv_modify_qp(e.qp, &a, IBV_QP_STATE), EINVAL);    /* RESET->RTR */
    a.qp_state = IBV_QPS_RTS;
    CHECK_EQ(ibv_modify_qp(e.qp, &a, IBV_QP_STATE), EINVAL);
    a.qp_state = IBV_QPS_SQD;
    CHECK_EQ(ibv_modify_qp(e.qp, &a, IBV_QP_STATE), EINVAL);
    /* RESET->INIT: a required bit missing, a bit not allowed, bad values. */
    a = (struct ibv_qp_attr){.qp_state = IBV_QPS_INIT, .port_num = 1};
    CHECK_EQ(ibv_modify_qp(e.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL);
    CHECK_EQ(ibv_modify_qp(e.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                         IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MTU), EINVAL);
    a.port_num = 2;
    CHECK_EQ(ibv_modify_qp(e.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                         IBV_QP_ACCESS_FLAGS), EINVAL);
    a.port_num = 1;
    a.pkey_index = 1;
    CHECK_EQ(ibv_modify_qp(e.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                         IBV_QP_ACCESS_FLAGS), EINVAL);
    CHECK_EQ(qp_state(e.qp), IBV_QPS_RESET);
    CHECK_EQ(to_init(e.qp, 0), 0);
    CHECK_EQ(to_init(e.qp, IBV_ACCESS_REMOTE_READ), 0);         /* INIT->INIT, full mask */

    /* INIT->RTR: each required bit missing in turn. */
    unsigned rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_4096,
                             .dest_qp_num = 0x4001, .max_dest_rd_atomic = 16,
                             .ah_attr = {.dlid = 5, .port_num = 1}};
    for (unsigned bit = IBV_QP_AV; bit <= IBV_QP_DEST_QPN; bit <<= 1)
        if ((rtr & bit) && bit != IBV_QP_STATE)
            CHECK_EQ(ibv_modify_qp(e.qp, &a, (int)(rtr & ~bit)), EINVAL);
    a.max_dest_rd_atomic = 17;                                  /* above max_qp_rd_atom */
    CHECK_EQ(ibv_modify_qp(e.qp, &a, (int)rtr), EINVAL);
    a.max_dest_rd_atomic = 16;
    a.path_mtu = (enum ibv_mtu)6;                               /* above the port's 4096 */
    CHECK_EQ(ibv_modify_qp(e.qp, &a, (int)rtr), EINVAL);
    a.path_mtu = IBV_MTU_4096;
    a.ah_attr.dlid = 0;                                         /* IB needs a DLID */
    CHECK_EQ(ibv_modify_qp(e.qp, &a, (int)rtr), EINVAL);
    a.ah_attr.dlid = 5;
    a.dest_qp_num = 1u << 24;
    CHECK_EQ(ibv_modify_qp(e.qp, &a, (int)rtr), EINVAL);
    a.dest_qp_num = 0x4001;
    CHECK_EQ(qp_state(e.qp), IBV_QPS_INIT);
    CHECK_EQ(ibv_modify_qp(e.qp, &a, (int)rtr), 0);

    /* RTR->RTS: max_rd_atomic above the device, a missing bit. */
    a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
                             .rnr_retry = 7, .max_rd_atomic = 17};
    unsigned rts = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                   IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    CHECK_EQ(ibv_modify_qp(e.qp, &a, (int)rts), EINVAL);
    a.max_rd_atomic = 16;
    CHECK_EQ(ibv_modify_qp(e.qp, &a, (int)(rts & ~IBV_QP_MAX_QP_RD_ATOMIC)), EINVAL);
    CHECK_EQ(ibv_modify_qp(e.qp, &a, (int)(rts | IBV_QP_DEST_QPN)), EINVAL);
    CHECK_EQ(ibv_modify_qp(e.qp, &a, (int)rts), 0);
    CHECK_EQ(qp_state(e.qp), IBV_QPS_RTS);
    /* RTS->INIT is illegal; RTS->ERR->RESET is fine. */
    a = (struct ibv_qp_attr){.qp_state = IBV_QPS_INIT};
    CHECK_EQ(ibv_modify_qp(e.qp, &a, IBV_QP_STATE), EINVAL);
    a.qp_state = IBV_QPS_ERR;
    CHECK_EQ(ibv_modify_qp(e.qp, &a, IBV_QP_STATE), 0);
    a.qp_state = IBV_QPS_RESET;
    CHECK_EQ(ibv_modify_qp(e.qp, &a, IBV_QP_STATE), 0);

    struct ibv_qp_attr q;
    struct ibv_qp_init_attr qi;
    CHECK_EQ(ibv_query_qp(e.qp, &q, IBV_QP_STATE | IBV_QP_CAP, &qi), 0);
    CHECK_EQ(q.qp_state, IBV_QPS_RESET);
    CHECK_EQ(qi.cap.max_send_wr, 256);
    CHECK_EQ(qi.cap.max_send_sge, 16);
    ep_close(&e);
    free(b);
}

static void test_create_checks(void)
{
    struct ibv_context *ctx = open_dev();
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    CHECK(pd && cq, "pd, cq");
    CHECK(!ibv_create_cq(ctx, 0, NULL, NULL, 0) && errno == EINVAL, "cqe 0");
    CHECK(!ibv_create_cq(ctx, 65537, NULL, NULL, 0) && errno == EINVAL, "cqe above max");

    struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                  .cap = {4097, 1, 1, 1, 0}};
    CHECK(!ibv_create_qp(pd, &ia) && errno == EINVAL, "max_send_wr above max_qp_wr");
    ia.cap = (struct ibv_qp_cap){1, 4097, 1, 1, 0};
    CHECK(!ibv_create_qp(pd, &ia) && errno == EINVAL, "max_recv_wr above max_qp_wr");
    ia.cap = (struct ibv_qp_cap){1, 1, 17, 1, 0};
    CHECK(!ibv_create_qp(pd, &ia) && errno == EINVAL, "max_send_sge above max_sge");
    ia.cap = (struct ibv_qp_cap){1, 1, 1, 17, 0};
    CHECK(!ibv_create_qp(pd, &ia) && errno == EINVAL, "max_recv_sge above max_sge");
    ia.cap = (struct ibv_qp_cap){1, 1, 1, 1, 0};
    ia.qp_type = IBV_QPT_UD;
    CHECK(!ibv_create_qp(pd, &ia) && errno == EOPNOTSUPP, "UD");
    ia.qp_type = IBV_QPT_RC;
    ia.send_cq = NULL;
    CHECK(!ibv_create_qp(pd, &ia) && errno == EINVAL, "no CQ");
    ia.send_cq = cq;
    struct ibv_qp *qp = ibv_create_qp(pd, &ia);
    CHECK(qp, "qp");
    CHECK(qp->qp_num > 1 && qp->qp_num < (1u << 24), "24-bit QPN");

    /* Registration arguments. */
    static uint8_t mem[8192];
    CHECK(!ibv_reg_mr(pd, mem, 0, 0) && errno == EINVAL, "length 0");
    CHECK(!ibv_reg_mr(pd, NULL, 64, 0) && errno == EINVAL, "NULL");
    CHECK(!ibv_reg_mr(pd, mem, 64, IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL,
          "REMOTE_WRITE needs LOCAL_WRITE");
    CHECK(!ibv_reg_mr(pd, mem, 64, 1 << 12) && errno == EINVAL, "unknown flag");
    /* dma-buf: a bad fd, and a memfd which is no dma-buf. */
    CHECK(!ibv_reg_dmabuf_mr(pd, 0, 4096, 0x7f0000000000ull, -1, IBV_ACCESS_LOCAL_WRITE) &&
              errno == EINVAL, "fd -1");
    int fd = memfd_create("not-a-dmabuf", 0);
    CHECK(fd >= 0 && ftruncate(fd, 8192) == 0, "memfd");
    CHECK(!ibv_reg_dmabuf_mr(pd, 0, 4096, 0x7f0000000000ull, fd, IBV_ACCESS_LOCAL_WRITE) &&
              errno == EINVAL, "memfd is no dma-buf");
    close(fd);

    struct ibv_mr *mr = ibv_reg_mr(pd, mem, sizeof mem, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr && mr->lkey == mr->rkey && mr->lkey != 0, "mr");
    /* Busy objects. */
    CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
    CHECK_EQ(ibv_destroy_cq(cq), EBUSY);
    CHECK_EQ(ibv_dereg_mr(mr), 0);
    CHECK_EQ(ibv_dealloc_pd(pd), EBUSY);
    CHECK_EQ(ibv_destroy_qp(qp), 0);
    CHECK_EQ(ibv_destroy_cq(cq), 0);
    CHECK_EQ(ibv_dealloc_pd(pd), 0);
    CHECK_EQ(ibv_close_device(ctx), 0);
}

/* --------------------------------------------------------- the device */

static void test_device(void)
{
    int n = -1;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n == 1 && list[1] == NULL, "one device");
    CHECK(strcmp(ibv_get_device_name(list[0]), "softverbs0") == 0, "name");
    CHECK(ibv_get_device_guid(list[0]) != 0, "guid");
    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx, "open");
    ibv_free_device_list(list);

    struct ibv_device_attr da;
    CHECK_EQ(ibv_query_device(ctx, &da), 0);
    CHECK_EQ(da.max_qp_wr, 4096);
    CHECK_EQ(da.max_sge, 16);
    CHECK_EQ(da.max_qp_rd_atom, 16);
    CHECK_EQ(da.max_cqe, 65536);
    CHECK_EQ(da.max_mr_size, 1ull << 40);
    CHECK_EQ(da.max_qp, 16384);
    CHECK_EQ(da.phys_port_cnt, 1);

    struct ibv_port_attr pa;
    CHECK_EQ(ibv_query_port(ctx, 1, &pa), 0);
    CHECK_EQ(pa.state, IBV_PORT_ACTIVE);
    CHECK_EQ(pa.active_mtu, IBV_MTU_4096);
    CHECK_EQ(pa.link_layer, IBV_LINK_LAYER_INFINIBAND);
    CHECK(pa.lid != 0, "IB has a LID");
    CHECK_EQ(pa.gid_tbl_len, 1);
    CHECK(ibv_query_port(ctx, 2, &pa) != 0, "port 2 does not exist");

    union ibv_gid gid;
    CHECK_EQ(ibv_query_gid(ctx, 1, 0, &gid), 0);
    CHECK(gid.raw[0] == 0xfe && gid.raw[1] == 0x80, "link-local GID");
    CHECK(ibv_query_gid(ctx, 1, 1, &gid) != 0, "one GID on IB");
    CHECK(strcmp(ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR), "remote access error") == 0, "str");
    CHECK(strcmp(ibv_wc_status_str((enum ibv_wc_status)999), "unknown") == 0, "str");
    /* Not an extended context: the inline helpers must not look past it. */
    CHECK(ctx->abi_compat == NULL, "abi_compat");
    CHECK_EQ(ibv_close_device(ctx), 0);
}

/* ------------------------------------------------------ positive paths */

static void test_read_write(void)
{
    struct pair p;
    pair_start(&p);
    softverbs_reset_counters();

    /* READ 1 MiB from offset 4096 of the responder. */
    uint32_t len = 1u << 20;
    CHECK_EQ(one(&p.e, IBV_WR_RDMA_READ, (uintptr_t)p.lbuf, len, p.e.mr->lkey,
                 p.r.info.addr + 4096, p.r.info.rkey), IBV_WC_SUCCESS);
    CHECK(memcmp(p.lbuf, p.r.buf + 4096, len) == 0, "READ bytes");
    CHECK_EQ(p.lbuf[len], 0xee);

    /* WRITE 1 MiB + 3 to offset 2 MiB + 5. */
    for (uint32_t i = 0; i < len + 3; i++)
        p.lbuf[i] = (uint8_t)(i * 13 + 1);
    CHECK_EQ(one(&p.e, IBV_WR_RDMA_WRITE, (uintptr_t)p.lbuf, len + 3, p.e.mr->lkey,
                 p.r.info.addr + (2u << 20) + 5, p.r.info.rkey), IBV_WC_SUCCESS);
    CHECK(memcmp(p.r.buf + (2u << 20) + 5, p.lbuf, len + 3) == 0, "WRITE bytes");
    CHECK_EQ(p.r.buf[(2u << 20) + 4], (uint8_t)(((2u << 20) + 4) * 7 + 3));

    struct softverbs_counters c = counters();
    CHECK_EQ(c.post_send_calls, 2);
    CHECK_EQ(c.wrs_posted, 2);
    CHECK_EQ(c.wrs_executed, 2);
    CHECK_EQ(c.sges, 2);
    CHECK_EQ(c.completions, 2);
    CHECK_EQ(c.cqes_polled, 2);
    CHECK_EQ(c.error_completions, 0);
    pair_stop(&p);
}

static void test_scatter_read(void)
{
    struct pair p;
    pair_start(&p);
    /* Four SGEs into two MRs, one of them registered at another iova. */
    uint8_t *other = malloc(8192);
    struct ibv_mr *mr2 = ibv_reg_mr_iova2(p.e.pd, other, 8192, 0x100000000ull,
                                          IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr2, "iova MR");
    struct ibv_sge sge[4] = {
        {(uintptr_t)p.lbuf + 100, 1000, p.e.mr->lkey},
        {0x100000000ull + 10, 3000, mr2->lkey},
        {(uintptr_t)p.lbuf + 50000, 1, p.e.mr->lkey},
        {0x100000000ull + 5000, 3192, mr2->lkey},
    };
    struct ibv_send_wr w = wr_rdma(IBV_WR_RDMA_READ, sge, 4, p.r.info.addr + 777, p.r.info.rkey, 1);
    struct ibv_send_wr *bad;
    CHECK_EQ(ibv_post_send(p.e.qp, &w, &bad), 0);
    struct ibv_wc wc;
    CHECK_EQ(ibv_poll_cq(p.e.cq, 1, &wc), 1);
    CHECK_EQ(wc.status, IBV_WC_SUCCESS);
    CHECK_EQ(wc.opcode, IBV_WC_RDMA_READ);
    CHECK_EQ(wc.byte_len, 1000 + 3000 + 1 + 3192);
    const uint8_t *src = p.r.buf + 777;
    CHECK(memcmp(p.lbuf + 100, src, 1000) == 0, "sge 0");
    CHECK(memcmp(other + 10, src + 1000, 3000) == 0, "sge 1");
    CHECK(p.lbuf[50000] == src[4000], "sge 2");
    CHECK(memcmp(other + 5000, src + 4001, 3192) == 0, "sge 3");
    CHECK_EQ(ibv_dereg_mr(mr2), 0);
    free(other);
    pair_stop(&p);
}

/* 32 WRs in one post with only the last signalled: one doorbell, one CQE,
 * and the data of all 32 in place once that CQE is polled. */
static void test_chain(void)
{
    struct pair p;
    pair_start(&p);
    softverbs_reset_counters();
    struct ibv_sge sge[32];
    struct ibv_send_wr w[32];
    for (int i = 0; i < 32; i++) {
        sge[i] = (struct ibv_sge){(uintptr_t)p.lbuf + (uint64_t)i * 4096, 4096, p.e.mr->lkey};
        w[i] = wr_rdma(IBV_WR_RDMA_READ, &sge[i], 1, p.r.info.addr + (uint64_t)(31 - i) * 4096,
                       p.r.info.rkey, i == 31);
        w[i].next = i < 31 ? &w[i + 1] : NULL;
    }
    struct ibv_send_wr *bad = NULL;
    CHECK_EQ(ibv_post_send(p.e.qp, w, &bad), 0);
    /* Deferred like hardware: nothing has moved before the poll. */
    CHECK_EQ(p.lbuf[0], 0xee);
    struct ibv_wc wc[4];
    CHECK_EQ(ibv_poll_cq(p.e.cq, 4, wc), 1);
    CHECK_EQ(wc[0].status, IBV_WC_SUCCESS);
    CHECK_EQ(wc[0].wr_id, p.r.info.addr);
    for (int i = 0; i < 32; i++)
        CHECK(memcmp(p.lbuf + i * 4096, p.r.buf + (31 - i) * 4096, 4096) == 0, "WR %d", i);
    struct softverbs_counters c = counters();
    CHECK_EQ(c.post_send_calls, 1);
    CHECK_EQ(c.wrs_posted, 32);
    CHECK_EQ(c.wrs_executed, 32);
    CHECK_EQ(c.completions, 1);
    CHECK_EQ(c.cqes_polled, 1);
    pair_stop(&p);
}

/* Two QPs of one process connected to each other: the memcpy path. */
static void test_loopback(void)
{
    uint8_t *a = local_buf(), *b = local_buf();
    for (size_t i = 0; i < LSIZE; i++)
        b[i] = (uint8_t)(i ^ (i >> 8));
    struct ep x, y;
    unsigned all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    ep_open(&x, &DEFAULT_OPTS, a, LSIZE, (int)all);
    ep_open(&y, &DEFAULT_OPTS, b, LSIZE, (int)all);
    connect_qp(x.qp, y.qp->qp_num, y.lid, 4, 4);
    connect_qp(y.qp, x.qp->qp_num, x.lid, 4, 4);
    CHECK_EQ(one(&x, IBV_WR_RDMA_READ, (uintptr_t)a, 65536, x.mr->lkey, (uintptr_t)b + 3,
                 y.mr->rkey), IBV_WC_SUCCESS);
    CHECK(memcmp(a, b + 3, 65536) == 0, "loopback READ");
    memset(a, 0x5a, 100);
    CHECK_EQ(one(&x, IBV_WR_RDMA_WRITE, (uintptr_t)a, 100, x.mr->lkey, (uintptr_t)b, y.mr->rkey),
             IBV_WC_SUCCESS);
    CHECK(b[0] == 0x5a && b[99] == 0x5a && b[100] == (uint8_t)(100 ^ 0), "loopback WRITE");
    ep_close(&x);
    ep_close(&y);
    free(a);
    free(b);
}

static void test_inline_write(void)
{
    struct pair p;
    struct ep_opts o = DEFAULT_OPTS;
    o.max_inline = 64;
    pair_start_opts(&p, &o, &RESP_DEFAULT, 16);
    char msg[] = "inline bytes, taken at post time";
    struct ibv_sge sge = {(uintptr_t)msg, sizeof msg, 0};    /* lkey not used */
    struct ibv_send_wr w = wr_rdma(IBV_WR_RDMA_WRITE, &sge, 1, p.r.info.addr + 9, p.r.info.rkey, 1);
    w.send_flags |= IBV_SEND_INLINE;
    struct ibv_send_wr *bad;
    CHECK_EQ(ibv_post_send(p.e.qp, &w, &bad), 0);
    memset(msg, 0, sizeof msg);         /* reusable as soon as the post returns */
    struct ibv_wc wc;
    CHECK_EQ(ibv_poll_cq(p.e.cq, 1, &wc), 1);
    CHECK_EQ(wc.status, IBV_WC_SUCCESS);
    CHECK(memcmp(p.r.buf + 9, "inline bytes, taken at post time", 33) == 0, "inline data");
    /* Above max_inline_data the post fails. */
    char big[65] = {0};
    sge = (struct ibv_sge){(uintptr_t)big, sizeof big, 0};
    CHECK_EQ(ibv_post_send(p.e.qp, &w, &bad), EINVAL);
    pair_stop(&p);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "ethernet") == 0) {
        RUN(test_ethernet_child);
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "mtu") == 0) {
        RUN(test_port_mtu_child);
        return 0;
    }
    char dir[] = "/tmp/softverbs-test-XXXXXX";
    CHECK(mkdtemp(dir), "mkdtemp");
    setenv("SOFTVERBS_DIR", dir, 1);
    unsetenv("SOFTVERBS_LINK_LAYER");

    RUN(test_device);
    RUN(test_read_write);
    RUN(test_scatter_read);
    RUN(test_chain);
    RUN(test_loopback);
    RUN(test_inline_write);
    RUN(test_post_not_rts);
    RUN(test_post_bad_wr);
    RUN(test_sq_overflow);
    RUN(test_post_recv);
    RUN(test_local_protection);
    RUN(test_remote_access);
    RUN(test_stale_rkey);
    RUN(test_rd_atomic);
    RUN(test_responder_gone);
    RUN(test_error_flush);
    RUN(test_cq_overflow);
    RUN(test_inject_error);
    RUN(test_destroy_drops);
    RUN(test_threads);
    RUN(test_ethernet);
    RUN(test_port_mtu);
    RUN(test_path_mtu_mismatch);
    RUN(test_modify_qp);
    RUN(test_create_checks);

    char path[sizeof dir + 32];
    snprintf(path, sizeof path, "%s/softverbs-%u", dir, (unsigned)getuid());
    unlink(path);
    rmdir(dir);
    return check_done("test_softverbs");
}
