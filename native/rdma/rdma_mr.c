/*
 * rdma_mr.c - see rdma_mr.h.
 */
#include "rdma_mr.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "common/log.h"
#include "gdrkv.h"
#include "gpu/cuda.h"
#include "rdma_qp.h"

/* ------------------------------------------------------------ GPU memory */

/* "dddd:bb:dd.0" of a GPU, for choosing the NIC nearest to it. */
const char *rdma_gpu_pci_address(int device, char *buf, size_t len)
{
    const struct gk_cuda *cu = gk_cuda_if_loaded();
    CUdevice dev;
    int domain, bus, slot;
    if (!cu || cu->cuDeviceGet(&dev, device) ||
        cu->cuDeviceGetAttribute(&domain, GK_CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, dev) ||
        cu->cuDeviceGetAttribute(&bus, GK_CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev) ||
        cu->cuDeviceGetAttribute(&slot, GK_CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, dev))
        return NULL;
    snprintf(buf, len, "%04x:%02x:%02x.0", (unsigned)domain, (unsigned)bus, (unsigned)slot);
    return buf;
}

/* Before Hopper (compute capability 9), a NIC write completing does not
 * mean the GPU sees it: such memory needs the flush READ. */
int rdma_gpu_needs_flush(int device)
{
    const struct gk_cuda *cu = gk_cuda_if_loaded();
    CUdevice dev;
    int major = 0;
    if (!cu || cu->cuDeviceGet(&dev, device) ||
        cu->cuDeviceGetAttribute(&major, GK_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
        return 1;   /* unknown: the safe side */
    return major < 9;
}

/* GPU memory through dma-buf: exported from its allocation's base (page
 * aligned, as the driver wants), registered at the range's offset, so
 * every NIC shares one BAR1 mapping of the allocation. Without dma-buf
 * (old driver or rdma-core) plain ibv_reg_mr works where nvidia-peermem
 * is loaded. */
static struct ibv_mr *reg_gpu(struct rdma_dev *d, uint64_t ptr, uint64_t len, int access,
                              int *dmabuf_fd)
{
    const struct gk_cuda *cu = gk_cuda_if_loaded();
    CUdeviceptr base;
    size_t size;
    *dmabuf_fd = -1;
    if (cu && cu->cuMemGetHandleForAddressRange && d->ibv->reg_dmabuf_mr &&
        cu->cuMemGetAddressRange(&base, &size, ptr) == GK_CUDA_SUCCESS) {
        uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
        uint64_t start = base & ~(page - 1);
        uint64_t span = (base + size - start + page - 1) & ~(page - 1);
        int fd = -1;
        CUresult cr = cu->cuMemGetHandleForAddressRange(&fd, start, span,
                                                        GK_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
        if (cr == GK_CUDA_SUCCESS && fd >= 0) {
            struct ibv_mr *mr = d->ibv->reg_dmabuf_mr(d->pd, ptr - start, len, ptr, fd, access);
            if (mr) {
                *dmabuf_fd = fd;
                return mr;
            }
            GK_INFO("rdma: dma-buf registration failed (%s); trying nvidia-peermem",
                    strerror(errno));
            close(fd);
        } else {
            GK_INFO("rdma: no dma-buf for GPU memory (%s); trying nvidia-peermem",
                    gk_cuda_strerror(cr));
        }
    }
    return d->ibv->reg_mr(d->pd, (void *)(uintptr_t)ptr, len, access);
}

/* access carries relaxed ordering where the library knows the flag
 * (ibv_reg_mr_iova2 came with it): the NIC may then reorder its PCIe
 * writes, much faster to GPUs behind some root complexes, and safe for
 * one-sided data whose completion is what the reader waits for. */
static struct ibv_mr *reg_host(struct rdma_dev *d, uint64_t ptr, uint64_t len, int access)
{
    if (d->ibv->reg_mr_iova2)
        return d->ibv->reg_mr_iova2(d->pd, (void *)(uintptr_t)ptr, len, ptr, (unsigned)access);
    return d->ibv->reg_mr(d->pd, (void *)(uintptr_t)ptr, len, access);
}

struct ibv_mr *rdma_mr_register(struct rdma_dev *d, uint64_t ptr, uint64_t len, int device,
                                int remote_read, int *dmabuf_fd)
{
    int access = IBV_ACCESS_LOCAL_WRITE | (remote_read ? IBV_ACCESS_REMOTE_READ : 0);
    if (d->ibv->reg_mr_iova2)
        access |= IBV_ACCESS_RELAXED_ORDERING;
    *dmabuf_fd = -1;
    return device >= 0 ? reg_gpu(d, ptr, len, access, dmabuf_fd) : reg_host(d, ptr, len, access);
}

void rdma_mr_deregister(struct rdma_dev *d, struct ibv_mr *mr, int dmabuf_fd)
{
    d->ibv->dereg_mr(mr);
    if (dmabuf_fd >= 0)
        close(dmabuf_fd);
}

/* ------------------------------------------------------------ flush READs */

/* A QP connected to itself, and a few bytes of host memory to READ into:
 * a READ of GPU memory the NIC just wrote makes those writes visible to
 * the GPU (NCCL's gpuFlush). Before Hopper a completion alone does not. */
struct rdma_flusher {
    struct rdma_qps qps;
    struct ibv_mr *mr;
    uint8_t scratch[64];
};

void rdma_flusher_free(struct rdma_dev *d, struct rdma_flusher *f)
{
    if (f->qps.n || f->qps.cq)
        rdma_qps_destroy(d, &f->qps);
    if (f->mr)
        d->ibv->dereg_mr(f->mr);
    free(f);
}

struct rdma_flusher *rdma_flusher_new(struct rdma_dev *d)
{
    struct rdma_flusher *f = calloc(1, sizeof *f);
    struct rdma_endpoint self;
    if (!f)
        return NULL;
    f->mr = d->ibv->reg_mr(d->pd, f->scratch, sizeof f->scratch, IBV_ACCESS_LOCAL_WRITE);
    if (!f->mr || rdma_qps_create(d, &f->qps, 1, 2, 1, 1)) {
        rdma_flusher_free(d, f);
        return NULL;
    }
    f->qps.rd_atomic = 1;
    rdma_qps_describe(d, &f->qps, &self);
    if (rdma_qps_connect(d, &f->qps, &self, 1)) {
        rdma_flusher_free(d, f);
        return NULL;
    }
    return f;
}

void rdma_flusher_target(const struct rdma_flusher *f, struct rdma_flush *flush)
{
    flush->qp = f->qps.qp[0];
    flush->cq = f->qps.cq;
    flush->scratch = (uint64_t)(uintptr_t)f->scratch;
    flush->lkey = f->mr->lkey;
}
