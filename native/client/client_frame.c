/*
 * client_frame.c - see client_frame.h.
 *
 * Every count and length of a success answer was checked against the
 * request by the header check (client_conn.c, take_header) before any
 * helper here reads the body.
 */
#include "client_frame.h"

#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/log.h"
#include "gdrkv.h"

void client_frame_encode(const struct client_batch *b, const struct client_frame *f,
                         uint8_t opcode, uint64_t req_id, uint16_t flags)
{
    struct gk_hdr h = {
        .magic = GK_MAGIC,
        .version = GK_VERSION,
        .opcode = opcode,
        .flags = flags,
        .count = f->count,
        .body_len = f->body_len,
        .payload_len = opcode == GK_OP_PUT ? f->payload_len : 0,
        .req_id = req_id,
    };
    uint8_t *body = f->buf + GK_HDR_SIZE;

    gk_hdr_encode(&h, f->buf);
    if (gk_op_has_keys(b->opcode))
        gk_encode_request_body(body, b->ns, f->count, b->keys + f->key_off,
                               b->key_lens + f->first, b->sizes + f->first);
    else if (gk_op_is_keyed(b->opcode))     /* CLEAR: the namespace, no entries */
        gk_encode_request_body(body, b->ns, 0, NULL, NULL, NULL);
}

void client_frame_expect(struct client_conn *c, uint8_t op, uint64_t req_id,
                         int (*answer)(struct client_conn *c))
{
    c->wire_op = op;
    c->req_id = req_id;
    c->answer = answer;
    c->resp_decoded = 0;
    c->got = 0;
    c->body = c->frame->buf + GK_HDR_SIZE;
}

void client_frame_send_followup(struct client_conn *c, uint8_t *buf, uint32_t count,
                                uint32_t body_len, uint16_t flags)
{
    struct gk_hdr h = {.magic = GK_MAGIC, .version = GK_VERSION, .opcode = c->ex->followup,
                       .flags = flags, .count = count, .body_len = body_len,
                       .req_id = c->next_req_id++};

    client_frame_expect(c, h.opcode, h.req_id, c->ex->followup_answer);
    gk_hdr_encode(&h, buf);
    c->phase = CLIENT_CONN_SEND;
    client_iov_init(&c->io, buf, GK_HDR_SIZE + (size_t)body_len, c->batch, NULL, 0, 0, NULL);
}

int client_frame_broken(struct client_conn *c, const char *why)
{
    c->why = why;
    GK_DEBUG("fd %d: bad %s response: %s", c->fd, gk_op_name(c->batch->opcode), why);
    return GDRKV_E_PROTOCOL;
}

const uint8_t *client_frame_chunk_lists(const struct client_conn *c, size_t *len)
{
    size_t results_len = (size_t)c->frame->count * GK_RESULT_SIZE;
    *len = c->resp.body_len - results_len;
    return c->body + results_len;
}

struct gk_result client_frame_key_result(const struct client_conn *c, uint32_t k)
{
    struct gk_result r;
    gk_result_decode(c->body + (size_t)k * GK_RESULT_SIZE, &r);
    return r;
}

/* A GET into memory the call allocates: position p's object has size
 * bytes, so its one segment becomes that much memory, before any of its
 * bytes arrive. An answer read again (the frame sent again on another
 * connection) replaces the memory of the first. */
static int allocate_destination(struct client_conn *c, uint32_t p, uint64_t size)
{
    struct client_batch *b = c->batch;
    uint64_t seg = b->first_seg[p];

    free((void *)(uintptr_t)b->alloc_ptrs[seg]);
    void *m = malloc(size ? size : 1);
    b->alloc_ptrs[seg] = (uintptr_t)m;
    b->alloc_lens[seg] = m ? size : 0;
    if (m)
        return 0;
    c->why = "out of memory for the object read";
    return GDRKV_E_INTERNAL;
}

int client_frame_take_results(struct client_conn *c, uint64_t *payload)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;
    uint8_t op = b->opcode;

    *payload = 0;
    for (uint32_t k = 0; k < f->count; k++) {
        uint32_t p = f->first + k;
        struct gk_result r = client_frame_key_result(c, k);
        if (r.status > 0)
            return client_frame_broken(c, "positive key status");
        int64_t result = r.status;
        uint64_t carried = 0;
        if (r.status == 0) {
            if (r.size > GK_MAX_OBJECT)
                return client_frame_broken(c, "object size over the limit");
            if (op == GK_OP_GET && r.size > b->sizes[p])
                return client_frame_broken(c, "object larger than its destination");
            carried = op == GK_OP_GET ? r.size : 0;
            result = op == GK_OP_GET || op == GK_OP_EXISTS ? (int64_t)r.size : 0;
            if (op == GK_OP_GET && b->alloc_ptrs) {
                int rc = allocate_destination(c, p, r.size);
                if (rc)
                    return rc;
            }
        }
        if (op == GK_OP_GET) {
            b->got[p] = carried;
            *payload += carried;
        }
        *client_result(b, p) = result;
    }
    return 0;
}

