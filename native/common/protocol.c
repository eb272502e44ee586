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

int gk_op_is_keyed(uint8_t opcode)
{
    return opcode == GK_OP_EXISTS || opcode == GK_OP_GET || opcode == GK_OP_PUT ||
           opcode == GK_OP_DELETE || opcode == GK_OP_CLEAR || opcode == GK_OP_LEASE ||
           opcode == GK_OP_RESERVE || opcode == GK_OP_PUT_STAGED;
}

/* Whether opcode reads or writes the pool in place: shm or rdma only. */
static int op_is_in_place(uint8_t opcode)
{
    return opcode == GK_OP_LEASE || opcode == GK_OP_RELEASE || opcode == GK_OP_RESERVE ||
           opcode == GK_OP_COMMIT || opcode == GK_OP_PUT_STAGED;
}

int gk_op_is_transport(uint8_t opcode)
{
    return opcode == GK_OP_HELLO || opcode == GK_OP_RDMA_HELLO || opcode == GK_OP_AUTH ||
           op_is_in_place(opcode);
}

const char *gk_op_name(uint8_t opcode)
{
    switch (opcode & ~GK_OP_RESPONSE) {
    case GK_OP_PING: return "ping";
    case GK_OP_EXISTS: return "exists";
    case GK_OP_GET: return "get";
    case GK_OP_PUT: return "put";
    case GK_OP_DELETE: return "delete";
    case GK_OP_STATS: return "stats";
    case GK_OP_CLEAR: return "clear";
    case GK_OP_HELLO: return "hello";
    case GK_OP_LEASE: return "lease";
    case GK_OP_RELEASE: return "release";
    case GK_OP_RDMA_HELLO: return "rdma_hello";
    case GK_OP_RESERVE: return "reserve";
    case GK_OP_COMMIT: return "commit";
    case GK_OP_AUTH: return "auth";
    case GK_OP_PUT_STAGED: return "put_staged";
    default: return "unknown";
    }
}

int gk_check_request_hdr(const struct gk_hdr *h)
{
    if (h->magic != GK_MAGIC)
        return GDRKV_E_PROTOCOL;
    if (h->body_len > GK_MAX_BODY || h->count > GK_MAX_KEYS || h->payload_len > GK_MAX_PAYLOAD)
        return GDRKV_E_TOO_LARGE;
    if (h->version != GK_VERSION || h->opcode == 0 || h->opcode > GK_OP_MAX)
        return GDRKV_E_UNSUPPORTED;
    if (h->payload_len != 0 && h->opcode != GK_OP_PUT)
        return GDRKV_E_PROTOCOL;
    /* The unkeyed ops with a body: RDMA_HELLO's endpoint, COMMIT's flags,
     * AUTH's nonce or proof. */
    if (h->opcode == GK_OP_RDMA_HELLO)
        return h->count == 0 && h->body_len <= GK_MAX_RDMA_HELLO ? 0 : GDRKV_E_PROTOCOL;
    if (h->opcode == GK_OP_COMMIT)
        return h->body_len == h->count ? 0 : GDRKV_E_PROTOCOL;
    if (h->opcode == GK_OP_AUTH)     /* a nonce, or a proof: both 32 bytes */
        return h->count == 0 && h->body_len == GK_AUTH_NONCE_SIZE ? 0 : GDRKV_E_PROTOCOL;
    if (!gk_op_is_keyed(h->opcode) && (h->count != 0 || h->body_len != 0))
        return GDRKV_E_PROTOCOL;
    if (h->opcode == GK_OP_CLEAR && h->count != 0)
        return GDRKV_E_PROTOCOL;
    /* Each entry needs at least its fixed part and one key byte. */
    if (gk_op_is_keyed(h->opcode) &&
        (uint64_t)h->count * (GK_ENTRY_HDR_SIZE + 1) + 1 > h->body_len)
        return GDRKV_E_PROTOCOL;
    return 0;
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
    if (h->opcode == GK_OP_PUT ? payload != h->payload_len : h->payload_len != 0)
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
