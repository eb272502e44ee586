/*
 * server.h - what the files of the server share: the server itself, its
 * worker threads and their counters.
 *
 *   server.c          lifecycle: options, listening socket, threads, stop
 *   server_worker.c   one epoll loop per thread: accept, dispatch, stalls
 *   server_conn.c     a connection's non-blocking frame state machine
 *   server_ops.c      a parsed request -> store calls -> response
 *   server_payload.c  where a frame's payload bytes go in the pool
 *   server_rdma.c     rdma: the registered pool, QPs per connection
 *   server_stats.c    per-worker counters and the stats text
 */
#ifndef GDRKV_SERVER_H
#define GDRKV_SERVER_H

#include <pthread.h>
#include <stdint.h>

#include "gdrkv.h"
#include "common/net.h"
#include "common/protocol.h"
#include "common/stats.h"

struct server_conn;
struct server_rdma;
struct store;

#define SERVER_MAX_WORKERS 16
#define SERVER_TICK_MS 100          /* how often workers look for stalled connections */
#define SERVER_SCRATCH_SIZE (64u << 10)
#define SERVER_STATS_MAX (16u << 10)

/* Every plain counter of a worker, X(name, what it counts): this one list
 * declares the fields, sums them over the workers and prints them
 * (server_stats.c), so adding a counter is one line and the stats text,
 * `gdrkv stat` and the metrics can't drift apart. Per-op counters follow. */
#define SERVER_COUNTERS(X)                                                          \
    X(connections_total, "connections accepted")                                    \
    X(connections_rejected, "connections refused at accept (over max_connections)") \
    X(bytes_in, "PUT payload bytes received")                                       \
    X(bytes_out, "GET payload bytes sent")                                          \
    X(frames_bad, "malformed or rejected frames")                                   \
    X(shm_connections_total, "of connections_total, over the unix socket")          \
    X(shm_connections_refused, "unix peers of another uid")                         \
    X(shm_leases, "LEASE frames answered with offsets")                             \
    X(shm_lease_bytes, "object bytes handed out under leases")                      \
    X(shm_leases_expired, "leases (and RESERVEs) dropped by the timeout")           \
    X(rdma_leases, "LEASE frames of rdma connections")                              \
    X(rdma_lease_bytes, "object bytes they handed out for READs")                   \
    X(rdma_reserved_bytes, "bytes RESERVE handed out for WRITEs")

/* Written only by the worker that owns them, read by whoever asks for
 * stats: relaxed atomics on both sides, summed over workers at read time. */
struct server_counters {
#define SERVER_COUNTER_FIELD(name, help) uint64_t name;
    SERVER_COUNTERS(SERVER_COUNTER_FIELD)
#undef SERVER_COUNTER_FIELD
    uint64_t ops[GK_OP_MAX + 1];
    uint64_t keys[GK_OP_MAX + 1];
    struct gk_latency latency[GK_OP_MAX + 1];
};

struct server_worker {
    struct gdrkv_server *server;
    int epoll_fd;
    int accepting;                  /* listeners in this epoll; off for a tick after EMFILE */
    int runnable;                   /* some connection has work left without an event */
    pthread_t thread;
    struct server_conn *conns;      /* every connection this worker owns */
    uint8_t *scratch;               /* sink for payload bytes nobody keeps */
    struct server_counters counters;
};

struct gdrkv_server {
    struct store *store;
    int listen_fd;
    int unix_fd;                    /* shm listener, or -1 */
    char unix_path[GK_UNIX_PATH_MAX];   /* "" when shm is off */
    uint32_t lease_timeout_ms;
    struct server_rdma *rdma;       /* NULL when rdma is off or unavailable */
    int wake_fd;                    /* eventfd; becomes readable when stop begins */
    char address[300];
    uint32_t stall_timeout_ms;
    uint32_t max_connections;
    uint32_t connections;           /* open connections over all workers (atomic) */
    uint64_t started_ns;
    int nworkers;                   /* workers set up (epoll, scratch) */
    int nthreads;                   /* worker threads actually running */
    int housekeeper_running;
    pthread_t housekeeper;
    struct server_worker workers[SERVER_MAX_WORKERS];
};

/* server_worker.c; init cleans up after itself when it fails. */
int server_worker_init(struct server_worker *w, struct gdrkv_server *s);
void *server_worker_main(void *arg);
void server_worker_destroy(struct server_worker *w);

/* server_stats.c */
void server_count_op(struct server_counters *c, uint8_t opcode, uint32_t keys, uint64_t latency_us);
/* Appends every server counter and the store's stats as "name value" lines. */
void server_stats_text(struct gdrkv_server *s, struct gk_text *t);

#endif
