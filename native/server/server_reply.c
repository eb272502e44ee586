/*
 * server_reply.c - see server_reply.h.
 */
#include "server_reply.h"

#include <string.h>

#include "common/common.h"
#include "common/grow.h"
#include "server_state.h"
#include "store/store.h"

/* Starts the answer to the current request: encodes its header and returns
 * where its body_len body bytes go, or NULL when out of memory. */
static uint8_t *reply_start(struct server_conn *c, int32_t status, uint32_t count,
                            uint32_t body_len, uint64_t payload_len)
{
    if (gk_buf_reserve(&c->out, &c->out_cap, GK_HDR_SIZE + (size_t)body_len) < 0)
        return NULL;
    struct gk_hdr h = {
        .magic = GK_MAGIC,
        .version = GK_VERSION,
        .opcode = c->req.opcode | GK_OP_RESPONSE,
        .status = status,
        .count = count,
        .body_len = body_len,
        .payload_len = payload_len,
        .req_id = c->req.req_id,
    };
    gk_hdr_encode(&h, c->out);
    c->out_len = GK_HDR_SIZE + (size_t)body_len;
    c->out_sent = 0;
    return c->out + GK_HDR_SIZE;
}

void server_reply_none(struct server_conn *c)
{
    c->out_len = 0;
    c->out_sent = 0;
}

int server_reply_status(struct server_conn *c, int32_t status)
{
    return reply_start(c, status, 0, 0, 0) ? 0 : GDRKV_E_INTERNAL;
}

/* A status and len bytes of body. */
static int reply_bytes(struct server_conn *c, int32_t status, const void *bytes, size_t len)
{
    uint8_t *body = reply_start(c, status, 0, (uint32_t)len, 0);
    if (!body)
        return GDRKV_E_INTERNAL;
    memcpy(body, bytes, len);
    return 0;
}

int server_reply_error(struct server_conn *c, int32_t code, const char *msg, size_t len)
{
    return reply_bytes(c, code, msg, len);
}

/* Starts an answer of n results, then more body bytes; returns where
 * those go. */
static uint8_t *reply_results(struct server_conn *c, uint32_t n, const int32_t *status,
                              const uint64_t *sizes, uint64_t more, uint64_t payload_len)
{
    uint8_t *body = reply_start(c, 0, n, (uint32_t)(n * GK_RESULT_SIZE + more), payload_len);
    if (!body)
        return NULL;
    for (uint32_t i = 0; i < n; i++, body += GK_RESULT_SIZE)
        gk_result_encode(body, status[i], sizes ? sizes[i] : 0);
    return body;
}

int server_reply_results(struct server_conn *c, uint32_t n, const int32_t *status,
                         const uint64_t *sizes, uint64_t payload_len)
{
    return reply_results(c, n, status, sizes, 0, payload_len) ? 0 : GDRKV_E_INTERNAL;
}

/* Capacities are only bounded per key, so many huge objects could need
 * more chunk entries than a body may hold: the caller refuses the frame. */
int server_reply_chunk_lists(struct server_conn *c, uint32_t n, const int32_t *status,
                             const uint64_t *sizes, struct store_obj *const *objs)
{
    uint64_t lists_len = 0;
    uint32_t nchunks;

    for (uint32_t i = 0; i < n; i++) {
        if (objs[i]) {
            store_obj_chunks(objs[i], &nchunks);
            lists_len += gk_chunk_list_size(nchunks);
        }
    }
    if ((uint64_t)n * GK_RESULT_SIZE + lists_len > GK_MAX_BODY)
        return GDRKV_E_TOO_LARGE;
    uint8_t *p = reply_results(c, n, status, sizes, lists_len, 0);
    if (!p)
        return GDRKV_E_INTERNAL;
    for (uint32_t i = 0; i < n; i++) {
        if (!objs[i])
            continue;
        const struct store_chunk *ch = store_obj_chunks(objs[i], &nchunks);
        p = gk_chunk_list_encode(p, nchunks);
        for (uint32_t k = 0; k < nchunks; k++)
            p = gk_chunk_encode(p, ch[k].off, ch[k].len);
    }
    return 0;
}

int server_reply_rdma_hello(struct server_conn *c, const struct rdma_endpoint *mine,
                            const struct rdma_region *regions, uint32_t nregions)
{
    size_t body_len = rdma_endpoint_size(mine) + rdma_regions_size(nregions);
    uint8_t *p = reply_start(c, 0, 0, (uint32_t)body_len, 0);
    if (!p)
        return GDRKV_E_INTERNAL;
    p += rdma_endpoint_encode(mine, p);
    rdma_regions_encode(regions, nregions, p);
    return 0;
}

int server_reply_auth_challenge(struct server_conn *c, const uint8_t nonce[GK_AUTH_NONCE_SIZE],
                                const uint8_t proof[GK_AUTH_PROOF_SIZE])
{
    uint8_t *p = reply_start(c, 0, 0, GK_AUTH_NONCE_SIZE + GK_AUTH_PROOF_SIZE, 0);
    if (!p)
        return GDRKV_E_INTERNAL;
    memcpy(p, nonce, GK_AUTH_NONCE_SIZE);
    memcpy(p + GK_AUTH_NONCE_SIZE, proof, GK_AUTH_PROOF_SIZE);
    return 0;
}

int server_reply_hello(struct server_conn *c, uint64_t pool_size, uint16_t flags, int pool_fd,
                       int staging_fd)
{
    int32_t status = 0;
    if (!reply_results(c, 1, &status, &pool_size, 0, 0))
        return GDRKV_E_INTERNAL;
    server_reply_flags(c, flags);
    c->pass_fds[0] = pool_fd;
    c->pass_fds[1] = staging_fd;
    return 0;
}

void server_reply_flags(struct server_conn *c, uint16_t flags)
{
    gk_store16(c->out + 6, flags);
}

int server_reply_text(struct server_conn *c, const char *text, size_t len)
{
    return reply_bytes(c, 0, text, len);
}
