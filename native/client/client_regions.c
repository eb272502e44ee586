/*
 * client_regions.c - see client_regions.h. An engine registers a handful
 * of large buffers once, so a plain array searched linearly is enough.
 */
#include "client_regions.h"

#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "gdrkv.h"

int client_regions_init(struct client_regions *r)
{
    r->list = NULL;
    r->count = r->cap = 0;
    return pthread_mutex_init(&r->lock, NULL) ? GDRKV_E_INTERNAL : 0;
}

void client_regions_destroy(struct client_regions *r)
{
    free(r->list);
    pthread_mutex_destroy(&r->lock);
}

static int overlaps(const struct client_region *a, uint64_t ptr, uint64_t len)
{
    return ptr < a->ptr + a->len && a->ptr < ptr + len;
}

int client_regions_add(struct client_regions *r, uint64_t ptr, uint64_t len, int device,
                       uint64_t buffer_id)
{
    int rc = 0;

    if (len == 0 || ptr + len < ptr)
        return GDRKV_E_INVALID;
    pthread_mutex_lock(&r->lock);
    for (uint32_t i = 0; i < r->count && !rc; i++)
        if (overlaps(&r->list[i], ptr, len))
            rc = GDRKV_E_INVALID;
    if (!rc && gk_grow(&r->list, &r->cap, (size_t)r->count + 1, sizeof *r->list, 8) < 0)
        rc = GDRKV_E_INTERNAL;
    if (!rc)
        r->list[r->count++] = (struct client_region){.ptr = ptr, .len = len, .device = device,
                                                     .buffer_id = buffer_id};
    pthread_mutex_unlock(&r->lock);
    return rc;
}

int client_regions_remove(struct client_regions *r, uint64_t ptr)
{
    int rc = GDRKV_E_NOT_FOUND;

    pthread_mutex_lock(&r->lock);
    for (uint32_t i = 0; i < r->count; i++) {
        if (r->list[i].ptr == ptr) {
            r->list[i] = r->list[--r->count];
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

int client_regions_snapshot(struct client_regions *r, struct client_region **out,
                            uint32_t *count)
{
    int rc = 0;

    pthread_mutex_lock(&r->lock);
    *count = r->count;
    *out = malloc((r->count ? r->count : 1) * sizeof **out);
    if (*out && r->count)
        memcpy(*out, r->list, r->count * sizeof **out);
    else if (!*out)
        rc = GDRKV_E_INTERNAL;
    pthread_mutex_unlock(&r->lock);
    return rc;
}
