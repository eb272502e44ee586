/*
 * client_state.h - the structs the client wing's files share, at the
 * bottom of the wing: any client file may include it, and it includes no
 * client header but the two leaf ones whose structs the client embeds
 * (common/copy.h, client_regions.h). client.h has the wing's file map.
 *
 *   struct gdrkv_client      the client: options, server table, ranges, counters
 *   struct client_counters   the client's counters (CLIENT_COUNTERS)
 *   struct client_endpoint   how to reach one server (address, unix socket, rdma, pool)
 *   struct client_pool       a server's pool, mapped (shm)
 *   struct client_staging    a connection's staging memfd, mapped (shm PUT)
 *   struct client_keys       a keyed call's arguments, as the public API takes them
 *   struct client_batch      one call taken apart: its keys grouped by server
 *   struct client_frame      one request and its response
 *   struct client_job        the frames one connection carries in turn
 *   struct client_call       a batch and its jobs, for the poll loop
 */
#ifndef GDRKV_CLIENT_STATE_H
#define GDRKV_CLIENT_STATE_H

#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/copy.h"
#include "client_regions.h"
#include "common/auth.h"
#include "common/net.h"
#include "gdrkv.h"
#include "gpu/gpu.h"
#include "gpu/gpu_slices.h"
#include "common/protocol.h"
#include "common/stats.h"

struct client_conn;
struct client_rdma;
struct client_server;
struct gpu_call;

/* ------------------------------------------------------------ the client */

/* The rdma transport's counters, X(name, what it counts), kept in struct
 * client_rdma (client_rdma.h) and printed by gdrkv_client_stats as
 * rdma_<name>. */
#define CLIENT_RDMA_COUNTERS(X)                                                   \
    X(read_frames, "GET frames moved by RDMA READs")                              \
    X(write_frames, "PUT frames moved by RDMA WRITEs")                            \
    X(work_requests, "work requests posted")                                      \
    X(doorbells, "ibv_post_send calls")                                           \
    X(completions, "completions polled")                                          \
    X(bytes, "bytes moved by READs and WRITEs")                                   \
    X(fallback_frames, "frames sent over the socket: segments not registered")    \
    X(flush_reads, "flush READs before a GET into GPU memory returned")           \
    X(gpu_mrs, "GPU memory registrations")                                        \
    X(gpu_mrs_dmabuf, "of gpu_mrs, through dma-buf")

/* The client's counters, one line each, in the order gdrkv_client_stats
 * prints them (after calls_OP and keys_OP, before servers and the
 * latencies). OWN(name) is a counter of struct client_counters; CALL(name)
 * one too, which a call counts in its struct client_batch as it runs and
 * adds once at its end (client_run.c); FROM(name, value) is read where it
 * lives when the text is made: value is an expression of c, the client;
 * RDMA(name, help) are the rdma transport's (CLIENT_RDMA_COUNTERS); GPU(name)
 * counts a GPU call's launches (gpu.h, GPU_STATS) as gpu_<name>, added at
 * the call's end. A new counter is one line here. */
