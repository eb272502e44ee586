/*
 * client_regions.h - the memory ranges registered with a client, host or
 * GPU memory: ranges never overlap, and each is known by its start
 * address. A call looks its segments up here to tell GPU memory from host
 * memory (client_gpu_call.c); the rdma transport registers each range with the
 * NIC as well.
 */
#ifndef GDRKV_CLIENT_REGIONS_H
#define GDRKV_CLIENT_REGIONS_H

#include <pthread.h>
#include <stdint.h>

struct client_region {
    uint64_t ptr;
    uint64_t len;
    int device;             /* GPU ordinal, or -1 for host memory */
    uint64_t buffer_id;     /* GPU: CUDA's id of the allocation, to notice it was freed */
};

struct client_regions {
    pthread_mutex_t lock;
    struct client_region *list;
    uint32_t count, cap;
};

int client_regions_init(struct client_regions *r);
void client_regions_destroy(struct client_regions *r);
/* Adds [ptr, ptr + len) of GPU device's memory (device -1: host memory;
 * buffer_id: CUDA's id of the GPU allocation). 0, or GDRKV_E_INVALID
 * (empty, wrapping, or overlapping a registered range). */
int client_regions_add(struct client_regions *r, uint64_t ptr, uint64_t len, int device,
                       uint64_t buffer_id);
/* A copy of the ranges (*out to free()), for a call to look segments up
 * in without holding the lock; 0 or GDRKV_E_INTERNAL. */
int client_regions_snapshot(struct client_regions *r, struct client_region **out,
                            uint32_t *count);
/* 0, or GDRKV_E_NOT_FOUND when no range starts at ptr. */
int client_regions_remove(struct client_regions *r, uint64_t ptr);

#endif
