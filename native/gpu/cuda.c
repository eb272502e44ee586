/*
 * cuda.c - see cuda.h.
 */
#include "cuda.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdrkv.h"
#include "common/log.h"

#define CUDA_LIB_DEFAULT "libcuda.so.1"

static struct gk_cuda table;
static const struct gk_cuda *loaded;
static char why[256] = "not loaded yet";
static pthread_once_t once = PTHREAD_ONCE_INIT;

static const char *lib_name(void)
{
    const char *name = getenv("GDRKV_CUDA_LIB");
    return name && *name ? name : CUDA_LIB_DEFAULT;
}

struct sym {
    const char *name;
    void **slot;
    int optional;
};

#define REQ(field, abi) {abi, (void **)&table.field, 0}
#define OPT(field, abi) {abi, (void **)&table.field, 1}

static void load(void)
{
    const struct sym syms[] = {
        REQ(cuInit, "cuInit"),
        REQ(cuDriverGetVersion, "cuDriverGetVersion"),
        REQ(cuGetErrorString, "cuGetErrorString"),
        REQ(cuDeviceGet, "cuDeviceGet"),
        REQ(cuDeviceGetCount, "cuDeviceGetCount"),
        REQ(cuDeviceGetAttribute, "cuDeviceGetAttribute"),
        REQ(cuPointerGetAttribute, "cuPointerGetAttribute"),
        REQ(cuPointerGetAttributes, "cuPointerGetAttributes"),
        REQ(cuMemGetAddressRange, "cuMemGetAddressRange_v2"),
        OPT(cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange"),
        REQ(cuCtxGetCurrent, "cuCtxGetCurrent"),
        REQ(cuCtxSetCurrent, "cuCtxSetCurrent"),
        REQ(cuCtxPushCurrent, "cuCtxPushCurrent_v2"),
        REQ(cuCtxPopCurrent, "cuCtxPopCurrent_v2"),
        REQ(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
        REQ(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
        REQ(cuMemHostRegister, "cuMemHostRegister_v2"),
        REQ(cuMemHostUnregister, "cuMemHostUnregister"),
        REQ(cuMemHostAlloc, "cuMemHostAlloc"),
        REQ(cuMemFreeHost, "cuMemFreeHost"),
        REQ(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2"),
        REQ(cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
        REQ(cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
        REQ(cuMemcpyAsync, "cuMemcpyAsync"),
        OPT(cuMemcpyBatchAsync_v2, "cuMemcpyBatchAsync_v2"),
        OPT(cuMemcpyBatchAsync_v1, "cuMemcpyBatchAsync"),
        REQ(cuModuleLoadData, "cuModuleLoadData"),
        REQ(cuModuleGetFunction, "cuModuleGetFunction"),
        REQ(cuLaunchKernel, "cuLaunchKernel"),
        REQ(cuStreamCreate, "cuStreamCreate"),
        REQ(cuStreamDestroy, "cuStreamDestroy_v2"),
        REQ(cuStreamSynchronize, "cuStreamSynchronize"),
        REQ(cuStreamWaitEvent, "cuStreamWaitEvent"),
        REQ(cuEventCreate, "cuEventCreate"),
        REQ(cuEventDestroy, "cuEventDestroy_v2"),
        REQ(cuEventRecord, "cuEventRecord"),
        REQ(cuEventSynchronize, "cuEventSynchronize"),
        REQ(cuEventQuery, "cuEventQuery"),
    };
    const char *name = lib_name();
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(why, sizeof why, "cannot load %s: %s", name, dlerror());
        return;
    }
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(lib, syms[i].name);
        if (!*syms[i].slot && !syms[i].optional) {
            snprintf(why, sizeof why, "%s has no %s (driver too old)", name, syms[i].name);
            return;     /* the library stays loaded: dlclose of a driver is unsafe */
        }
    }
    CUresult rc = table.cuInit(0);
    if (rc != GK_CUDA_SUCCESS) {
        const char *text = NULL;
        table.cuGetErrorString(rc, &text);
        snprintf(why, sizeof why, "cuInit failed: %s", text ? text : "unknown error");
        return;
    }
    table.cuDriverGetVersion(&table.driver_version);
    why[0] = '\0';
    loaded = &table;
    GK_DEBUG("CUDA driver %d loaded from %s", table.driver_version, name);
}

const struct gk_cuda *gk_cuda(void)
{
    pthread_once(&once, load);
    return loaded;
}

const char *gk_cuda_why(void)
{
    pthread_once(&once, load);
    return why;
}

static int read_adds(struct dl_phdr_info *info, size_t size, void *arg)
{
    if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof info->dlpi_adds)
        *(unsigned long long *)arg = info->dlpi_adds;
    return 1;               /* the first object carries the count */
}

/* How many objects the process has loaded so far (only a new one can be
 * the driver); 0 where the loader does not say. */
static unsigned long long objects_added(void)
{
    unsigned long long adds = 0;
    dl_iterate_phdr(read_adds, &adds);
    return adds;
}

const struct gk_cuda *gk_cuda_if_loaded(void)
{
    static int present;     /* sticky once seen: the driver is never unloaded */
    /* objects_added() when the driver was last found absent. dlopen with
     * RTLD_NOLOAD searches the library path, opening files, on every miss:
     * a CPU-only process paid it on every call. */
    static unsigned long long absent_at;

    if (!__atomic_load_n(&present, __ATOMIC_ACQUIRE)) {
        unsigned long long adds = objects_added();
        if (adds && adds == __atomic_load_n(&absent_at, __ATOMIC_RELAXED))
            return NULL;
        void *lib = dlopen(lib_name(), RTLD_NOW | RTLD_NOLOAD);
        if (!lib) {
            __atomic_store_n(&absent_at, adds, __ATOMIC_RELAXED);
            return NULL;
        }
        dlclose(lib);       /* drops only the reference NOLOAD took */
        __atomic_store_n(&present, 1, __ATOMIC_RELEASE);
    }
    return gk_cuda();
}

int gk_cuda_pointer_device(uint64_t ptr, int *device)
{
    const struct gk_cuda *cu = gk_cuda();
    if (!cu)
        return 0;
    int attrs[] = {GK_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, GK_CU_POINTER_ATTRIBUTE_IS_MANAGED,
                   GK_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    unsigned int type = 0;
    int managed = 0, ordinal = -1;
    void *data[] = {&type, &managed, &ordinal};
    CUresult rc = cu->cuPointerGetAttributes(3, attrs, data, (CUdeviceptr)ptr);
    if (rc == GK_CUDA_ERROR_INVALID_VALUE)
        return 0;           /* not an address CUDA knows */
    if (rc != GK_CUDA_SUCCESS)
        return GDRKV_E_INTERNAL;
    /* Managed memory is reachable from the CPU: treat it as host memory. */
    if (type != GK_CU_MEMORYTYPE_DEVICE || managed || ordinal < 0)
        return 0;
    *device = ordinal;
    return 1;
}

const char *gk_cuda_strerror(CUresult err)
{
    static __thread char buf[32];
    const char *text = NULL;
    if (loaded && loaded->cuGetErrorString(err, &text) == GK_CUDA_SUCCESS && text)
        return text;
    snprintf(buf, sizeof buf, "CUDA error %d", err);
    return buf;
}
