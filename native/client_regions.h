/*
 * client_regions.h - the memory ranges registered with a client. Over tcp
 * nothing needs pinning, so this is only the bookkeeping the other
 * transports will build on (they map each range once at registration):
 * ranges never overlap, and each is known by its start address.
 */
#ifndef GDRKV_CLIENT_REGIONS_H
#define GDRKV_CLIENT_REGIONS_H

#include <pthread.h>
#include <stdint.h>

struct client_region {
    uint64_t ptr;
    uint64_t len;
};

struct client_regions {
    pthread_mutex_t lock;
    struct client_region *list;
    uint32_t count, cap;
};

int client_regions_init(struct client_regions *r);
void client_regions_destroy(struct client_regions *r);
/* 0, or GDRKV_E_INVALID (empty, wrapping, or overlapping a registered range). */
int client_regions_add(struct client_regions *r, uint64_t ptr, uint64_t len);
/* 0, or GDRKV_E_NOT_FOUND when no range starts at ptr. */
int client_regions_remove(struct client_regions *r, uint64_t ptr);

#endif
