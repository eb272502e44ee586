/*
 * cuda.h - the CUDA driver API, loaded at run time.
 *
 * gdrkv has no link-time dependency on CUDA and needs no CUDA headers to
 * build: libcuda.so.1 is dlopened on first use and the functions the
 * library needs are resolved into one table, the way NCCL reaches the
 * verbs library. Only the handful of types and constants used are
 * declared here, with the values of the driver's ABI (cuda.h, CUDA 13).
 * Entry points are looked up by their versioned ABI names (cuMemAlloc is
 * cuMemAlloc_v2 in the ABI), which the driver keeps forever.
 */
#ifndef GDRKV_CUDA_H
#define GDRKV_CUDA_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

enum {
    GK_CUDA_SUCCESS = 0,
    GK_CUDA_ERROR_INVALID_VALUE = 1,
    GK_CUDA_ERROR_NOT_READY = 600,
    GK_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
};

/* CUpointer_attribute */
enum {
    GK_CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    GK_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    GK_CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
    GK_CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
    GK_CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    GK_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    GK_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
    GK_CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
};

/* CUmemorytype */
enum { GK_CU_MEMORYTYPE_HOST = 1, GK_CU_MEMORYTYPE_DEVICE = 2, GK_CU_MEMORYTYPE_UNIFIED = 4 };

/* CUdevice_attribute */
enum {
    GK_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    GK_CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91,
    GK_CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED = 113,
    GK_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124,
    GK_CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    GK_CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
    GK_CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
    GK_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
};

#define GK_CU_MEMHOSTALLOC_PORTABLE 0x01
#define GK_CU_MEMHOSTALLOC_DEVICEMAP 0x02
#define GK_CU_MEMHOSTREGISTER_PORTABLE 0x01
#define GK_CU_MEMHOSTREGISTER_DEVICEMAP 0x02
#define GK_CU_MEMHOSTREGISTER_READ_ONLY 0x08
#define GK_CU_STREAM_DEFAULT 0x0
#define GK_CU_STREAM_NON_BLOCKING 0x1
#define GK_CU_EVENT_DISABLE_TIMING 0x2
#define GK_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 0x1

/* CUmemcpyAttributes of cuMemcpyBatchAsync (CUDA 12.8+). */
struct gk_cu_mem_location {
    int type;
    int id;
};
struct gk_cu_memcpy_attributes {
    int src_access_order;               /* 1 = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM */
    struct gk_cu_mem_location src_loc_hint;
    struct gk_cu_mem_location dst_loc_hint;
    unsigned int flags;
};
#define GK_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM 0x1

struct gk_cuda {
    int driver_version;
    CUresult (*cuInit)(unsigned int flags);
    CUresult (*cuDriverGetVersion)(int *version);
    CUresult (*cuGetErrorString)(CUresult err, const char **str);
    CUresult (*cuDeviceGet)(CUdevice *dev, int ordinal);
    CUresult (*cuDeviceGetCount)(int *count);
    CUresult (*cuDeviceGetAttribute)(int *value, int attrib, CUdevice dev);
    CUresult (*cuPointerGetAttribute)(void *data, int attribute, CUdeviceptr ptr);
    CUresult (*cuPointerGetAttributes)(unsigned int n, int *attributes, void **data,
                                       CUdeviceptr ptr);
    CUresult (*cuMemGetAddressRange)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);
    CUresult (*cuMemGetHandleForAddressRange)(void *handle, CUdeviceptr ptr, size_t size,
                                              int handle_type, unsigned long long flags);
    CUresult (*cuCtxGetCurrent)(CUcontext *ctx);
    CUresult (*cuCtxSetCurrent)(CUcontext ctx);
    CUresult (*cuCtxPushCurrent)(CUcontext ctx);
    CUresult (*cuCtxPopCurrent)(CUcontext *ctx);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice dev);
    CUresult (*cuMemHostRegister)(void *p, size_t bytes, unsigned int flags);
    CUresult (*cuMemHostUnregister)(void *p);
    CUresult (*cuMemHostAlloc)(void **pp, size_t bytes, unsigned int flags);
    CUresult (*cuMemFreeHost)(void *p);
    CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr *dptr, void *p, unsigned int flags);
    CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void *src, size_t bytes);
    CUresult (*cuMemcpyDtoH)(void *dst, CUdeviceptr src, size_t bytes);
    CUresult (*cuMemcpyAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s);
    /* NULL when the driver predates it (CUDA 12.8); batch_v1 is 12.8's form
     * with a failIdx argument, batch_v2 13's without. */
    CUresult (*cuMemcpyBatchAsync_v2)(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                      size_t count, struct gk_cu_memcpy_attributes *attrs,
                                      size_t *attrs_idxs, size_t num_attrs, CUstream s);
    CUresult (*cuMemcpyBatchAsync_v1)(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                      size_t count, struct gk_cu_memcpy_attributes *attrs,
                                      size_t *attrs_idxs, size_t num_attrs, size_t *fail_idx,
                                      CUstream s);
    CUresult (*cuModuleLoadData)(CUmodule *mod, const void *image);
    CUresult (*cuModuleGetFunction)(CUfunction *fn, CUmodule mod, const char *name);
    CUresult (*cuLaunchKernel)(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                               unsigned int bx, unsigned int by, unsigned int bz,
                               unsigned int shared_bytes, CUstream s, void **params,
                               void **extra);
    CUresult (*cuStreamCreate)(CUstream *s, unsigned int flags);
    CUresult (*cuStreamDestroy)(CUstream s);
    CUresult (*cuStreamSynchronize)(CUstream s);
    CUresult (*cuStreamWaitEvent)(CUstream s, CUevent e, unsigned int flags);
    CUresult (*cuEventCreate)(CUevent *e, unsigned int flags);
    CUresult (*cuEventDestroy)(CUevent e);
    CUresult (*cuEventRecord)(CUevent e, CUstream s);
    CUresult (*cuEventSynchronize)(CUevent e);
    CUresult (*cuEventQuery)(CUevent e);
};

/* The table, loading libcuda.so.1 ($GDRKV_CUDA_LIB overrides the name) and
 * calling cuInit on the first call; NULL when that failed, and
 * gk_cuda_why() says why. Thread-safe; the outcome is final. */
const struct gk_cuda *gk_cuda(void);
const char *gk_cuda_why(void);

/* The table only if the process already has libcuda loaded (an engine that
 * owns GPU memory always has): a host-only client never pays cuInit for
 * asking whether an address is GPU memory. */
const struct gk_cuda *gk_cuda_if_loaded(void);

/* 1 when ptr is device memory (*device set to its ordinal), 0 when it is
 * host memory or unknown to CUDA (or CUDA is absent), negative gdrkv_error
 * on failure. */
int gk_cuda_pointer_device(uint64_t ptr, int *device);

/* The driver's text for err ("CUDA error N" when it has none). */
const char *gk_cuda_strerror(CUresult err);

#endif