#define CLIENT_COUNTERS(OWN, CALL, FROM, RDMA, GPU)                                             \
    CALL(bytes_sent)                                                                            \
    CALL(bytes_received)                                                                        \
    OWN(errors_timeout)             /* keys (or keyless frames) failed by each error */         \
    OWN(errors_unavailable)                                                                     \
    OWN(errors_protocol)                                                                        \
    OWN(errors_denied)                                                                          \
    OWN(connects)                   /* connections opened */                                    \
    OWN(connect_failures)                                                                       \
    OWN(shortcircuit_keys)          /* keys failed at once because their server was down */    \
    OWN(shm_connects)               /* of connects, over a unix socket with the pool mapped */  \
    OWN(hits)                       /* GET keys read */                                         \
    OWN(misses)                     /* GET keys the server did not have (NOT_FOUND) */          \
    OWN(exists_hits)                /* EXISTS keys found */                                     \
    OWN(exists_misses)              /* EXISTS keys not found */                                 \
    CALL(shm_bytes_copied)          /* GET bytes copied out of a mapped pool */                 \
    CALL(shm_bytes_staged)          /* PUT bytes copied into staging or the pool */             \
    CALL(shm_leases_expired)        /* LEASE frames whose keys failed: lease lost */            \
    CALL(shm_leases_seen_held)      /* LEASE frames whose RELEASE went unanswered */            \
    CALL(shm_staged_sent_again)     /* followed PUT_STAGED frames the server sent back */       \
    OWN(failovers)                  /* keys read again at their next candidate */              \
    OWN(read_throughs)              /* keys read again at an owner under the previous members */\
    OWN(put_copies_short)           /* keys stored with fewer copies than replicas */           \
    OWN(membership_changes)         /* tables installed by gdrkv_client_set_members */          \
    FROM(members, client_table_members(c))                                                      \
    FROM(rdma_open, __atomic_load_n(&c->rdma->state, __ATOMIC_RELAXED) == 1)                    \
    CLIENT_RDMA_COUNTERS(RDMA)                                                                  \
    GPU_STATS(GPU)                                                                              \
    FROM(gpu_pinned_bytes, gk_counter_get(&c->gpu_pins.stats.pinned_bytes))                     \
    FROM(gpu_slices_registered, gk_counter_get(&c->gpu_pins.stats.slices_registered))           \
    FROM(gpu_slices_failed, gk_counter_get(&c->gpu_pins.stats.slices_failed))                   \
    FROM(gpu_slices_over_limit, gk_counter_get(&c->gpu_pins.stats.slices_over_limit))           \
    FROM(gpu_slices_evicted, gk_counter_get(&c->gpu_pins.stats.slices_evicted))                 \
    FROM(gpu_slice_demands, gk_counter_get(&c->gpu_pins.stats.demands))                         \
    FROM(gpu_register_us, gk_counter_get(&c->gpu_pins.stats.register_us))                       \
    FROM(gpu_register_max_us, gk_counter_get(&c->gpu_pins.stats.register_max_us))

#define CLIENT_COUNTER_FIELD(name) uint64_t name;
#define CLIENT_COUNTER_GPU_FIELD(name) uint64_t gpu_##name;
#define CLIENT_COUNTER_NONE(name)
#define CLIENT_COUNTER_NONE2(name, value)

/* Updated with relaxed atomics from any calling thread. */
struct client_counters {
    uint64_t calls[GK_OP_MAX + 1];
    uint64_t keys[GK_OP_MAX + 1];
    struct gk_latency latency[GK_OP_MAX + 1];
    CLIENT_COUNTERS(CLIENT_COUNTER_FIELD, CLIENT_COUNTER_FIELD, CLIENT_COUNTER_NONE2,
                    CLIENT_COUNTER_NONE2, CLIENT_COUNTER_GPU_FIELD)
};

/* What the client's shm pools may register with CUDA for GPU copies, and
 * what they did (docs/gpu.md, "What each process pins"): one for all of
 * its servers' pools, each a gpu_slices of its own. */
struct client_gpu_pins {
    uint64_t limit;                 /* per pool; 0: the whole pool */
    uint64_t ahead;                 /* per pool, before any copy asks */
    struct gpu_slices_stats stats;  /* the client's counters gpu_* */
};

/* A client is shared by many threads: everything but the counters and the
 * server table is set at open and only read after; the table is swapped
 * whole (client_table.h); each server guards its own state. */
struct gdrkv_client {
    gdrkv_client_opts opts;         /* servers and ns are not kept: see below */
    char ns_name[GK_MAX_NS_LEN + 1];
    struct gk_ns ns;
    pthread_mutex_t table_lock;     /* guards the pointer `table` (client_table.h) */
    pthread_mutex_t swap_lock;      /* one gdrkv_client_set_members at a time */
    struct client_table *table;     /* the members and their servers, swapped whole */
    struct client_regions regions;
    struct gk_copier copier;    /* helper threads for large shm copies */
    uint64_t shm_put_frame_bytes;   /* values per PUT frame through shm staging */
    struct gpu_serial gpu_put_streams;  /* GPU PUTs without a caller's stream launch here */
    struct client_rdma *rdma;       /* device and MRs of the rdma transport */
    struct gk_token token;          /* opts.token_file's (or GDRKV_TOKEN_FILE's); len 0: none */
    struct client_counters counters;
    struct client_gpu_pins gpu_pins;
};

