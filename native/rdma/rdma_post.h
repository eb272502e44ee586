/*
 * rdma_post.h - moving one frame's pieces with one-sided RDMA: READs from
 * the server's pool into the caller's memory (GET) or WRITEs the other way
 * (PUT), with the verbs techniques that make small objects fast:
 *
 *   - a piece whose remote bytes continue the previous piece's becomes one
 *     more SGE of the same work request (an object chunk spread over
 *     several destination segments), up to the negotiated SGE limit;
 *   - work requests are chained, RDMA_POST_CHAIN per ibv_post_send, one
 *     doorbell per chain, spread round-robin over the connection's QPs;
 *   - only one WR in sq_depth/2, and the last one of each QP, asks for a
 *     completion; the send queue is never filled past its depth (a WR
 *     holds its slot until a signalled WR after it completes);
 *   - completions are polled without sleeping, a step at a time
 *     (rdma_post_step), by the caller's poll loop: the call's other
 *     connections go on between steps.
 *
 * An error completion fails the keys of every WR its QP had not yet seen
 * confirmed, and no more WRs go to that QP; the caller then drops the
 * connection, whose QPs are destroyed before its buffers are given back.
 */
#ifndef GDRKV_RDMA_POST_H
#define GDRKV_RDMA_POST_H

#include <stdint.h>

#define RDMA_POST_CHAIN 32

struct rdma_piece {
    uint64_t local;             /* caller's address */
    uint64_t remote;            /* server's address */
    uint32_t len;
    uint32_t lkey;
    uint32_t rkey;
    uint32_t key;               /* the batch position it belongs to */
};

/* A growable list, reused frame after frame by its connection. */
struct rdma_pieces {
    struct rdma_piece *list;
    uint32_t count, cap;
};

int rdma_pieces_add(struct rdma_pieces *p, const struct rdma_piece *piece);
void rdma_pieces_reset(struct rdma_pieces *p);
void rdma_pieces_free(struct rdma_pieces *p);

/* What a run did, for the client's counters. */
struct rdma_post_stats {
    uint64_t wrs, posts, completions, bytes;
};

#include "rdma_qp.h"

/* Calls fail(arg, key, err) for each key that must fail. */
typedef void (*rdma_fail_fn)(void *arg, uint32_t key, int err);

#define RDMA_FLUSH_MAX 8

/* The flush READs that end a GET into memory a pre-Hopper GPU reads (NCCL's
 * iflush): a READ of each destination MR, so the NIC's writes before it are
 * visible to the GPU. They go on a QP connected to itself (rdma_mr.h) once
 * every data READ is confirmed, one at a time, and their completions are
 * taken by the same loop as the data's. */
struct rdma_flush {
    struct ibv_qp *qp;
    struct ibv_cq *cq;
    uint64_t scratch;               /* the byte each flush READ lands in */
    uint32_t lkey;
    uint32_t n;                     /* flushes wanted */
    uint64_t addr[RDMA_FLUSH_MAX];
    uint32_t rkey[RDMA_FLUSH_MAX];
    uint32_t done;                  /* out: flushes completed */
    int err;                        /* out: why they stopped short (the flusher must go) */
};

/* One work request: pieces [first, first + nsge) on QP qp, the seq-th WR
 * of that QP in its run. */
struct rdma_wr_rec {
    uint32_t first;
    uint32_t seq;
    uint16_t nsge;
    uint8_t qp;
};

struct rdma_qp_run {
    uint32_t *wrs;              /* its WRs, indexes into the run's records */
    uint32_t total;
    uint32_t posted;
    uint32_t confirmed;         /* WRs [0, confirmed) are known done */
    uint32_t unsignalled;       /* posted since the last signalled WR */
    int dead;
};

/* One frame's pieces in flight, kept by their connection between the
 * steps of its poll loop (rdma_post_start, rdma_post_step, rdma_post_end). */
struct rdma_run {
    struct rdma_qps *q;
    int opcode;
    const struct rdma_pieces *p;
    struct rdma_flush *flush;
    struct rdma_wr_rec *recs;
    uint32_t nrecs;
    struct rdma_qp_run qps[RDMA_MAX_QPS];
    uint32_t chain, sig_every, max_sge;
    rdma_fail_fn fail;
    void *arg;
    struct rdma_post_stats *stats;
    int broken;                 /* an error completion: that QP's keys failed */
    int lost;                   /* a post or poll failed: WRs may be in flight untracked */
    int flushing;               /* a flush READ is posted, its completion not taken */
    int over;                   /* nothing more to post or take */
    int idle;                   /* the last step took no completion */
};

/* Starts running every piece (opcode IBV_WR_RDMA_READ or IBV_WR_RDMA_WRITE),
 * then the flush READs when flush is not NULL (unless WRs may still be in
 * flight). Nothing is posted yet: rdma_post_step posts and polls, and
 * rdma_post_end must follow, whatever happened. 0. */
int rdma_post_start(struct rdma_run *r, struct rdma_qps *q, int opcode,
                    const struct rdma_pieces *p, struct rdma_flush *flush, rdma_fail_fn fail,
                    void *arg, struct rdma_post_stats *stats);
/* Posts what the send queues have room for and takes the completions that
 * came, without waiting: 1 when the run is over, 0 while work is still out
 * (r->idle: this step took none). */
int rdma_post_step(struct rdma_run *r);
/* Ends the run: after its last step, or with timed_out when its deadline
 * passed first. Returns
 *   0                    every WR confirmed (keys may still have failed),
 *   GDRKV_E_UNAVAILABLE  an error completion broke a QP: its unconfirmed
 *                        keys failed, nothing of it is in flight (an RC
 *                        queue flushes what follows an error), the rest
 *                        is confirmed: the frame may finish, then the
 *                        connection must go;
 *   GDRKV_E_TIMEOUT, GDRKV_E_INTERNAL (a post or poll failed)  WRs may
 *                        still be in flight: the caller fails the frame
 *                        and destroys the QPs before returning. */
int rdma_post_end(struct rdma_run *r, int timed_out);

#endif
