/*
 * test_cuda_probe.c - gpu/cuda.c's gk_cuda_if_loaded(): a process that has
 * not loaded the driver is told so without the driver being loaded, however
 * often it asks, and a driver loaded later is noticed at the next question.
 * The "driver" is build/libfake_cuda.so, named by GDRKV_CUDA_LIB: once it
 * is noticed, gk_cuda() tries to load its table (and fails: it has no
 * cuInit), which gk_cuda_why() then tells.
 *
 * Also the gpu wing's parts that run without a driver: a copy list's
 * bookkeeping (gpu.c), and the public gdrkv_gpu_* functions (gpu_api.c)
 * on a host where the driver can't be loaded.
 */
#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "gdrkv.h"
#include "gpu/cuda.h"
#include "gpu/gpu.h"

static void test_a_driver_loaded_late_is_noticed(void)
{
    char exe[PATH_MAX], lib[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    CHECK(n > 0, "cannot read /proc/self/exe");
    exe[n] = '\0';
    snprintf(lib, sizeof lib, "%s/libfake_cuda.so", dirname(exe));
    CHECK(setenv("GDRKV_CUDA_LIB", lib, 1) == 0, "setenv");

    for (int i = 0; i < 3; i++)
        CHECK(gk_cuda_if_loaded() == NULL, "no driver is loaded yet");
    CHECK(dlopen(lib, RTLD_NOW | RTLD_NOLOAD) == NULL, "asking loaded the driver");

    void *handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    CHECK(handle != NULL, "cannot load %s: %s", lib, dlerror());
    CHECK(gk_cuda_if_loaded() == NULL, "the stand-in has no driver table");
    /* Had the load gone unnoticed, gk_cuda_why() would load the table now,
     * from this name, and say it cannot. */
    CHECK(setenv("GDRKV_CUDA_LIB", "/nonexistent/libcuda.so.1", 1) == 0, "setenv");
    const char *why = gk_cuda_why();
    CHECK(strstr(why, "libfake_cuda.so has no cuInit") != NULL,
          "the late load was not noticed: %s", why);
    dlclose(handle);
}

/* A launch sizes its descriptors and picks its devices from what the list
 * kept as pieces were added, merged ones included. */
static void test_copy_list_keeps_units_and_devices(void)
{
    struct gpu_list l = {0};
    uint64_t unit = GPU_UNIT_BYTES;

    CHECK_EQ(gpu_list_add(&l, 0, 0x10000, 0x90000, 0), 0);
    CHECK_EQ(l.count, 0u);
    CHECK_EQ(gpu_list_add(&l, 0, 0x100000, 0x900000, unit / 2), 0);
    /* Continues the piece at both ends: merged, still one unit. */
    CHECK_EQ(gpu_list_add(&l, 0, 0x100000 + unit / 2, 0x900000 + unit / 2, unit / 2), 0);
    CHECK_EQ(l.count, 1u);
    CHECK_EQ(l.units, 1u);
    /* Merged past a unit boundary: one more unit. */
    CHECK_EQ(gpu_list_add(&l, 0, 0x100000 + unit, 0x900000 + unit, 1), 0);
    CHECK_EQ(l.count, 1u);
    CHECK_EQ(l.units, 2u);
    /* Another device, not contiguous: a piece of its own. */
    CHECK_EQ(gpu_list_add(&l, 3, 0x500000, 0x600000, 3 * unit), 0);
    CHECK_EQ(l.count, 2u);
    CHECK_EQ(l.units, 5u);
    CHECK_EQ(l.devices, (1u << 0) | (1u << 3));
    CHECK_EQ(l.bytes, unit + 1 + 3 * unit);
    CHECK_EQ(gpu_list_add(&l, GPU_MAX_DEVICES, 0x700000, 0x800000, 1), GDRKV_E_INTERNAL);
    CHECK_EQ(gpu_list_add(&l, -1, 0x700000, 0x800000, 1), GDRKV_E_INTERNAL);
    CHECK_EQ(l.count, 2u);
    gpu_list_reset(&l);
    CHECK_EQ(l.units, 0u);
    CHECK_EQ(l.devices, 0u);
    CHECK_EQ(l.bytes, 0u);
    gpu_list_free(&l);
}

/* Without a driver: bad arguments are refused before CUDA is asked, and
 * good ones get UNSUPPORTED; gdrkv_gpu_available says why not. */
static void test_public_gpu_api_without_a_driver(void)
{
    uint64_t dst = 0x1000, src = 0x2000, len = 16;
    char why[200] = "";

    CHECK(setenv("GDRKV_CUDA_LIB", "/nonexistent/libcuda.so.1", 1) == 0, "setenv");
    CHECK_EQ(gdrkv_gpu_copy(0, 1, NULL, &src, &len, GDRKV_GPU_COPY_AUTO, 0), GDRKV_E_INVALID);
    CHECK_EQ(gdrkv_gpu_copy(-1, 1, &dst, &src, &len, GDRKV_GPU_COPY_AUTO, 0), GDRKV_E_INVALID);
    CHECK_EQ(gdrkv_gpu_copy(GPU_MAX_DEVICES, 1, &dst, &src, &len, GDRKV_GPU_COPY_AUTO, 0),
             GDRKV_E_INVALID);
    CHECK_EQ(gdrkv_gpu_copy(0, 1, &dst, &src, &len, GPU_MODE_PER_PIECE + 1, 0), GDRKV_E_INVALID);
    CHECK_EQ(gdrkv_gpu_copy(0, 1, &dst, &src, &len, GDRKV_GPU_COPY_AUTO, 0),
             GDRKV_E_UNSUPPORTED);
    CHECK_EQ(gdrkv_gpu_available(why, sizeof why), 0);
    CHECK(why[0] != '\0', "no reason given");
    CHECK_EQ(gdrkv_gpu_available(NULL, 0), 0);
}

int main(void)
{
    RUN(test_a_driver_loaded_late_is_noticed);
    RUN(test_copy_list_keeps_units_and_devices);
    RUN(test_public_gpu_api_without_a_driver);
    return check_done("test_cuda_probe");
}
