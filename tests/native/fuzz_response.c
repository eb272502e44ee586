/*
 * fuzz_response.c - fuzz target for the client's reading of server answers:
 * the chunk lists of LEASE and RESERVE answers (native/client_chunks.c), the
 * pool offsets a hostile or broken server could use to make the client
 * copy (shm) or READ/WRITE (rdma) outside the pool or the caller's memory.
 *
 * Built like fuzz_protocol.c: a libFuzzer target with clang
 * -fsanitize=fuzzer, else a driver in main() that feeds it random inputs
 * and mutations of well-formed answers for a bounded time under ASan/UBSan.
 * The input describes the batch (pool size, each key's segments and object
 * size, which keys have a list) and then carries the chunk lists; every
 * piece the walker hands out is checked against the pool and the segments,
 * and an accepted answer must cover each listed object exactly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_state.h"
#include "client/client_chunks.h"
#define FUZZ_NAME "fuzz_response"
#include "fuzz_driver.h"
#include "common/common.h"
#include "gdrkv.h"
#include "common/protocol.h"

#define MAX_KEYS 8
#define MAX_SEGS 3

struct walk {
    const struct client_batch *b;
    const uint32_t *nsegs;
    uint64_t pool_size;
    uint32_t first, count;
    uint64_t covered[MAX_KEYS];
};

static int piece(void *arg, uint32_t p, uint64_t seg, uint64_t seg_off, uint64_t pool_off,
                 uint64_t len)
{
    struct walk *w = arg;
    const struct client_batch *b = w->b;
    check(p >= w->first && p < w->first + w->count, "key inside the frame");
    check(seg >= b->first_seg[p] && seg < b->first_seg[p] + w->nsegs[p], "segment of its key");
    check(len > 0 && seg_off <= b->seg_lens[seg] && len <= b->seg_lens[seg] - seg_off,
          "piece inside its segment");
    check(pool_off <= w->pool_size && len <= w->pool_size - pool_off, "piece inside the pool");
    w->covered[p] += len;
    return 0;
}

static uint64_t take(const uint8_t **data, size_t *size, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes && *size; i++, (*data)++, (*size)--)
        v |= (uint64_t)**data << (8 * i);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t seg_lens[MAX_KEYS * MAX_SEGS], first_seg[MAX_KEYS], obj_lens[MAX_KEYS];
    uint32_t index[MAX_KEYS], nsegs[MAX_KEYS];
    int64_t results[MAX_KEYS];
    uint8_t listed[MAX_KEYS];

    /* The batch: pool size, keys, and per key its segments, object size,
     * status and whether a list follows (as RESERVE's flags). */
    uint64_t pool_size = take(&data, &size, 1) % 4 == 0 ? take(&data, &size, 8)
                                                      : take(&data, &size, 3);
    uint32_t n = 1 + (uint32_t)(take(&data, &size, 1) % MAX_KEYS);
    int use_listed = (int)(take(&data, &size, 1) & 1);
    uint64_t nseg = 0;
    for (uint32_t p = 0; p < n; p++) {
        nsegs[p] = 1 + (uint32_t)(take(&data, &size, 1) % MAX_SEGS);
        first_seg[p] = nseg;
        uint64_t capacity = 0;
        for (uint32_t s = 0; s < nsegs[p]; s++) {
            seg_lens[nseg] = take(&data, &size, 2);
            capacity += seg_lens[nseg++];
        }
        /* The caller checked the object against the capacity first. */
        obj_lens[p] = capacity ? take(&data, &size, 2) % (capacity + 1) : 0;
        uint8_t flags = (uint8_t)take(&data, &size, 1);
        results[p] = flags & 1 ? GDRKV_E_NOT_FOUND : 0;
        listed[p] = (flags >> 1) & 1;
        index[p] = p;
    }
    uint32_t first = (uint32_t)(take(&data, &size, 1) % n);
    uint32_t count = n - first;

    /* The lists in a heap block of their exact size, so ASan sees any read
     * past the answer. */
    uint8_t *lists = malloc(size ? size : 1);
    check(lists != NULL, "allocation");
    memcpy(lists, data, size);
    struct client_batch b = {.seg_lens = seg_lens, .results = results, .index = index,
                             .first_seg = first_seg};
    struct walk w = {.b = &b, .nsegs = nsegs, .pool_size = pool_size, .first = first,
                     .count = count};
    int rc = client_chunks_walk(lists, size, pool_size, &b, first, count,
                                use_listed ? listed + first : NULL, obj_lens, piece, &w);
    check(rc == 0 || rc == GDRKV_E_PROTOCOL, "walk status");
    if (rc == 0) {
        for (uint32_t k = 0; k < count; k++) {
            uint32_t p = first + k;
            int has = use_listed ? listed[p] : results[p] >= 0;
            check(w.covered[p] == (has ? obj_lens[p] : 0), "each listed object covered exactly");
        }
    }
    free(lists);
    return 0;
}

