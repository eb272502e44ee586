/*
 * protocol.c - encoding and validation of frames (see protocol.h). Every
 * length read from the network is checked against what is left of the
 * buffer before it is used: this file is what the fuzz target exercises.
 */
#include "protocol.h"

#include "common.h"
#include "gdrkv.h"

void gk_hdr_encode(const struct gk_hdr *h, uint8_t out[GK_HDR_SIZE])
{
    gk_store32(out + 0, h->magic);
    out[4] = h->version;
    out[5] = h->opcode;
    gk_store16(out + 6, h->flags);
    gk_store32(out + 8, (uint32_t)h->status);
    gk_store32(out + 12, h->count);
    gk_store32(out + 16, h->body_len);
    gk_store32(out + 20, h->reserved);
    gk_store64(out + 24, h->payload_len);
    gk_store64(out + 32, h->req_id);
}

void gk_hdr_decode(const uint8_t in[GK_HDR_SIZE], struct gk_hdr *h)
{
    h->magic = gk_load32(in + 0);
    h->version = in[4];
    h->opcode = in[5];
    h->flags = gk_load16(in + 6);
    h->status = (int32_t)gk_load32(in + 8);
    h->count = gk_load32(in + 12);
    h->body_len = gk_load32(in + 16);
    h->reserved = gk_load32(in + 20);
    h->payload_len = gk_load64(in + 24);
    h->req_id = gk_load64(in + 32);
}