/* Room for "[", a gk_addr host, "]:", a port and the NUL; and for
 * "unix:" and a socket path. */
#define CLIENT_SERVER_NAME_MAX (sizeof(((struct gk_addr *)0)->host) + 9)

/* The port of a server address given without one. */
#define CLIENT_DEFAULT_PORT 7480

/* How to reach one server: what a connection is opened over. Its unix
 * socket first, with the server's pool mapped (shm), where it has one;
 * else tcp; with QPs on the tcp connection where rdma is on. Set when the
 * client opens (client_server.c) and only read after, but for the pool
 * mapping, which has its own lock. */
struct client_endpoint {
    char name[CLIENT_SERVER_NAME_MAX];  /* canonical "host:port", "[v6]:port" or "unix:PATH" */
    struct gk_addr addr;            /* unused for a unix: server */
    char unix_path[GK_UNIX_PATH_MAX];   /* where to try shm first; "" = tcp only */
    int shm_only;                   /* no tcp fallback: a unix: server, or transport shm */
    struct client_rdma *rdma;       /* the client's, when transport rdma, or auto to another host */
    int rdma_only;                  /* transport rdma: no plain tcp fallback */
    const struct gk_token *token;   /* the client's, or NULL: no handshake */
    pthread_mutex_t pool_lock;      /* guards pool */
    struct client_pool *pool;       /* the mapping new connections share, or NULL */
    struct client_gpu_pins *gpu_pins;   /* the client's, for its pools */
};

/* One mapping of a server's pool. A restarted server has a new memfd, so a
 * new mapping; the old one goes when its last connection does. */
struct client_pool {
    const uint8_t *base;
    uint64_t size;          /* the server's capacity: every chunk lies below it */
    size_t map_len;
    dev_t dev;
    ino_t ino;
    uint32_t refs;          /* atomic: the server's current pool holds one */
    int writable;           /* single-tenant server: PUTs copy into the pool */
    uint64_t staging_len;   /* atomic: value bytes of its connections' staging */
    struct client_gpu_pins *gpu_pins;   /* the client's */
    struct gpu_slices *gpu_slices;  /* atomic: made reachable from the GPU in slices,
                                       from its first GPU copy on (client_gpu.c) */
    int gpu_failed;         /* ...or that could not be set up: the copy engines do */
    /* What the server was told of the slices' pins (PINS, client_shm.c). */
    pthread_mutex_t pins_lock;  /* orders the reports: each seq goes with its bytes */
    uint64_t pins_mapping;      /* this mapping's name in them, unique in the process */
    uint64_t pins_seq;          /* the last report's */
    uint64_t pins_told;         /* atomic: the bytes it said; reset by each new
                                   connection, which may be the process's only one */
    int pins_off;               /* atomic: the server refused one: no more */
};

/* A connection's staging memfd (HELLO's second fd), mapped writable: its
 * PUT values go there, and the server copies them into the pool. */
struct client_staging {
    uint8_t *base;          /* NULL: the server gave none */
    uint64_t len;           /* bytes for values */
    uint64_t map_len;
    const uint32_t *lease_word; /* after the values (GK_HELLO_LEASE_WORD), or NULL */
    uint64_t *staged_word;      /* GK_HELLO_STAGED_WORD: bytes staged so far, or NULL */
    int gpu_state;          /* registered with CUDA: 0 not yet, 1 yes, -1 failed */
    uint64_t gpu_dptr;      /* where the GPU writes base (client_gpu.c) */
};

/* ------------------------------------------------------------ a call */

/* A keyed call's arguments, as the public API takes them. */
struct client_keys {
    uint32_t n;
    const char *keys;
    const uint32_t *key_lens;
    const uint64_t *seg_ptrs;       /* NULL for EXISTS and DELETE */
    const uint64_t *seg_lens;
    const uint32_t *seg_counts;
    int64_t *results;
    uint64_t stream;                /* GET/PUT: the caller's CUstream, or 0 */
    int want_copies;                /* PUT: results[i] = copies written, not 0 */
    /* A GET into memory the call allocates (gdrkv_get_alloc): seg_ptrs and
     * seg_lens are these, one segment per key, 0 and GK_MAX_OBJECT until
     * the answer tells a key's size (client_frame_take_results); else NULL. */
    uint64_t *alloc_ptrs;
    uint64_t *alloc_lens;
};

