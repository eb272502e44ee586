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
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>

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

static int to_rtr(struct ibv_qp *qp, uint32_t dest_qpn, uint16_t dlid, uint8_t max_dest_rd)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_4096, .dest_qp_num = dest_qpn,
        .rq_psn = 7, .max_dest_rd_atomic = max_dest_rd, .min_rnr_timer = 12,
        .ah_attr = {.dlid = dlid, .port_num = 1},
    };
    return ibv_modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                             IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
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

__attribute__((unused)) static void responder_cmd(struct responder *r, char cmd)
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

__attribute__((unused)) static enum ibv_qp_state qp_state(struct ibv_qp *qp)
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

int main(void)
{
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

    char path[sizeof dir + 32];
    snprintf(path, sizeof path, "%s/softverbs-%u", dir, (unsigned)getuid());
    unlink(path);
    rmdir(dir);
    return check_done("test_softverbs");
}
