/*
 * cuda_bounce.c - the CUDA driver calls that move dma-buf MR bytes.
 * libcuda.so.1 is dlopened on the first dma-buf registration (a process
 * that only registers host memory never loads it). A copy runs in the
 * caller's current context when there is one, else in the primary context
 * of the device that owns the pointer, pushed for the copy and popped
 * after so the calling thread's CUDA state is left as it was.
 *
 * The few driver types are declared here; cuda.h is not needed to build.
 */
#include "sv.h"

#include <dlfcn.h>
#include <errno.h>

typedef int CUresult;                   /* CUDA_SUCCESS is 0 */
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define SV_MAX_DEVICES 64

static struct {
    CUresult (*init)(unsigned);
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_push)(CUcontext);
    CUresult (*ctx_pop)(CUcontext *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*pointer_attr)(void *, int, CUdeviceptr);
    CUresult (*htod)(CUdeviceptr, const void *, size_t);
    CUresult (*dtoh)(void *, CUdeviceptr, size_t);
} cu;

static int load_rc;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primary[SV_MAX_DEVICES];

#define RESOLVE(field, name)                                              \
    do {                                                                  \
        *(void **)&cu.field = dlsym(h, name);                             \
        if (!cu.field)                                                    \
            return;                                                       \
    } while (0)

static void load(void)
{
    load_rc = EOPNOTSUPP;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    /* The _v2 names are what cuda.h's macros map these calls to. */
    RESOLVE(init, "cuInit");
    RESOLVE(ctx_get_current, "cuCtxGetCurrent");
    RESOLVE(ctx_push, "cuCtxPushCurrent_v2");
    RESOLVE(ctx_pop, "cuCtxPopCurrent_v2");
    RESOLVE(device_get, "cuDeviceGet");
    RESOLVE(primary_retain, "cuDevicePrimaryCtxRetain");
    RESOLVE(pointer_attr, "cuPointerGetAttribute");
    RESOLVE(htod, "cuMemcpyHtoD_v2");
    RESOLVE(dtoh, "cuMemcpyDtoH_v2");
    if (cu.init(0) != 0)
        return;
    load_rc = 0;
}

int sv_cuda_load(void)
{
    pthread_once(&load_once, load);
    return load_rc;
}

/* The primary context of the device owning ptr, retained once per device
 * for the life of the process. */
static CUcontext primary_for(CUdeviceptr ptr)
{
    int ordinal = -1;
    if (cu.pointer_attr(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) != 0 ||
        ordinal < 0 || ordinal >= SV_MAX_DEVICES)
        return NULL;
    pthread_mutex_lock(&primary_lock);
    CUcontext ctx = primary[ordinal];
    CUdevice dev;
    if (!ctx && cu.device_get(&dev, ordinal) == 0 && cu.primary_retain(&ctx, dev) == 0)
        primary[ordinal] = ctx;
    pthread_mutex_unlock(&primary_lock);
    return ctx;
}

int sv_cuda_copy(int to_device, uint64_t dptr, void *host, size_t len)
{
    if (len == 0)
        return 0;
    if (sv_cuda_load())
        return -1;
    CUcontext cur = NULL, pushed = NULL;
    if (cu.ctx_get_current(&cur) != 0 || !cur) {
        pushed = primary_for(dptr);
        if (!pushed || cu.ctx_push(pushed) != 0)
            return -1;
    }
    CUresult r = to_device ? cu.htod(dptr, host, len) : cu.dtoh(host, dptr, len);
    if (pushed) {
        CUcontext popped;
        cu.ctx_pop(&popped);
    }
    return r == 0 ? 0 : -1;
}