#ifndef GK_LIBFUZZER

static size_t put(uint8_t *buf, size_t len, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        buf[len++] = (uint8_t)(v >> (8 * i));
    return len;
}

/* A batch description and chunk lists that fit it, so mutations start from
 * answers the walker accepts and reach its checks. */
static size_t make_valid(uint8_t *buf, size_t cap)
{
    uint64_t pool = 1 + rnd() % (1u << 20);
    uint32_t n = 1 + (uint32_t)(rnd() % MAX_KEYS);
    int use_listed = (int)(rnd() & 1);
    uint64_t obj[MAX_KEYS];
    uint8_t has[MAX_KEYS];
    size_t len = put(buf, 0, 1, 1);                  /* 3-byte pool size */
    len = put(buf, len, pool, 3);
    len = put(buf, len, n - 1, 1);
    len = put(buf, len, (uint64_t)use_listed, 1);
    for (uint32_t p = 0; p < n; p++) {
        uint32_t segs = 1 + (uint32_t)(rnd() % MAX_SEGS);
        uint64_t cap = 0;
        len = put(buf, len, segs - 1, 1);
        for (uint32_t s = 0; s < segs; s++) {
            uint64_t l = rnd() % 5000;
            cap += l;
            len = put(buf, len, l, 2);
        }
        obj[p] = cap ? rnd() % (cap + 1) : 0;
        len = put(buf, len, obj[p], 2);
        uint8_t flags = (uint8_t)(rnd() % 4);
        len = put(buf, len, flags, 1);
        has[p] = use_listed ? (flags >> 1) & 1 : !(flags & 1);
    }
    len = put(buf, len, 0, 1);                       /* first key of the frame: 0 */
    for (uint32_t p = 0; p < n; p++) {
        if (!has[p])
            continue;
        uint32_t nchunks = obj[p] ? 1 + (uint32_t)(rnd() % 4) : 0;
        uint64_t left = obj[p];
        len = put(buf, len, nchunks, 4);
        len = put(buf, len, 0, 4);
        for (uint32_t k = 0; k < nchunks; k++) {
            uint64_t l = k + 1 == nchunks ? left : rnd() % (left + 1);
            uint64_t off = l < pool ? rnd() % (pool - l + 1) : 0;
            left -= l;
            len = put(buf, len, off, 8);
            len = put(buf, len, l, 8);
        }
    }
    return len;
}

static size_t mutate_once(uint8_t *buf, size_t len, size_t cap)
{
    if (rnd() % 4 || len < 8)
        return mutate_bytes(buf, len, cap);
    /* An interesting 64-bit value: offsets and lengths that wrap. */
    static const uint64_t vals[] = {0, 1, UINT64_MAX, UINT64_MAX - 7, 1ull << 63,
                                    0xffffffffu, 1u << 20, (1u << 20) - 1};
    gk_store64(buf + rnd() % (len - 7), vals[rnd() % GK_ARRAY_LEN(vals)]);
    return len;
}

int main(int argc, char **argv)
{
    static uint8_t buf[1 << 12];
    return fuzz_main(argc, argv, buf, sizeof buf, 2);
}

#endif
