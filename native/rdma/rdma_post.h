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
 *   - completions are busy-polled: the caller is waiting for them.
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

/* Runs every piece (opcode IBV_WR_RDMA_READ or IBV_WR_RDMA_WRITE) and
 * waits for it, then the flush READs when flush is not NULL (unless WRs may
 * still be in flight), until deadline_ns. Returns
 *   0                    every WR confirmed (keys may still have failed),
 *   GDRKV_E_UNAVAILABLE  an error completion broke a QP: its unconfirmed
 *                        keys failed, nothing of it is in flight (an RC
 *                        queue flushes what follows an error), the rest
 *                        is confirmed: the frame may finish, then the
 *                        connection must go;
 *   GDRKV_E_TIMEOUT, GDRKV_E_INTERNAL (a post or poll failed)  WRs may
 *                        still be in flight: the caller fails the frame
 *                        and destroys the QPs before returning. */
int rdma_post_run(struct rdma_qps *q, int opcode, const struct rdma_pieces *p,
                  struct rdma_flush *flush, uint64_t deadline_ns, rdma_fail_fn fail, void *arg,
                  struct rdma_post_stats *stats);

#endif
