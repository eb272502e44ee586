/*
 * test_cuda_probe.c - gpu/cuda.c's gk_cuda_if_loaded(): a process that has
 * not loaded the driver is told so without the driver being loaded, however
 * often it asks, and a driver loaded later is noticed at the next question.
 * The "driver" is build/libfake_cuda.so, named by GDRKV_CUDA_LIB: once it
 * is noticed, gk_cuda() tries to load its table (and fails: it has no
 * cuInit), which gk_cuda_why() then tells.
 */
#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "gpu/cuda.h"

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

int main(void)
{
    RUN(test_a_driver_loaded_late_is_noticed);
    return check_done("test_cuda_probe");
}
