/*
 * server_payload.c - see server_payload.h.
 */
#include "server_payload.h"

#include "common/common.h"

static const struct store_chunk *chunks_of(const struct server_payload *p, uint32_t *n)
{
    const struct store_obj *o = p->objs[p->entry];
    if (o)
        return store_obj_chunks(o, n);
    *n = 0;
    return NULL;
}

/* Length of the piece under the cursor: one chunk of the entry's object,
 * or the whole entry when it has no object. */
static uint64_t piece_len(const struct server_payload *p)
{
    uint32_t n;
    const struct store_chunk *ch = chunks_of(p, &n);
    if (p->objs[p->entry])
        return p->chunk < n ? ch[p->chunk].len : 0;
    return p->discard_missing ? p->entries[p->entry].size : 0;
}

/* Steps over finished and empty pieces (misses, zero-length objects) so the
 * cursor always rests on a byte still to move, or past the last entry. */
static void settle(struct server_payload *p)
{
    while (p->entry < p->count && p->off == piece_len(p)) {
        uint32_t n;
        chunks_of(p, &n);
        if (p->chunk + 1 < n) {
            p->chunk++;
        } else {
            p->entry++;
            p->chunk = 0;
        }
        p->off = 0;
    }
}

void server_payload_start(struct server_payload *p, uint8_t *base,
                          const struct gk_entry *entries, struct store_obj *const *objs,
                          uint32_t count, int discard_missing, uint64_t total)
{
    *p = (struct server_payload){.base = base, .entries = entries, .objs = objs,
                                 .count = count, .discard_missing = discard_missing,
                                 .left = total};
    settle(p);
}

int server_payload_iov(const struct server_payload *p, uint8_t *scratch, size_t scratch_len,
                       struct iovec *iov, int max)
{
    struct server_payload at = *p;
    int n = 0;

    while (n < max && at.left > 0 && at.entry < at.count) {
        uint64_t len = piece_len(&at) - at.off;
        uint32_t nchunks;
        const struct store_chunk *ch = chunks_of(&at, &nchunks);
        if (at.objs[at.entry]) {
            iov[n].iov_base = at.base + ch[at.chunk].off + at.off;
        } else {
            iov[n].iov_base = scratch;
            len = GK_MIN(len, scratch_len);
        }
        iov[n].iov_len = (size_t)len;
        n++;
        server_payload_advance(&at, len);
    }
    return n;
}

void server_payload_advance(struct server_payload *p, uint64_t n)
{
    p->left -= GK_MIN(n, p->left);
    while (n > 0 && p->entry < p->count) {
        uint64_t take = GK_MIN(piece_len(p) - p->off, n);
        p->off += take;
        n -= take;
        settle(p);
    }
}