/* One call taken apart: the keys grouped by server (client_call.c builds
 * it), the request/response exchanges that carry them (struct
 * client_frame), and the frames each connection carries in turn (struct
 * client_job, driven by client_run.c, one frame at a time by
 * client_conn.c). */
struct client_batch {
    uint8_t opcode;
    const struct gk_ns *ns;

    /* The caller's arrays, indexed like the caller's keys. */
    const uint64_t *seg_ptrs;
    const uint64_t *seg_lens;
    const uint32_t *seg_counts;
    int64_t *results;
    /* Where position p's result goes: results[slot[p]] (a key sent to
     * several servers has a result per copy), or NULL: results[index[p]]. */
    uint32_t *slot;
    uint64_t *alloc_ptrs;   /* the same as seg_ptrs/seg_lens, writable, for a GET */
    uint64_t *alloc_lens;   /* whose destinations the answers allocate; else NULL */

    /* The keys that go on the wire, grouped by server: position p is the
     * caller's key index[p]. Gathered so that a frame's keys are one run
     * the protocol encoder takes as is. */
    uint32_t *index;
    uint32_t *key_lens;
    uint64_t *sizes;        /* entry size: PUT value bytes, GET capacity, else 0 */
    uint64_t *first_seg;    /* the key's first entry in seg_ptrs/seg_lens */
    uint64_t *got;          /* GET: bytes the response carries for the key */
    uint8_t *keys;

    /* STATS copies the server's text here (NUL-terminated, truncated). */
    char *text;
    size_t text_cap;

    /* shm: the client's copy helpers. */
    struct gk_copier *copier;
    /* The call's deadline, for the transports' synchronous steps (copies,
     * RDMA completions). */
    uint64_t deadline_ns;

    /* GPU segments of the call (client_gpu_call.h), or NULL when there are none. */
    struct gpu_call *gpu;

    /* Traffic of the call, added to the client's counters once at the end:
     * the CALL counters of CLIENT_COUNTERS. */
    CLIENT_COUNTERS(CLIENT_COUNTER_NONE, CLIENT_COUNTER_FIELD, CLIENT_COUNTER_NONE2,
                    CLIENT_COUNTER_NONE2, CLIENT_COUNTER_NONE)
    uint32_t follows_in_flight;     /* followed frames sent, not yet answered */
    uint32_t frames_unstarted;      /* frames of the call not begun yet */
};

/* One request and its response. */
struct client_frame {
    uint32_t first;         /* positions of its keys in the batch */
    uint32_t count;
    uint64_t key_off;       /* offset of its first key's bytes in batch->keys */
    uint32_t body_len;      /* request body bytes */
    uint64_t payload_len;   /* PUT: value bytes that follow the body */
    uint8_t *buf;           /* request header + body, then response header + body */
    size_t buf_cap;
    int64_t result;         /* keyless ops: CLEAR's count, STATS' text length, or an error */
};

/* The frames one connection carries, one after the other. */
struct client_job {
    uint32_t server;        /* index in the client's server table */
    struct client_frame *frames;
    uint32_t nframes;
    uint32_t done;          /* frames answered so far */
    struct client_conn *conn;
    int err;                /* why the frames from `done` on failed, or 0 */
    const char *why;        /* the same, for the log */
};

struct client_call {
    struct client_batch batch;
    struct client_server **servers; /* the table's (client_table.h): jobs index it */
    struct client_job *jobs;    /* grouped by server, in server order */
    uint32_t njobs;
    struct pollfd *pollfds;     /* one per job, for the poll loop */
    uint64_t deadline_ns;
};

/* The result of the key at position p. */
static inline int64_t *client_result(const struct client_batch *b, uint32_t p)
{
    return &b->results[b->slot ? b->slot[p] : b->index[p]];
}

/* Gives every key of f (or f itself, for keyless ops) the result err. */
static inline void client_frame_fail(struct client_batch *b, struct client_frame *f, int err)
{
    if (!gk_op_has_keys(b->opcode)) {
        f->result = err;
        return;
    }
    for (uint32_t p = f->first; p < f->first + f->count; p++)
        *client_result(b, p) = err;
}

#endif
