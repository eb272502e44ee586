/*
 * mr.c - protection domains and memory regions. An MR is an entry in the
 * shared registry (so initiators in other processes can check an rkey
 * against it) plus the struct ibv_mr the caller holds. PD ids are unique
 * across processes (pid << 32 | counter): an rkey of the wrong PD is
 * rejected even when both PDs live in one process.
 */
#include "sv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <unistd.h>

#define DMA_BUF_MAGIC 0x444d4142        /* "DMAB", the dma-buf pseudo filesystem */

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
    static _Atomic uint32_t counter;
    if (!ctx) {
        errno = EINVAL;
        return NULL;
    }
    struct sv_pd *pd = calloc(1, sizeof *pd);
    if (!pd) {
        errno = ENOMEM;
        return NULL;
    }
    uint32_t n = atomic_fetch_add(&counter, 1) + 1;
    pd->ibv.context = ctx;
    pd->ibv.handle = n;
    pd->id = (uint64_t)(uint32_t)sv_self() << 32 | n;
    return &pd->ibv;
}

int ibv_dealloc_pd(struct ibv_pd *ibv)
{
    if (!ibv)
        return EINVAL;
    struct sv_pd *pd = (struct sv_pd *)ibv;
    if (atomic_load(&pd->users) > 0)
        return EBUSY;
    free(pd);
    return 0;
}

static const unsigned ACCESS_KNOWN = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                     IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                     IBV_ACCESS_RELAXED_ORDERING;

static struct ibv_mr *reg(struct ibv_pd *ibv, uint64_t addr, size_t length, uint64_t iova,
                          unsigned access, enum sv_mr_kind kind)
{
    struct sv_pd *pd = (struct sv_pd *)ibv;
    /* Verbs: remote write or atomic access needs local write too. */
    if (!pd || length == 0 || length > sv_config()->max_mr_size || (access & ~ACCESS_KNOWN) ||
        ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
         !(access & IBV_ACCESS_LOCAL_WRITE)) ||
        addr + length < addr || iova + length < iova || (kind == SV_MR_HOST && addr == 0)) {
        errno = EINVAL;
        return NULL;
    }
    struct sv_mr *mr = calloc(1, sizeof *mr);
    if (!mr) {
        errno = ENOMEM;
        return NULL;
    }
    mr->slot = sv_reg_mr_claim();
    if (mr->slot < 0) {
        free(mr);
        errno = ENOMEM;
        return NULL;
    }
    struct sv_mr_view v = {
        .access = access, .kind = kind, .pd_id = pd->id,
        .addr = addr, .iova = iova, .length = length,
    };
    uint32_t key = sv_reg_mr_publish(mr->slot, &v);
    atomic_fetch_add(&pd->users, 1);
    mr->ibv.context = pd->ibv.context;
    mr->ibv.pd = &pd->ibv;
    mr->ibv.addr = (void *)(uintptr_t)addr;
    mr->ibv.length = length;
    mr->ibv.handle = (uint32_t)mr->slot;
    mr->ibv.lkey = key;
    mr->ibv.rkey = key;
    return &mr->ibv;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                unsigned int access)
{
    return reg(pd, (uintptr_t)addr, length, iova, access, SV_MR_HOST);
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    return reg(pd, (uintptr_t)addr, length, (uintptr_t)addr, (unsigned)access, SV_MR_HOST);
}

struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                               int access)
{
    return reg(pd, (uintptr_t)addr, length, iova, (unsigned)access, SV_MR_HOST);
}

/* A dma-buf lives on its own pseudo filesystem; kernels before 5.3 used
 * an anonymous inode named "dmabuf". */
static int is_dmabuf(int fd)
{
    struct statfs sfs;
    if (fstatfs(fd, &sfs) == 0 && sfs.f_type == DMA_BUF_MAGIC)
        return 1;
    char link[64], target[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0)
        return 0;
    target[n] = 0;
    return strcmp(target, "anon_inode:dmabuf") == 0;
}

/*
 * The iova is the GPU virtual address of the registered range (how the
 * transport registers: export from the allocation base, register at the
 * offset with iova = the pointer); its bytes move through CUDA.
 */
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                 uint64_t iova, int fd, int access)
{
    if (!pd || fd < 0 || length == 0 || offset + length < offset || !is_dmabuf(fd)) {
        errno = EINVAL;
        return NULL;
    }
    off_t end = lseek(fd, 0, SEEK_END);
    if (end < 0 || (uint64_t)end < offset + length) {
        errno = EINVAL;
        return NULL;
    }
    int rc = sv_cuda_load();
    if (rc) {
        errno = rc;
        return NULL;
    }
    return reg(pd, iova, length, iova, (unsigned)access, SV_MR_DMABUF);
}

int ibv_dereg_mr(struct ibv_mr *ibv)
{
    if (!ibv)
        return EINVAL;
    struct sv_mr *mr = (struct sv_mr *)ibv;
    sv_reg_mr_release(mr->slot);
    atomic_fetch_sub(&((struct sv_pd *)ibv->pd)->users, 1);
    free(mr);
    return 0;
}
