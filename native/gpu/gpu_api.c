/*
 * gpu_api.c - the public gdrkv_gpu_* functions (gdrkv.h): whether CUDA can
 * be used here, and a batched copy of the caller's pieces through the
 * same launch paths the client's transports use (gpu.h). Their process
 * globals live here and nowhere else.
 */
#include <pthread.h>

#include "gdrkv.h"
#include "gpu.h"

int gdrkv_gpu_available(char *why, size_t len)
{
    char scratch[1];
    return why && len ? gpu_available(why, len) : gpu_available(scratch, sizeof scratch);
}

/* One slot for every caller of gdrkv_gpu_copy, taken in turn. */
static struct gpu_slot copy_slot;
static struct gpu_list copy_list;
static pthread_mutex_t copy_lock = PTHREAD_MUTEX_INITIALIZER;

int gdrkv_gpu_copy(int device, uint32_t n, const uint64_t *dsts, const uint64_t *srcs,
                   const uint64_t *lens, int mode, uint64_t stream)
{
    struct gpu_stats stats = {0};
    int rc = 0;

    if (n && (!dsts || !srcs || !lens))
        return GDRKV_E_INVALID;
    if (device < 0 || device >= GPU_MAX_DEVICES || mode < GPU_MODE_AUTO ||
        mode > GPU_MODE_PER_PIECE)
        return GDRKV_E_INVALID;
    if (!gk_cuda())
        return GDRKV_E_UNSUPPORTED;
    pthread_mutex_lock(&copy_lock);
    gpu_list_reset(&copy_list);
    for (uint32_t i = 0; i < n && !rc; i++)
        rc = gpu_list_add(&copy_list, device, dsts[i], srcs[i], lens[i]);
    if (!rc)
        rc = gpu_slot_launch(&copy_slot, &copy_list, mode, stream, NULL, &stats);
    int wait_rc = gpu_slot_wait(&copy_slot);
    pthread_mutex_unlock(&copy_lock);
    return rc ? rc : wait_rc;
}
