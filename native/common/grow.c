/*
 * grow.c - gk_grow (grow.h).
 */
#include "grow.h"

#include <stdlib.h>
#include <string.h>

int gk_grow(void *array, uint32_t *cap, size_t need, size_t elem, uint32_t first)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : first;
    while (n < need)
        n *= 2;
    if (n > UINT32_MAX || n > SIZE_MAX / elem)
        return -1;
    /* The pointer goes through memcpy: `array` points at a T *, not at a
     * void *, and the two may not be accessed as each other. */
    void *old;
    memcpy(&old, array, sizeof old);
    void *p = realloc(old, n * elem);
    if (!p)
        return -1;
    memcpy(array, &p, sizeof p);
    *cap = (uint32_t)n;
    return 0;
}

int gk_buf_reserve(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    uint8_t *p = realloc(*buf, need);
    if (!p)
        return -1;
    *buf = p;
    *cap = need;
    return 0;
}
