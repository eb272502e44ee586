/*
 * client_chunks.c - see client_chunks.h.
 */
#include "client_chunks.h"

#include "common/common.h"
#include "gdrkv.h"
#include "common/protocol.h"

/* Lays one object's chunks over its segments. The object fits its
 * segments (the caller checked its size against their capacity), so the
 * segment index never runs past them. */
static int walk_object(struct gk_chunk_reader *r, uint64_t pool_size,
                       const struct client_batch *b, uint32_t p, uint64_t obj_len,
                       client_chunk_fn fn, void *arg)
{
    uint32_t nchunks;
    if (gk_chunk_reader_list(r, &nchunks))
        return GDRKV_E_PROTOCOL;

    uint64_t seg = b->first_seg[p], seg_off = 0, total = 0;
    for (uint32_t k = 0; k < nchunks; k++) {
        uint64_t off, len;
        gk_chunk_reader_chunk(r, &off, &len);
        if (off > pool_size || len > pool_size - off || len > obj_len - total)
            return GDRKV_E_PROTOCOL;
        total += len;
        while (len > 0) {
            uint64_t room = b->seg_lens[seg] - seg_off;
            if (room == 0) {
                seg++, seg_off = 0;
                continue;
            }
            uint64_t n = GK_MIN(room, len);
            if (fn(arg, p, seg, seg_off, off, n))
                return GDRKV_E_INTERNAL;
            off += n, len -= n, seg_off += n;
        }
    }
    return total == obj_len ? 0 : GDRKV_E_PROTOCOL;
}

int client_chunks_walk(const uint8_t *lists, size_t len, uint64_t pool_size,
                       const struct client_batch *b, uint32_t first, uint32_t count,
                       const uint8_t *listed, const uint64_t *obj_lens, client_chunk_fn fn,
                       void *arg)
{
    struct gk_chunk_reader r;

    gk_chunk_reader_init(&r, lists, len);
    for (uint32_t k = 0; k < count; k++) {
        uint32_t p = first + k;
        if (listed ? !listed[k] : *client_result(b, p) < 0)
            continue;
        int rc = walk_object(&r, pool_size, b, p, obj_lens[p], fn, arg);
        if (rc)
            return rc;
    }
    return gk_chunk_reader_done(&r) ? 0 : GDRKV_E_PROTOCOL;
}
