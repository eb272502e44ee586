/*
 * server_ops.c - see server_ops.h. Each keyed op is one store batch call;
 * the store takes its lock once per call, never once per key.
 */
#include "server_ops.h"

#include <string.h>

#include "server_conn.h"
#include "store.h"

static struct store *store_of(struct server_conn *c)
{
    return c->worker->server->store;
}

/* One result per key; sizes may be NULL when every size is 0. */
static int respond_results(struct server_conn *c, uint32_t n, const int32_t *status,
                           const uint64_t *sizes, uint64_t payload_len)
{
    uint8_t *body = server_conn_response(c, 0, n, n * GK_RESULT_SIZE, payload_len);
    if (!body)
        return GDRKV_E_INTERNAL;
    for (uint32_t i = 0; i < n; i++)
        gk_result_encode(body + (size_t)i * GK_RESULT_SIZE, status[i], sizes ? sizes[i] : 0);
    return 0;
}

static int op_stats(struct server_conn *c)
{
    char text[SERVER_STATS_MAX];
    struct gk_text t;

    gk_text_init(&t, text, sizeof text);
    server_stats_text(c->worker->server, &t);
    int len = gk_text_finish(&t);
    uint8_t *body = server_conn_response(c, 0, 0, (uint32_t)len, 0);
    if (!body)
        return GDRKV_E_INTERNAL;
    memcpy(body, text, (size_t)len);
    return 0;
}

static int op_exists(struct server_conn *c)
{
    struct server_batch *b = &c->batch;
    store_exists_batch(store_of(c), &c->ns, b->entries, c->req.count, b->status, b->sizes);
    return respond_results(c, c->req.count, b->status, b->sizes, 0);
}

/* Pins the objects until their bytes are written; objects larger than the
 * client's destination are answered with their size only, and let go now. */
static int op_get(struct server_conn *c)
{
    struct store *s = store_of(c);
    struct server_batch *b = &c->batch;
    uint32_t n = c->req.count;
    uint64_t payload_len = 0;

    store_pin_batch(s, &c->ns, b->entries, n, 1, b->objs, b->status, b->sizes);
    c->holds = CONN_HOLDS_PINS;
    for (uint32_t i = 0; i < n; i++) {
        if (!b->objs[i])
            continue;
        if (b->sizes[i] > b->entries[i].size) {
            store_unpin_batch(s, &b->objs[i], 1);
            b->objs[i] = NULL;
            b->status[i] = GDRKV_E_TOO_SMALL;
        } else {
            payload_len += b->sizes[i];
        }
    }
    server_payload_start(&c->payload, store_base(s), b->entries, b->objs, n, 0, payload_len);
    return respond_results(c, n, b->status, b->sizes, payload_len);
}

/* Reserves room for the values; the connection then reads the payload
 * straight into it (server_ops_finish_put answers once it is all there). */
static int op_put(struct server_conn *c)
{
    struct store *s = store_of(c);
    struct server_batch *b = &c->batch;

    store_reserve_batch(s, &c->ns, b->entries, c->req.count, b->objs, b->status);
    c->holds = CONN_HOLDS_RESERVATIONS;
    server_payload_start(&c->payload, store_base(s), b->entries, b->objs, c->req.count, 1,
                         c->req.payload_len);
    return 0;
}

int server_ops_finish_put(struct server_conn *c)
{
    struct server_batch *b = &c->batch;
    uint32_t n = c->req.count;

    store_commit_batch(store_of(c), b->objs, n);
    c->holds = CONN_HOLDS_NOTHING;
    /* Put-if-absent: a key someone else already stored is a success. */
    for (uint32_t i = 0; i < n; i++)
        if (b->status[i] == STORE_PRESENT)
            b->status[i] = 0;
    return respond_results(c, n, b->status, NULL, 0);
}

static int op_delete(struct server_conn *c)
{
    struct server_batch *b = &c->batch;
    store_delete_batch(store_of(c), &c->ns, b->entries, c->req.count, b->status);
    return respond_results(c, c->req.count, b->status, NULL, 0);
}

static int op_clear(struct server_conn *c)
{
    int32_t status = 0;
    uint64_t removed = store_clear_ns(store_of(c), &c->ns);
    return respond_results(c, 1, &status, &removed, 0);
}

int server_ops_execute(struct server_conn *c)
{
    switch (c->req.opcode) {
    case GK_OP_PING: return server_conn_response(c, 0, 0, 0, 0) ? 0 : GDRKV_E_INTERNAL;
    case GK_OP_STATS: return op_stats(c);
    case GK_OP_EXISTS: return op_exists(c);
    case GK_OP_GET: return op_get(c);
    case GK_OP_PUT: return op_put(c);
    case GK_OP_DELETE: return op_delete(c);
    case GK_OP_CLEAR: return op_clear(c);
    }
    return GDRKV_E_UNSUPPORTED;   /* gk_check_request_hdr let no other opcode through */
}

void server_ops_release(struct server_conn *c)
{
    struct server_batch *b = &c->batch;

    if (c->holds == CONN_HOLDS_PINS)
        store_unpin_batch(store_of(c), b->objs, c->req.count);
    else if (c->holds == CONN_HOLDS_RESERVATIONS)
        store_abort_batch(store_of(c), b->objs, c->req.count);
    c->holds = CONN_HOLDS_NOTHING;
}