const struct gk_op_info gk_op_table[GK_OP_MAX + 1] = {
    [0] = {.name = "unknown"},
#define GK_OP_LINE(NAME, code, name_, body_, results_, trans, in, out, after, reads_, reach_) \
    [code] = {.name = #name_, .body = GK_BODY_##body_, .results = GK_RESULTS_##results_,       \
              .transport = trans, .payload_in = in, .payload_out = out,                       \
              .body_after_results = after, .reads = reads_, .reach = GK_REACH_##reach_},
    GK_OPS(GK_OP_LINE)
#undef GK_OP_LINE
};

/* GK_OP_MAX counts the ops: every code must lie in 1..GK_OP_MAX (and the
 * table's initialisers refuse a code twice), so none is left out. */
#define GK_OP_IN_RANGE(NAME, code, name, body, results, trans, in, out, after, reads, reach)  \
    _Static_assert(code >= 1 && code <= GK_OP_MAX, "opcode " #name " out of 1..GK_OP_MAX");
GK_OPS(GK_OP_IN_RANGE)
#undef GK_OP_IN_RANGE

int gk_check_request_hdr(const struct gk_hdr *h)
{
    if (h->magic != GK_MAGIC)
        return GDRKV_E_PROTOCOL;
    if (h->body_len > GK_MAX_BODY || h->count > GK_MAX_KEYS || h->payload_len > GK_MAX_PAYLOAD)
        return GDRKV_E_TOO_LARGE;
    if (h->version != GK_VERSION || h->opcode == 0 || h->opcode > GK_OP_MAX)
        return GDRKV_E_UNSUPPORTED;
    const struct gk_op_info *op = gk_op(h->opcode);
    if (h->payload_len != 0 && !op->payload_in)
        return GDRKV_E_PROTOCOL;
    int ok = 0;
    switch (op->body) {
    case GK_BODY_NONE: ok = h->count == 0 && h->body_len == 0; break;
    case GK_BODY_ENDPOINT: ok = h->count == 0 && h->body_len <= GK_MAX_RDMA_HELLO; break;
    case GK_BODY_VERDICTS: ok = h->body_len == h->count; break;
    case GK_BODY_NONCE: ok = h->count == 0 && h->body_len == GK_AUTH_NONCE_SIZE; break;
    case GK_BODY_PINS: ok = h->count == 0 && h->body_len == GK_PINS_BODY_SIZE; break;
    /* Each entry needs at least its fixed part and one key byte. */
    case GK_BODY_NS:
    case GK_BODY_KEYS:
        ok = (op->body == GK_BODY_KEYS || h->count == 0) &&
             (uint64_t)h->count * (GK_ENTRY_HDR_SIZE + 1) + 1 <= h->body_len;
        break;
    }
    return ok ? 0 : GDRKV_E_PROTOCOL;
}

int gk_parse_request_body(const struct gk_hdr *h, const uint8_t *body,
                          struct gk_ns *ns, struct gk_entry *entries)
{
    uint64_t left = h->body_len;
    const uint8_t *p = body;
    uint64_t payload = 0;

    if (left < 1)
        return GDRKV_E_PROTOCOL;
    ns->len = p[0];
    p++, left--;
    if (ns->len > left)
        return GDRKV_E_PROTOCOL;
    ns->name = p;
    p += ns->len, left -= ns->len;

    for (uint32_t i = 0; i < h->count; i++) {
        if (left < GK_ENTRY_HDR_SIZE)
            return GDRKV_E_PROTOCOL;
        uint32_t key_len = gk_load32(p);
        uint64_t size = gk_load64(p + 4);
        p += GK_ENTRY_HDR_SIZE, left -= GK_ENTRY_HDR_SIZE;
        if (key_len == 0 || key_len > left)
            return GDRKV_E_PROTOCOL;
        if (key_len > GK_MAX_KEY_LEN || size > GK_MAX_OBJECT)
            return GDRKV_E_TOO_LARGE;
        entries[i].key = p;
        entries[i].key_len = key_len;
        entries[i].size = size;
        payload += size;
        p += key_len, left -= key_len;
    }
    if (left != 0)
        return GDRKV_E_PROTOCOL;
    if (gk_op(h->opcode)->payload_in ? payload != h->payload_len
                                                   : h->payload_len != 0)
        return GDRKV_E_PROTOCOL;
    return 0;
}

uint64_t gk_request_body_size(uint32_t ns_len, uint32_t n, const uint32_t *key_lens)
{
    uint64_t size = 1 + (uint64_t)ns_len + (uint64_t)n * GK_ENTRY_HDR_SIZE;
    for (uint32_t i = 0; i < n; i++)
        size += key_lens[i];
    return size;
}

uint64_t gk_encode_request_body(uint8_t *out, const struct gk_ns *ns, uint32_t n,
                                const uint8_t *keys, const uint32_t *key_lens,
                                const uint64_t *sizes)
{
    uint8_t *p = out;
    *p++ = (uint8_t)ns->len;
    memcpy(p, ns->name, ns->len);
    p += ns->len;
    for (uint32_t i = 0; i < n; i++) {
        gk_store32(p, key_lens[i]);
        gk_store64(p + 4, sizes ? sizes[i] : 0);
        p += GK_ENTRY_HDR_SIZE;
        memcpy(p, keys, key_lens[i]);
        p += key_lens[i];
        keys += key_lens[i];
    }
    return (uint64_t)(p - out);
}

void gk_result_encode(uint8_t out[GK_RESULT_SIZE], int32_t status, uint64_t size)
{
    gk_store32(out, (uint32_t)status);
    gk_store32(out + 4, 0);
    gk_store64(out + 8, size);
}

void gk_result_decode(const uint8_t in[GK_RESULT_SIZE], struct gk_result *r)
{
    r->status = (int32_t)gk_load32(in);
    r->size = gk_load64(in + 8);
}

/* ------------------------------------------------------------ pin reports */

void gk_pins_encode(uint8_t out[GK_PINS_BODY_SIZE], const struct gk_pins *p)
{
    gk_store64(out, p->mapping);
    gk_store64(out + 8, p->seq);
    gk_store64(out + 16, p->bytes);
}

int gk_pins_decode(const uint8_t *in, size_t len, struct gk_pins *p)
{
    if (len != GK_PINS_BODY_SIZE)
        return GDRKV_E_PROTOCOL;
    p->mapping = gk_load64(in);
    p->seq = gk_load64(in + 8);
    p->bytes = gk_load64(in + 16);
    return p->mapping && p->seq ? 0 : GDRKV_E_PROTOCOL;
}

/* ------------------------------------------------------------ chunk lists */

uint8_t *gk_chunk_list_encode(uint8_t *out, uint32_t nchunks)
{
    gk_store32(out, nchunks);
    gk_store32(out + 4, 0);
    return out + GK_LEASE_OBJ_SIZE;
}

uint8_t *gk_chunk_encode(uint8_t *out, uint64_t off, uint64_t len)
{
    gk_store64(out, off);
    gk_store64(out + 8, len);
    return out + GK_LEASE_CHUNK_SIZE;
}

void gk_chunk_reader_init(struct gk_chunk_reader *r, const uint8_t *lists, size_t len)
{
    *r = (struct gk_chunk_reader){.at = lists, .left = len};
}

int gk_chunk_reader_list(struct gk_chunk_reader *r, uint32_t *nchunks)
{
    if (r->left < GK_LEASE_OBJ_SIZE)
        return GDRKV_E_PROTOCOL;
    uint32_t n = gk_load32(r->at);
    r->at += GK_LEASE_OBJ_SIZE, r->left -= GK_LEASE_OBJ_SIZE;
    if (n > r->left / GK_LEASE_CHUNK_SIZE)
        return GDRKV_E_PROTOCOL;
    *nchunks = n;
    return 0;
}

void gk_chunk_reader_chunk(struct gk_chunk_reader *r, uint64_t *off, uint64_t *len)
{
    *off = gk_load64(r->at);
    *len = gk_load64(r->at + 8);
    r->at += GK_LEASE_CHUNK_SIZE, r->left -= GK_LEASE_CHUNK_SIZE;
}

/* ------------------------------------------------------------ rdma records */

size_t rdma_endpoint_size(const struct rdma_endpoint *e)
{
    return RDMA_ENDPOINT_MIN + (size_t)e->nqps * RDMA_QP_WIRE_SIZE;
}

size_t rdma_endpoint_encode(const struct rdma_endpoint *e, uint8_t *out)
{
    out[0] = e->eth;
    out[1] = e->mtu;
    gk_store16(out + 2, e->lid);
    memcpy(out + 4, e->gid, 16);
    gk_store32(out + 20, e->rd_atomic);
    gk_store32(out + 24, e->sq_depth);
    gk_store32(out + 28, e->max_sge);
    gk_store32(out + 32, e->nqps);
    gk_store32(out + 36, 0);
    uint8_t *p = out + RDMA_ENDPOINT_MIN;
    for (uint32_t i = 0; i < e->nqps; i++, p += RDMA_QP_WIRE_SIZE) {
        gk_store32(p, e->qpn[i]);
        gk_store32(p + 4, e->psn[i]);
    }
    return (size_t)(p - out);
}

size_t rdma_endpoint_decode(const uint8_t *in, size_t len, struct rdma_endpoint *e)
{
    if (len < RDMA_ENDPOINT_MIN)
        return 0;
    e->eth = in[0];
    e->mtu = in[1];
    e->lid = gk_load16(in + 2);
    memcpy(e->gid, in + 4, 16);
    e->rd_atomic = gk_load32(in + 20);
    e->sq_depth = gk_load32(in + 24);
    e->max_sge = gk_load32(in + 28);
    e->nqps = gk_load32(in + 32);
    if (e->eth > 1 || e->mtu < 1 || e->mtu > 5 || e->nqps == 0 || e->nqps > RDMA_MAX_QPS ||
        e->rd_atomic == 0 || e->sq_depth == 0 || e->max_sge == 0 ||
        len < rdma_endpoint_size(e))
        return 0;
    const uint8_t *p = in + RDMA_ENDPOINT_MIN;
    for (uint32_t i = 0; i < e->nqps; i++, p += RDMA_QP_WIRE_SIZE) {
        e->qpn[i] = gk_load32(p);
        e->psn[i] = gk_load32(p + 4);
        if (e->qpn[i] >= (1u << 24) || e->psn[i] >= (1u << 24))
            return 0;
    }
    return (size_t)(p - in);
}

size_t rdma_regions_size(uint32_t n)
{
    return 8 + (size_t)n * RDMA_REGION_WIRE_SIZE;
}

size_t rdma_regions_encode(const struct rdma_region *regions, uint32_t n, uint8_t *out)
{
    gk_store32(out, n);
    gk_store32(out + 4, 0);
    uint8_t *p = out + 8;
    for (uint32_t i = 0; i < n; i++, p += RDMA_REGION_WIRE_SIZE) {
        gk_store64(p, regions[i].pool_off);
        gk_store64(p + 8, regions[i].len);
        gk_store64(p + 16, regions[i].addr);
        gk_store32(p + 24, regions[i].rkey);
        gk_store32(p + 28, 0);
    }
    return (size_t)(p - out);
}

int rdma_regions_decode(const uint8_t *in, size_t len, struct rdma_region *out, uint32_t max)
{
    if (len < 8)
        return -1;
    uint32_t n = gk_load32(in);
    if (n == 0 || n > max || len != rdma_regions_size(n))
        return -1;
    const uint8_t *p = in + 8;
    uint64_t next = 0;
    for (uint32_t i = 0; i < n; i++, p += RDMA_REGION_WIRE_SIZE) {
        struct rdma_region *r = &out[i];
        r->pool_off = gk_load64(p);
        r->len = gk_load64(p + 8);
        r->addr = gk_load64(p + 16);
        r->rkey = gk_load32(p + 24);
        /* In pool order, back to back: a chunk's offset finds its region. */
        if (r->pool_off != next || r->len == 0 || r->pool_off + r->len < r->pool_off ||
            r->addr + r->len < r->addr)
            return -1;
        next = r->pool_off + r->len;
    }
    return (int)n;
}
