/*
 * grow.h - the one growable-array helper: lists that gain an element at a
 * time (copy pieces, WRs, registered ranges, MRs) double their capacity so
 * that adding stays amortised O(1).
 */
#ifndef GDRKV_GROW_H
#define GDRKV_GROW_H

#include <stddef.h>
#include <stdint.h>

/* Makes room for at least `need` elements of `elem` bytes in the array
 * whose pointer is at `array` (any T **), with capacity *cap elements:
 * doubles it, starting at `first`. Returns 0, or -1 when out of memory,
 * with the array and *cap left as they were. */
int gk_grow(void *array, uint32_t *cap, size_t need, size_t elem, uint32_t first);

/* A byte buffer of exactly `need` bytes or more (frame bodies, responses:
 * bounded by the protocol's limits, so no doubling past them). 0, or -1
 * when out of memory with *buf and *cap as they were. */
int gk_buf_reserve(uint8_t **buf, size_t *cap, size_t need);

#endif
