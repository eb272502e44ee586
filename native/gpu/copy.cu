// copy.cu - gdrkv's GPU copy kernel: one launch moves a whole batch of
// scattered (src, dst, len) pieces between any memory the GPU can address
// (device memory, and host memory mapped into the GPU: the shm pool,
// pinned staging). Built by native/gpu/build_cuda_kernels.sh into the fatbin
// that native/gpu/gpu_kernels_fatbin.c carries; loaded with cuModuleLoadData.
//
// The host cuts pieces into units of at most GK_COPY_UNIT bytes (so a huge
// page spreads over many warps and a batch of small ones costs one unit
// each) and lists them in a descriptor array in pinned, mapped host
// memory: no upload step. Each warp takes units i, i + nwarps, ...: the
// next descriptor is loaded before the current unit is copied, so its
// PCIe latency hides behind the copy. Within a unit, when source and
// destination share their alignment mod 16 every lane moves 16-byte
// vectors, four in flight, coalesced across the warp (512 contiguous
// bytes per warp access); the unaligned head and tail go byte by byte.
// Pieces whose source and destination disagree mod 16 fall back to 8-,
// 4- or 1-byte words, whichever they agree on.
#include <stdint.h>

struct gk_copy_desc {
    unsigned long long src;
    unsigned long long dst;
    unsigned long long len;
};

template <typename T>
__device__ __forceinline__ void copy_words(const T *__restrict__ s, T *__restrict__ d,
                                           unsigned long long n, unsigned lane)
{
    unsigned long long k = lane;
    for (; k + 96 < n; k += 128) {
        T a = s[k], b = s[k + 32], c = s[k + 64], e = s[k + 96];
        d[k] = a;
        d[k + 32] = b;
        d[k + 64] = c;
        d[k + 96] = e;
    }
    for (; k < n; k += 32)
        d[k] = s[k];
}

template <unsigned W, typename T>
__device__ __forceinline__ void copy_aligned(const uint8_t *s, uint8_t *d, unsigned long long len,
                                             unsigned lane)
{
    unsigned long long head = (W - ((uintptr_t)d & (W - 1))) & (W - 1);
    if (head > len)
        head = len;
    if (lane < head)
        d[lane] = s[lane];
    s += head, d += head, len -= head;
    unsigned long long n = len / W;
    copy_words<T>(reinterpret_cast<const T *>(s), reinterpret_cast<T *>(d), n, lane);
    unsigned long long off = n * W, tail = len - off;
    if (lane < tail)
        d[off + lane] = s[off + lane];
}

__device__ __forceinline__ void copy_unit(const uint8_t *s, uint8_t *d, unsigned long long len,
                                          unsigned lane)
{
    unsigned mis = (unsigned)(((uintptr_t)s ^ (uintptr_t)d) & 15);
    if (mis == 0)
        copy_aligned<16, uint4>(s, d, len, lane);
    else if ((mis & 7) == 0)
        copy_aligned<8, unsigned long long>(s, d, len, lane);
    else if ((mis & 3) == 0)
        copy_aligned<4, unsigned>(s, d, len, lane);
    else
        copy_words<uint8_t>(s, d, len, lane);
}

extern "C" __global__ void __launch_bounds__(256)
gk_copy_pieces(const gk_copy_desc *__restrict__ descs, unsigned n)
{
    const unsigned lane = threadIdx.x & 31;
    const unsigned nwarps = (gridDim.x * blockDim.x) >> 5;
    unsigned i = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    unsigned long long field = 0;    // lane 0: src, lane 1: dst, lane 2: len

    // Lanes 0..2 each fetch one field, so the three loads travel together.
    if (i < n && lane < 3)
        field = (&descs[i].src)[lane];
    while (i < n) {
        unsigned long long cur_src = __shfl_sync(0xffffffffu, field, 0);
        unsigned long long cur_dst = __shfl_sync(0xffffffffu, field, 1);
        unsigned long long cur_len = __shfl_sync(0xffffffffu, field, 2);
        unsigned next = i + nwarps;
        if (next < n && lane < 3)
            field = (&descs[next].src)[lane];
        copy_unit(reinterpret_cast<const uint8_t *>(cur_src), reinterpret_cast<uint8_t *>(cur_dst),
                  cur_len, lane);
        i = next;
    }
}
