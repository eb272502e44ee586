/*
 * server_reply.c - see server_reply.h.
 */
#include "server_reply.h"

#include <string.h>

#include "common/common.h"
#include "common/grow.h"
#include "server_state.h"

uint8_t *server_reply_start(struct server_conn *c, int32_t status, uint32_t count,
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
    return server_reply_start(c, status, 0, 0, 0) ? 0 : GDRKV_E_INTERNAL;
}

/* A status and len bytes of body. */
static int reply_bytes(struct server_conn *c, int32_t status, const void *bytes, size_t len)
{
    uint8_t *body = server_reply_start(c, status, 0, (uint32_t)len, 0);
    if (!body)
        return GDRKV_E_INTERNAL;
    memcpy(body, bytes, len);
    return 0;
}

int server_reply_error(struct server_conn *c, int32_t code, const char *msg, size_t len)
{
    return reply_bytes(c, code, msg, len);
}

int server_reply_results(struct server_conn *c, uint32_t n, const int32_t *status,
                         const uint64_t *sizes, uint64_t payload_len)
{
    uint8_t *body = server_reply_start(c, 0, n, n * GK_RESULT_SIZE, payload_len);
    if (!body)
        return GDRKV_E_INTERNAL;
    for (uint32_t i = 0; i < n; i++)
        gk_result_encode(body + (size_t)i * GK_RESULT_SIZE, status[i], sizes ? sizes[i] : 0);
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
