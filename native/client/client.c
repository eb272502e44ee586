/*
 * client.c - the client half of gdrkv.h: options, the server table, and
 * the public entry points, each of which becomes a keyed batch or a
 * keyless call (client_call.c).
 *
 * A client is shared by many threads: the options never change after
 * open, the server table is swapped whole (client_table.c), each server
 * guards its own pool and health, and the counters are atomics. gdrkv_client_close frees everything; the binding
 * drops its pointer then, and a NULL client reads as closed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "client_call.h"
#include "client_rdma.h"
#include "client_server.h"
#include "client_table.h"
#include "common/errors.h"
#include "common/net.h"

#define CLIENT_MAX_CONNS 64
/* Read-through lasts two of the cluster's default lease TTLs (5 s): by
 * then the PUTs of keys the change moved have mostly landed at their new
 * owners. */
#define CLIENT_DEFAULT_SETTLE_MS 10000
/* shm copies, out of the pool and into staging, are shared with up to 7
 * helpers (one fewer than the CPUs) from 512 KiB on a host of 8 CPUs or
 * more: one core copies well below what the pool and staging take, and
 * alone the calling thread fills a PUT's frames one after another
 * (docs/transports.md, "GET: lease, copy, release"). On a smaller host only
 * frames from 4 MiB are: a helper there takes the core the server copies
 * on. */
#define CLIENT_COPY_HELPERS 7
#define CLIENT_COPY_PARALLEL_BYTES (512u << 10)
#define CLIENT_COPY_PARALLEL_BYTES_FEW_CPUS (4u << 20)
#define CLIENT_COPY_MANY_CPUS 8

/* Value bytes of a PUT frame to a server reached over shm: the client
 * copies a frame into its connection's staging, then the server copies it
 * into the pool (a single larger object is a frame of its own). On a
 * small host, 1 MiB frames keep the staged bytes in the CPU cache between
 * the two copies, and let the server copy one connection's frame while
 * the client fills the next's. Where both copies are shared with helpers,
 * a 1 MiB frame's copy is mostly the helpers' wake-ups, and 8 MiB frames
 * go as fast as 16 MiB ones with half the staging in flight
 * (docs/transports.md, "PUT: staging, then the server's copy"). */
#define CLIENT_SHM_PUT_FRAME_BYTES (1u << 20)
#define CLIENT_SHM_PUT_FRAME_BYTES_MANY_CPUS (8u << 20)

void gdrkv_client_opts_init(gdrkv_client_opts *opts)
{
    *opts = (gdrkv_client_opts){
        .servers = "",
        .ns = "",
        .timeout_ms = 5000,
        .connect_timeout_ms = 1000,
        .conns = 4,
        .backoff_min_ms = 100,
        .backoff_max_ms = 5000,
        .replicas = 1,
        .settle_ms = CLIENT_DEFAULT_SETTLE_MS,
    };
}

static int check_opts(const gdrkv_client_opts *o, char *err, size_t errlen)
{
    int no_servers = !o->servers || !*o->servers;
    if (no_servers && !o->members_later)
        return gk_error(err, errlen, GDRKV_E_INVALID, "empty server list");
    if (!no_servers && o->members_later)
        return gk_error(err, errlen, GDRKV_E_INVALID,
                          "members_later takes no server list: members come later");
    if (o->replicas == 0 || o->replicas > PLACEMENT_MAX_REPLICAS)
        return gk_error(err, errlen, GDRKV_E_INVALID, "replicas must be 1..%d",
                          PLACEMENT_MAX_REPLICAS);
    if (o->ns && strlen(o->ns) > GK_MAX_NS_LEN)
        return gk_error(err, errlen, GDRKV_E_INVALID,
                          "namespace '%.40s...' is longer than %d bytes",
                          o->ns, GK_MAX_NS_LEN);
    if (o->conns == 0 || o->conns > CLIENT_MAX_CONNS)
        return gk_error(err, errlen, GDRKV_E_INVALID, "conns must be 1..%d", CLIENT_MAX_CONNS);
    if (o->timeout_ms == 0)
        return gk_error(err, errlen, GDRKV_E_INVALID, "timeout_ms must be positive");
    if (o->connect_timeout_ms == 0)
        return gk_error(err, errlen, GDRKV_E_INVALID, "connect_timeout_ms must be positive");
    if (o->backoff_max_ms < o->backoff_min_ms)
        return gk_error(err, errlen, GDRKV_E_INVALID, "backoff_max_ms is below backoff_min_ms");
    if (o->transport < GDRKV_TRANSPORT_AUTO || o->transport > GDRKV_TRANSPORT_RDMA)
        return gk_error(err, errlen, GDRKV_E_INVALID, "transport must be auto, tcp, shm or rdma");
    if (o->gpu_copy < GDRKV_GPU_COPY_AUTO || o->gpu_copy > GDRKV_GPU_COPY_ENGINE)
        return gk_error(err, errlen, GDRKV_E_INVALID,
                          "gpu_copy must be auto, kernel or copy_engine");
    return 0;
}

