/*
 * copy.c - moving a message's bytes between the local segments and the
 * remote range. Host memory of another process goes through one
 * process_vm_readv/writev with the whole SGE list as its iovec (the kernel
 * copies page by page, like the NIC's DMA); host memory of this process is
 * a memmove; GPU memory (dma-buf MRs) goes through CUDA and, when neither
 * side is host memory of this process, a bounce buffer.
 */
#include "sv.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#define BOUNCE_SIZE (1u << 20)
#define STACK_IOVS 64

/* Moves the bytes of liov[0..n) from/to raddr in pid. 0 or an errno. */
static int pvm(int read, pid_t pid, struct iovec *liov, int n, uint64_t raddr)
{
    while (n > 0) {
        int cnt = n < IOV_MAX ? n : IOV_MAX;
        size_t want = 0;
        for (int i = 0; i < cnt; i++)
            want += liov[i].iov_len;
        if (want == 0) {
            liov += cnt;
            n -= cnt;
            continue;
        }
        struct iovec r = {(void *)(uintptr_t)raddr, want};
        ssize_t got = read ? process_vm_readv(pid, liov, (unsigned long)cnt, &r, 1, 0)
                           : process_vm_writev(pid, liov, (unsigned long)cnt, &r, 1, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return errno;
        if (got == 0)
            return EFAULT;
        /* A partial transfer stops at a fault; go on from there, and a
         * second fault on the same spot returns EFAULT above. */
        raddr += (uint64_t)got;
        size_t left = (size_t)got;
        while (n > 0 && left >= liov->iov_len) {
            left -= liov->iov_len;
            liov++;
            n--;
        }
        if (left) {
            liov->iov_base = (char *)liov->iov_base + left;
            liov->iov_len -= left;
        }
    }
    return 0;
}

static enum ibv_wc_status sys_status(int err, uint32_t *vendor_err)
{
    *vendor_err = (uint32_t)err;
    if (err == ESRCH)
        return IBV_WC_RETRY_EXC_ERR;    /* the responder died */
    if (err == EFAULT)
        return IBV_WC_REM_ACCESS_ERR;   /* registered memory no longer mapped */
    return IBV_WC_GENERAL_ERR;          /* EPERM: ptrace not allowed, ... */
}

/* Host memory of this process <-> host memory anywhere. */
static int host_xfer(int read, void *local, const struct sv_seg *remote, uint64_t roff,
                     size_t len)
{
    if (len == 0)
        return 0;
    if (remote->pid == sv_self()) {
        void *r = (void *)(uintptr_t)(remote->addr + roff);
        if (read)
            memmove(local, r, len);
        else
            memmove(r, local, len);
        return 0;
    }
    struct iovec l = {local, len};
    return pvm(read, remote->pid, &l, 1, remote->addr + roff);
}

/* Host memory of this process <-> the remote segment, whatever it is. */
static enum ibv_wc_status to_remote(int read, void *host, const struct sv_seg *remote,
                                    uint64_t roff, size_t len, uint32_t *vendor_err)
{
    if (remote->gpu) {                  /* only this process's (checked before) */
        if (sv_cuda_copy(!read, remote->addr + roff, host, len)) {
            *vendor_err = EIO;
            return IBV_WC_REM_ACCESS_ERR;
        }
        return IBV_WC_SUCCESS;
    }
    int err = host_xfer(read, host, remote, roff, len);
    return err ? sys_status(err, vendor_err) : IBV_WC_SUCCESS;
}

/* One local GPU segment: straight when the remote is host memory of this
 * process, else through the bounce buffer in chunks. */
static enum ibv_wc_status gpu_segment(int read, const struct sv_seg *l, const struct sv_seg *remote,
                                      uint64_t roff, uint8_t **bounce, uint32_t *vendor_err)
{
    if (!remote->gpu && remote->pid == sv_self()) {
        void *r = (void *)(uintptr_t)(remote->addr + roff);
        if (sv_cuda_copy(read, l->addr, r, l->len)) {
            *vendor_err = EIO;
            return IBV_WC_LOC_ACCESS_ERR;
        }
        return IBV_WC_SUCCESS;
    }
    if (!*bounce && !(*bounce = malloc(BOUNCE_SIZE))) {
        *vendor_err = ENOMEM;
        return IBV_WC_GENERAL_ERR;
    }
    for (uint64_t off = 0; off < l->len; off += BOUNCE_SIZE) {
        size_t n = l->len - off < BOUNCE_SIZE ? (size_t)(l->len - off) : BOUNCE_SIZE;
        enum ibv_wc_status st;
        if (read) {
            st = to_remote(1, *bounce, remote, roff + off, n, vendor_err);
            if (st != IBV_WC_SUCCESS)
                return st;
            if (sv_cuda_copy(1, l->addr + off, *bounce, n)) {
                *vendor_err = EIO;
                return IBV_WC_LOC_ACCESS_ERR;
            }
        } else {
            if (sv_cuda_copy(0, l->addr + off, *bounce, n)) {
                *vendor_err = EIO;
                return IBV_WC_LOC_ACCESS_ERR;
            }
            st = to_remote(0, *bounce, remote, roff + off, n, vendor_err);
            if (st != IBV_WC_SUCCESS)
                return st;
        }
    }
    return IBV_WC_SUCCESS;
}

enum ibv_wc_status sv_copy(int read, const struct sv_seg *local, int n, const struct sv_seg *remote,
                           uint8_t **bounce, uint32_t *vendor_err)
{
    int gpu = remote->gpu;
    for (int i = 0; i < n; i++)
        gpu |= local[i].gpu;

    /* The common case: host to host in another process, one system call. */
    if (!gpu && remote->pid != sv_self()) {
        struct iovec stack[STACK_IOVS];
        struct iovec *iov = n <= STACK_IOVS ? stack : malloc((size_t)n * sizeof *iov);
        if (!iov) {
            *vendor_err = ENOMEM;
            return IBV_WC_GENERAL_ERR;
        }
        for (int i = 0; i < n; i++)
            iov[i] = (struct iovec){(void *)(uintptr_t)local[i].addr, local[i].len};
        int err = pvm(read, remote->pid, iov, n, remote->addr);
        if (iov != stack)
            free(iov);
        return err ? sys_status(err, vendor_err) : IBV_WC_SUCCESS;
    }

    uint64_t roff = 0;
    for (int i = 0; i < n; i++) {
        enum ibv_wc_status st;
        if (local[i].gpu)
            st = gpu_segment(read, &local[i], remote, roff, bounce, vendor_err);
        else
            st = to_remote(read, (void *)(uintptr_t)local[i].addr, remote, roff,
                           local[i].len, vendor_err);
        if (st != IBV_WC_SUCCESS)
            return st;
        roff += local[i].len;
    }
    return IBV_WC_SUCCESS;
}