int client_frame_take_plain(struct client_conn *c)
{
    struct client_batch *b = c->batch;
    struct client_frame *f = c->frame;
    const struct gk_hdr *h = &c->resp;

    if (gk_op_has_keys(b->opcode)) {
        uint64_t payload;
        int rc = client_frame_take_results(c, &payload);
        if (rc)
            return rc;
        if (payload != h->payload_len)
            return client_frame_broken(c, "payload length differs from the object sizes");
        if (payload)
            client_iov_init(&c->io, NULL, 0, b, c->seg_ptrs, f->first, f->count, b->got);
        return 0;
    }
    if (b->opcode == GK_OP_CLEAR) {
        struct gk_result r = client_frame_key_result(c, 0);
        int rc = 0;
        if (r.status > 0 || r.size > INT64_MAX)
            rc = client_frame_broken(c, "bad clear result");
        f->result = r.status < 0 ? r.status : (int64_t)r.size;
        return rc;
    }
    if (b->opcode == GK_OP_STATS) {
        size_t len = GK_MIN((size_t)h->body_len, b->text_cap - 1);
        memcpy(b->text, c->body, len);
        b->text[len] = '\0';
        f->result = (int64_t)len;
        return 0;
    }
    f->result = 0;
    return 0;
}

int client_frame_take_reservations(struct client_conn *c, uint8_t **flags_out,
                                   const uint8_t **lists, size_t *len)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;
    size_t need = GK_HDR_SIZE + (size_t)f->count;

    if (need > c->commit_cap) {
        uint8_t *p = realloc(c->commit, need);
        if (!p) {
            c->why = "out of memory";
            return GDRKV_E_INTERNAL;
        }
        c->commit = p;
        c->commit_cap = need;
    }
    uint8_t *flags = c->commit + GK_HDR_SIZE;
    for (uint32_t k = 0; k < f->count; k++) {
        uint32_t p = f->first + k;
        struct gk_result r = client_frame_key_result(c, k);
        if (r.status > GK_RESERVE_PRESENT)
            return client_frame_broken(c, "positive key status");
        if (r.status == 0 && r.size != b->sizes[p])
            return client_frame_broken(c, "reserved size differs from the value's");
        flags[k] = r.status == 0;
        *client_result(b, p) = r.status < 0 ? r.status : 0;
    }
    *flags_out = flags;
    *lists = client_frame_chunk_lists(c, len);
    return 0;
}

/* RELEASE answered: status 0 vouches for the bytes copied (or READ) under
 * the lease; otherwise the lease was lost (the timeout dropped it) and the
 * bytes may be another object's, so every key of the frame fails. */
int client_frame_end_lease(struct client_conn *c)
{
    int32_t status = c->resp.status;
    if (status) {
        GK_DEBUG("fd %d: lease lost (%s): failing %u keys", c->fd, gdrkv_strerror(status),
                 c->frame->count);
        client_frame_fail(c->batch, c->frame, status);
        c->batch->shm_leases_expired++;
    }
    return 1;
}

/* COMMIT answered: the server's word on the keys committed; the others
 * keep what RESERVE or the copies (WRITEs) gave them. */
int client_frame_take_commit(struct client_conn *c)
{
    struct client_batch *b = c->batch;
    const struct client_frame *f = c->frame;
    const uint8_t *flags = c->commit + GK_HDR_SIZE;
    int32_t status = c->resp.status;

    if (status) {
        /* The reservations expired (or the server lost them): what was to
         * be committed is not stored, and the QPs are gone with them. */
        for (uint32_t k = 0; k < f->count; k++)
            if (flags[k])
                *client_result(b, f->first + k) = status;
        c->rdma_broken = 1;
        return 1;
    }
    for (uint32_t k = 0; k < f->count; k++) {
        if (!flags[k])
            continue;
        struct gk_result r = client_frame_key_result(c, k);
        if (r.status > 0)
            return client_frame_broken(c, "positive key status");
        *client_result(b, f->first + k) = r.status;
    }
    return 1;
}