int gdrkv_client_open(const gdrkv_client_opts *opts, gdrkv_client **out, char *err, size_t errlen)
{
    if (!opts || !out)
        return gk_error(err, errlen, GDRKV_E_INVALID, "no options or no place for the client");
    *out = NULL;
    int rc = check_opts(opts, err, errlen);
    if (rc)
        return rc;
    gdrkv_client *c = calloc(1, sizeof *c);
    if (!c)
        return gk_error(err, errlen, GDRKV_E_INTERNAL, "out of memory");
    if (pthread_mutex_init(&c->table_lock, NULL))
        goto no_table_lock;
    if (pthread_mutex_init(&c->swap_lock, NULL))
        goto no_swap_lock;
    if (client_regions_init(&c->regions))
        goto no_regions;
    int many_cpus = sysconf(_SC_NPROCESSORS_ONLN) >= CLIENT_COPY_MANY_CPUS;
    if (gk_copier_init(&c->copier, CLIENT_COPY_HELPERS,
                       many_cpus ? CLIENT_COPY_PARALLEL_BYTES : CLIENT_COPY_PARALLEL_BYTES_FEW_CPUS))
        goto no_copier;
    c->shm_put_frame_bytes =
        many_cpus ? CLIENT_SHM_PUT_FRAME_BYTES_MANY_CPUS : CLIENT_SHM_PUT_FRAME_BYTES;
    c->rdma = calloc(1, sizeof *c->rdma);
    if (!c->rdma || client_rdma_init(c->rdma))
        goto no_rdma;
    c->opts = *opts;
    c->gpu_pins.limit = opts->gpu_pin_limit;
    c->gpu_pins.ahead = opts->gpu_pin_ahead;
    c->opts.servers = NULL;
    c->opts.token_file = NULL;
    const char *token_file = opts->token_file ? opts->token_file : getenv("GDRKV_TOKEN_FILE");
    if (token_file && *token_file) {
        rc = gk_token_load(token_file, &c->token, err, errlen);
        if (rc) {
            gdrkv_client_close(c);
            return rc;
        }
    }
    snprintf(c->ns_name, sizeof c->ns_name, "%s", opts->ns ? opts->ns : "");
    c->opts.ns = c->ns_name;
    c->ns.name = (const uint8_t *)c->ns_name;
    c->ns.len = (uint32_t)strlen(c->ns_name);

    rc = client_table_open(c, opts->members_later ? NULL : opts->servers, err, errlen);
    if (rc) {
        gdrkv_client_close(c);
        return rc;
    }
    *out = c;
    return 0;

no_rdma:
    free(c->rdma);
    gk_copier_destroy(&c->copier);
no_copier:
    client_regions_destroy(&c->regions);
no_regions:
    pthread_mutex_destroy(&c->swap_lock);
no_swap_lock:
    pthread_mutex_destroy(&c->table_lock);
no_table_lock:
    free(c);
    return gk_error(err, errlen, GDRKV_E_INTERNAL, "out of memory");
}

