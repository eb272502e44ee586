/*
 * rdma_mr.h - memory the NIC may touch: host and GPU memory registered as
 * MRs (dma-buf for GPU memory, nvidia-peermem as the fallback; relaxed
 * ordering where the library has it), and the flush READ that makes a
 * NIC's writes into a pre-Hopper GPU visible to its kernels.
 */
#ifndef GDRKV_RDMA_MR_H
#define GDRKV_RDMA_MR_H

#include <stddef.h>
#include <stdint.h>

#include "rdma_dev.h"
#include "rdma_post.h"

/* "dddd:bb:dd.0" of GPU device into buf, or NULL when CUDA can't say: for
 * choosing the NIC nearest to it. */
const char *rdma_gpu_pci_address(int device, char *buf, size_t len);
/* Whether the NIC's writes into GPU device's memory need a flush READ
 * before a kernel may read them (before Hopper; unknown GPUs too). */
int rdma_gpu_needs_flush(int device);

/* Registers [ptr, ptr + len) of host memory (device -1) or of GPU device's
 * memory for local writes (READs land there, WRITEs leave from there), and
 * for remote reads too when remote_read (the flush QP's READ). NULL with
 * errno on failure; *dmabuf_fd is the exported dma-buf to close with the
 * MR, or -1. */
struct ibv_mr *rdma_mr_register(struct rdma_dev *d, uint64_t ptr, uint64_t len, int device,
                                int remote_read, int *dmabuf_fd);
void rdma_mr_deregister(struct rdma_dev *d, struct ibv_mr *mr, int dmabuf_fd);

/* A QP connected to itself and a scratch MR to READ into. */
struct rdma_flusher;
struct rdma_flusher *rdma_flusher_new(struct rdma_dev *d);
void rdma_flusher_free(struct rdma_dev *d, struct rdma_flusher *f);
/* Points flush at the flusher's QP, CQ and scratch byte, for
 * a run (rdma_post_start) to post the flush READs on (rdma_post.h). A flusher whose
 * flush failed (a QP in error, or with a READ outstanding) must be freed. */
void rdma_flusher_target(const struct rdma_flusher *f, struct rdma_flush *flush);

#endif
