/*
 * gpu_kernels.h - the compiled copy kernel (native/gpu/copy.cu),
 * embedded as a fatbin by native/gpu/build_cuda_kernels.sh, and the
 * descriptor layout it reads.
 */
#ifndef GDRKV_GPU_KERNELS_H
#define GDRKV_GPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

extern const unsigned char gk_copy_fatbin[];
extern const size_t gk_copy_fatbin_size;

#define GK_COPY_KERNEL "gk_copy_pieces"
#define GK_COPY_THREADS 256     /* the kernel's __launch_bounds__ */

/* struct gk_copy_desc of copy.cu. */
struct gk_copy_desc {
    uint64_t src;
    uint64_t dst;
    uint64_t len;
};

#endif