void gdrkv_client_close(gdrkv_client *c)
{
    if (!c)
        return;
    client_table_close(c);
    client_regions_destroy(&c->regions);
    gk_copier_destroy(&c->copier);
    gpu_serial_free(&c->gpu_put_streams);   /* after the connections that launched on them */
    /* After the servers: their connections' QPs go before the device. */
    client_rdma_destroy(c->rdma);
    free(c->rdma);
    pthread_mutex_destroy(&c->swap_lock);
    pthread_mutex_destroy(&c->table_lock);
    free(c);
}

/* With rdma possible, the range also becomes an MR. Under auto a failed
 * registration only means those frames go over the socket; under rdma it
 * is the caller's error. */
int gdrkv_client_register(gdrkv_client *c, uint64_t ptr, uint64_t len)
{
    int device;
    uint64_t buffer_id;

    if (!c)
        return GDRKV_E_CLOSED;
    if (len == 0 || ptr + len < ptr)
        return GDRKV_E_INVALID;
    int rc = gpu_probe_region(ptr, len, &device, &buffer_id);
    if (rc >= 0)
        rc = client_regions_add(&c->regions, ptr, len, device, buffer_id);
    if (rc || c->opts.transport == GDRKV_TRANSPORT_TCP || c->opts.transport == GDRKV_TRANSPORT_SHM)
        return rc;
    int rrc = client_rdma_register(c->rdma, ptr, len, device);
    if (rrc && c->opts.transport == GDRKV_TRANSPORT_RDMA) {
        client_regions_remove(&c->regions, ptr);
        return rrc;
    }
    return 0;
}

int gdrkv_client_unregister(gdrkv_client *c, uint64_t ptr)
{
    if (!c)
        return GDRKV_E_CLOSED;
    int rc = client_regions_remove(&c->regions, ptr);
    if (rc == 0)
        client_rdma_unregister(c->rdma, ptr);
    return rc;
}

/* ------------------------------------------------------------ batches */

int gdrkv_batch_put(gdrkv_client *c, uint32_t n, const char *keys, const uint32_t *key_lens,
                    const uint64_t *seg_ptrs, const uint64_t *seg_lens,
                    const uint32_t *seg_counts, int64_t *results)
{
    return gdrkv_batch_put_stream(c, n, keys, key_lens, seg_ptrs, seg_lens, seg_counts,
                                  results, 0);
}

int gdrkv_batch_get(gdrkv_client *c, uint32_t n, const char *keys, const uint32_t *key_lens,
                    const uint64_t *seg_ptrs, const uint64_t *seg_lens,
                    const uint32_t *seg_counts, int64_t *results)
{
    return gdrkv_batch_get_stream(c, n, keys, key_lens, seg_ptrs, seg_lens, seg_counts,
                                  results, 0);
}

static int data_call(gdrkv_client *c, uint8_t op, uint32_t n, const char *keys,
                     const uint32_t *key_lens, const uint64_t *seg_ptrs,
                     const uint64_t *seg_lens, const uint32_t *seg_counts, int64_t *results,
                     uint64_t stream)
{
    struct client_keys k = {.n = n, .keys = keys, .key_lens = key_lens, .seg_ptrs = seg_ptrs,
                            .seg_lens = seg_lens, .seg_counts = seg_counts, .results = results,
                            .stream = stream};
    return client_keyed_call(c, op, &k);
}

int gdrkv_batch_put_stream(gdrkv_client *c, uint32_t n, const char *keys,
                           const uint32_t *key_lens, const uint64_t *seg_ptrs,
                           const uint64_t *seg_lens, const uint32_t *seg_counts,
                           int64_t *results, uint64_t stream)
{
    return data_call(c, GK_OP_PUT, n, keys, key_lens, seg_ptrs, seg_lens, seg_counts, results,
                     stream);
}

