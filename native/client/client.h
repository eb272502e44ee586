/*
 * client.h - the top of the client wing (the map of its files is in
 * client_state.h): the client object, its counters, and the two kinds of
 * call every public operation becomes: a keyed batch routed key by key, or
 * one keyless frame to each of some servers.
 */
#ifndef GDRKV_CLIENT_H
#define GDRKV_CLIENT_H

#include <stdint.h>

#include "client_copy.h"
#include "client_rdma.h"
#include "client_regions.h"
#include "gdrkv.h"
#include "common/protocol.h"
#include "common/stats.h"

struct client_server;

/* Every plain counter of a client, X(name, what it counts): this one list
 * declares the fields and prints them (gdrkv_client_stats), so adding a
 * counter is one line. Per-op counters and the rdma ones
 * (CLIENT_RDMA_COUNTERS) are beside it. */
#define CLIENT_COUNTERS(X)                                                                   \
    X(bytes_sent, "value bytes sent")                                                        \
    X(bytes_received, "value bytes received")                                                \
    X(errors_timeout, "keys (or keyless frames) failed by a timeout")                         \
    X(errors_unavailable, "keys (or keyless frames) failed by an unavailable server")         \
    X(errors_protocol, "keys (or keyless frames) failed by a protocol error")                 \
    X(connects, "connections opened")                                                        \
    X(connect_failures, "connections that failed to open")                                   \
    X(shortcircuit_keys, "keys failed at once because their server was down")                \
    X(shm_connects, "of connects, over a unix socket with the pool mapped")                  \
    X(shm_bytes_copied, "GET bytes copied out of a mapped pool")                             \
    X(shm_leases_expired, "LEASE frames whose keys failed: lease lost before RELEASE")       \
    X(gpu_bytes, "bytes moved to or from GPU memory (client_gpu.c)")                         \
    X(gpu_kernel_launches, "copy kernel launches")                                           \
    X(gpu_copy_engine_calls, "cuMemcpyBatchAsync calls")

/* Updated with relaxed atomics from any calling thread. */
struct client_counters {
    uint64_t calls[GK_OP_MAX + 1];
    uint64_t keys[GK_OP_MAX + 1];
    struct gk_latency latency[GK_OP_MAX + 1];
#define CLIENT_COUNTER_FIELD(name, help) uint64_t name;
    CLIENT_COUNTERS(CLIENT_COUNTER_FIELD)
#undef CLIENT_COUNTER_FIELD
};

struct gdrkv_client {
    gdrkv_client_opts opts;         /* servers and ns are not kept: see below */
    char ns_name[GK_MAX_NS_LEN + 1];
    struct gk_ns ns;
    uint32_t nservers;
    struct client_server *servers;
    uint64_t *seeds;                /* servers[i].seed, packed for the routing loop */
    struct client_regions regions;
    struct client_copier copier;    /* helper threads for large shm copies */
    struct client_rdma rdma;        /* device and MRs of the rdma transport */
    struct client_counters counters;
};


/* A batch call's arguments, as the public API takes them. */
struct client_keys {
    uint32_t n;
    const char *keys;
    const uint32_t *key_lens;
    const uint64_t *seg_ptrs;       /* NULL for EXISTS and DELETE */
    const uint64_t *seg_lens;
    const uint32_t *seg_counts;
    int64_t *results;
    uint64_t stream;                /* GET/PUT: the caller's CUstream, or 0 */
};

/* Runs an EXISTS, GET, PUT or DELETE batch (see gdrkv.h for the results). */
int client_keyed_call(struct gdrkv_client *c, uint8_t op, const struct client_keys *k);
/* Sends PING, STATS or CLEAR to servers [first, first + count): results[i]
 * gets server first + i's outcome (CLEAR: objects removed; STATS: length
 * of the text copied to text; else 0) or a negative error. */
int client_server_call(struct gdrkv_client *c, uint8_t op, uint32_t first, uint32_t count,
                       int64_t *results, char *text, size_t text_cap);

#endif