int gdrkv_batch_get_stream(gdrkv_client *c, uint32_t n, const char *keys,
                           const uint32_t *key_lens, const uint64_t *seg_ptrs,
                           const uint64_t *seg_lens, const uint32_t *seg_counts,
                           int64_t *results, uint64_t stream)
{
    return data_call(c, GK_OP_GET, n, keys, key_lens, seg_ptrs, seg_lens, seg_counts, results,
                     stream);
}

int gdrkv_batch_put_copies(gdrkv_client *c, uint32_t n, const char *keys,
                           const uint32_t *key_lens, const uint64_t *seg_ptrs,
                           const uint64_t *seg_lens, const uint32_t *seg_counts,
                           int64_t *results, uint64_t stream)
{
    struct client_keys k = {.n = n, .keys = keys, .key_lens = key_lens, .seg_ptrs = seg_ptrs,
                            .seg_lens = seg_lens, .seg_counts = seg_counts, .results = results,
                            .stream = stream, .want_copies = 1};
    return client_keyed_call(c, GK_OP_PUT, &k);
}

int gdrkv_batch_exists(gdrkv_client *c, uint32_t n, const char *keys, const uint32_t *key_lens,
                       int64_t *results)
{
    struct client_keys k = {.n = n, .keys = keys, .key_lens = key_lens, .results = results};
    return client_keyed_call(c, GK_OP_EXISTS, &k);
}

int gdrkv_get_alloc(gdrkv_client *c, const char *key, uint32_t key_len, uint8_t **value,
                    int64_t *result)
{
    uint64_t ptr = 0, len = GK_MAX_OBJECT;
    uint32_t one = 1;
    struct client_keys k = {.n = 1, .keys = key, .key_lens = &key_len, .seg_ptrs = &ptr,
                            .seg_lens = &len, .seg_counts = &one, .results = result,
                            .alloc_ptrs = &ptr, .alloc_lens = &len};

    if (!value || !result)
        return GDRKV_E_INVALID;
    *value = NULL;
    int rc = client_keyed_call(c, GK_OP_GET, &k);
    if (rc == 0 && *result >= 0) {
        *value = (uint8_t *)(uintptr_t)ptr;
        return 0;
    }
    free((void *)(uintptr_t)ptr);   /* an answer that came, then the frame failed */
    return rc;
}

void gdrkv_free(void *p)
{
    free(p);
}

int gdrkv_batch_delete(gdrkv_client *c, uint32_t n, const char *keys, const uint32_t *key_lens,
                       int64_t *results)
{
    struct client_keys k = {.n = n, .keys = keys, .key_lens = key_lens, .results = results};
    return client_keyed_call(c, GK_OP_DELETE, &k);
}

/* ------------------------------------------------------------ every server */

/* Runs op on every server of the current table; returns the first
 * failure, else the sum of the servers' results. */
static int64_t on_every_server(gdrkv_client *c, uint8_t op)
{
    if (!c)
        return GDRKV_E_CLOSED;
    struct client_table *t = client_table_get(c);
    uint32_t n = t->cur.n;
    int64_t *results = calloc(n ? n : 1, sizeof *results);
    int64_t total = results ? client_server_call(c, t, op, 0, n, results, NULL, 0)
                            : GDRKV_E_INTERNAL;
    for (uint32_t i = 0; i < n && total >= 0; i++)
        total = results[i] < 0 ? results[i] : total + results[i];
    free(results);
    client_table_put(t);
    return total;
}

int64_t gdrkv_clear(gdrkv_client *c)
{
    return on_every_server(c, GK_OP_CLEAR);
}

int gdrkv_ping(gdrkv_client *c)
{
    return (int)on_every_server(c, GK_OP_PING);
}

uint32_t gdrkv_client_nservers(gdrkv_client *c)
{
    return c ? client_table_members(c) : 0;
}

int gdrkv_client_server_name(gdrkv_client *c, uint32_t i, char *buf, size_t len)
{
    if (!c)
        return GDRKV_E_CLOSED;
    if (!buf || !len)
        return GDRKV_E_INVALID;
    struct client_table *t = client_table_get(c);
    int rc = i < t->cur.n ? 0 : GDRKV_E_INVALID;
    if (rc == 0)
        snprintf(buf, len, "%s", t->all[i]->ep.name);
    client_table_put(t);
    return rc;
}

int gdrkv_client_members_text(gdrkv_client *c, char *buf, size_t len)
{
    if (!c)
        return GDRKV_E_CLOSED;
    if (!buf)
        return GDRKV_E_INVALID;
    struct gk_text t;
    gk_text_init(&t, buf, len);
    /* One table for the whole list: server i of two calls may be two
     * members when the cluster swapped the table between them. */
    struct client_table *table = client_table_get(c);
    for (uint32_t i = 0; i < table->cur.n; i++)
        gk_text_printf(&t, "%s\n", table->all[i]->ep.name);
    client_table_put(table);
    return gk_text_finish(&t);
}

int gdrkv_client_server_stats(gdrkv_client *c, uint32_t i, char *buf, size_t len)
{
    if (!c)
        return GDRKV_E_CLOSED;
    if (!buf || !len)
        return GDRKV_E_INVALID;
    struct client_table *t = client_table_get(c);
    int64_t result;
    buf[0] = '\0';
    int rc = i < t->cur.n ? client_server_call(c, t, GK_OP_STATS, i, 1, &result, buf, len)
                          : GDRKV_E_INVALID;
    client_table_put(t);
    return rc ? rc : (int)result;
}

/* ------------------------------------------------------------ counters */

static uint32_t servers_down(struct client_table *t)
{
    uint32_t down = 0;
    for (uint32_t i = 0; i < t->cur.n; i++)
        down += (uint32_t)client_server_is_down(t->all[i]);
    return down;
}

int gdrkv_client_stats(gdrkv_client *c, char *buf, size_t len)
{
    const struct client_counters *k;
    struct gk_text t;
    char name[64];

    if (!c)
        return GDRKV_E_CLOSED;
    if (!buf)
        return GDRKV_E_INVALID;
    k = &c->counters;
    gk_text_init(&t, buf, len);
    for (uint8_t op = 1; op <= GK_OP_MAX; op++) {
        if (gk_op(op)->transport)
            continue;   /* frames of the transport, never calls of their own */
        snprintf(name, sizeof name, "calls_%s", gk_op_name(op));
        gk_text_u64(&t, name, gk_counter_get(&k->calls[op]));
        if (gk_op_has_keys(op)) {
            snprintf(name, sizeof name, "keys_%s", gk_op_name(op));
            gk_text_u64(&t, name, gk_counter_get(&k->keys[op]));
        }
    }
#define OWN_TEXT(field) gk_text_u64(&t, #field, gk_counter_get(&k->field));
#define FROM_TEXT(field, value) gk_text_u64(&t, #field, (value));
#define RDMA_TEXT(field, help) gk_text_u64(&t, "rdma_" #field, gk_counter_get(&c->rdma->field));
#define GPU_TEXT(field) gk_text_u64(&t, "gpu_" #field, gk_counter_get(&k->gpu_##field));
    CLIENT_COUNTERS(OWN_TEXT, OWN_TEXT, FROM_TEXT, RDMA_TEXT, GPU_TEXT)
#undef GPU_TEXT
#undef OWN_TEXT
#undef FROM_TEXT
#undef RDMA_TEXT
    struct client_table *table = client_table_get(c);
    gk_text_u64(&t, "servers", table->cur.n);
    gk_text_u64(&t, "servers_down", servers_down(table));
    client_table_put(table);
    for (uint8_t op = 1; op <= GK_OP_MAX; op++) {
        if (gk_op(op)->transport)
            continue;
        struct gk_latency lat = {0};
        gk_latency_merge(&lat, &k->latency[op]);
        snprintf(name, sizeof name, "latency_%s", gk_op_name(op));
        gk_text_latency(&t, name, &lat);
    }
    return gk_text_finish(&t);
}
