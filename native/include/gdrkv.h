/*
 * gdrkv.h - the public C API of gdrkv: error codes, the in-process server
 * and the client. This is the only header the Python binding (cffi) sees,
 * so it must stay plain C declarations without macros that cffi can't parse
 * (cffi reads the cdef in native/build_native.py, which mirrors this file).
 */
#ifndef GDRKV_H
#define GDRKV_H

#include <stddef.h>
#include <stdint.h>

/* Per-key and per-call result codes. Negative values are errors; they travel
 * on the wire as the per-key status, so never renumber them. */
enum gdrkv_error {
    GDRKV_OK = 0,
    GDRKV_E_NOT_FOUND = -1,   /* no committed object under that key */
    GDRKV_E_TOO_SMALL = -2,   /* destination segments smaller than the object */
    GDRKV_E_NO_SPACE = -3,    /* pool full and nothing evictable */
    GDRKV_E_TIMEOUT = -4,     /* the call's deadline passed */
    GDRKV_E_UNAVAILABLE = -5, /* server unreachable, or marked down (backoff) */
    GDRKV_E_PROTOCOL = -6,    /* malformed frame from the other side */
    GDRKV_E_INVALID = -7,     /* bad argument: key length, segment count, ... */
    GDRKV_E_TOO_LARGE = -8,   /* object or batch over a protocol limit */
    GDRKV_E_BUSY = -9,        /* PUT: object is being written by another client;
                                 read: the reader's pins are at peer_pin_share */
    GDRKV_E_UNSUPPORTED = -10,/* opcode or version the server does not know */
    GDRKV_E_INTERNAL = -11,   /* out of memory or a bug: see the log */
    GDRKV_E_CLOSED = -12,     /* client or server already closed */
    GDRKV_E_DENIED = -13      /* authentication missing or failed (token_file) */
};

const char *gdrkv_strerror(int code);

/* What this build and host offer for the rdma transport, as "name value\n"
 * lines: rdma_built, rdma_library, rdma_available, rdma_why, and per device
 * and port its limits, state, link layer and chosen GID (gdrkv doctor shows
 * them). Returns the length written or a negative error. */
int gdrkv_rdma_report(char *buf, size_t len);

/* ---------------------------------------------------------------- server */

typedef struct gdrkv_server gdrkv_server;

typedef struct gdrkv_server_opts {
    const char *listen;         /* "host:port"; port 0 picks a free one */
    uint64_t memory_bytes;      /* pool size */
    int workers;                /* epoll worker threads; 0 = number of CPUs (max 16) */
    int hugepages;              /* -1 try then fall back, 0 never, 1 require */
    int pretouch;               /* fault the whole pool in at start */
    double high_watermark;      /* evict in the background above this pool use */
    double low_watermark;       /* ... down to this pool use */
    uint32_t stall_timeout_ms;  /* a connection that makes no progress for this
                                   long mid-frame is closed (and its pins dropped) */
    uint32_t max_connections;   /* tcp connections; as many again for local (unix) ones */
    uint32_t max_connections_per_peer; /* tcp connections from one IP address */
    uint32_t idle_timeout_ms;   /* a connection with no frame for this long is closed
                                   (clients reconnect) */
    uint32_t auth_timeout_ms;   /* with a token: a connection not authenticated this
                                   long after accept is closed */
    uint32_t max_unauthenticated; /* with a token: tcp connections before AUTH, apart
                                   from max_connections (docs/operations.md) */
    uint32_t max_unauthenticated_per_peer; /* ... of them from one IP address */
    uint64_t max_buffered_bytes;/* request bodies buffered over all connections; a
                                   frame that would pass it waits (back-pressure) */
    const char *unix_path;      /* socket of the shm transport for local clients;
                                   NULL = the default for the port (docs/transports.md),
                                   "" = no shm */
    uint32_t lease_timeout_ms;  /* an shm or rdma read lease (or an rdma write
                                   reservation) not ended by then is dropped,
                                   and its client told so */
    double peer_pin_share;      /* most of the pool one peer (an IP address, a
                                   local process) may hold pinned by its reads
                                   (tcp GETs in flight, leases); keys past it
                                   are answered GDRKV_E_BUSY */
    int rdma;                   /* -1 serve rdma clients when a device is there,
                                   0 never, 1 require (the start fails without) */
    const char *auth_token_file;/* serve only clients proving they hold this
                                   secret (docs/protocol.md); NULL = anyone */
    int insecure_no_auth;       /* allow a non-loopback listen address without
                                   a token (refused otherwise) */
    uint32_t drain_timeout_ms;  /* at stop, frames in flight may finish for this
                                   long (no new connections meanwhile) */
    const char *metrics_listen; /* "host:port" (or a port: loopback) of an HTTP
                                   endpoint serving GET /metrics (Prometheus
                                   text); NULL = none */
    const char *metrics_token_file; /* /metrics wants "Authorization: Bearer" and
                                   the secret in this file (mode 600); NULL = none */
    uint32_t metrics_namespaces; /* namespaces with series of their own in /metrics
                                   (those with most bytes); the rest are summed */
    uint64_t shm_staging_bytes; /* each local connection's staging memfd, where
                                   its PUT values go (docs/transports.md); larger
                                   frames, and all with 0, go on the socket */
    int single_tenant;          /* local clients map the pool writable and copy
                                   PUT values straight into their reservations:
                                   only for a server whose clients all trust
                                   each other */
    const char *pool_file;      /* back the pool by this file (tmpfs, hugetlbfs)
                                   and serve again the objects a previous server
                                   left in it (docs/operations.md); NULL = none */
    int reset_pool_file;        /* start that file empty, whatever it holds */
    const char *disk;           /* directories of a disk tier under the pool,
                                   comma-separated (docs/operations.md): cold
                                   objects go there instead of being dropped;
                                   NULL or "" = none */
    uint64_t disk_size;         /* bytes of the tier's file in each directory */
    int reset_disk;             /* start the disk files empty, whatever they hold */
    const char *disk_full_policy; /* "throttle" (NULL too): a PUT that finds the pool
                                   full of objects not on disk yet waits for the
                                   disk, up to disk_full_wait_ms; "drop": it evicts
                                   them (docs/operations.md) */
    uint32_t disk_full_wait_ms; /* the longest such a PUT waits; then NO_SPACE */
    int busy_poll_us;           /* after an event a worker polls its connections
                                   without sleeping for this long, so a busy
                                   client's next frame is not held up by a wakeup
                                   (docs/operations.md); 0 = off, -1 = auto:
                                   1000 on hosts of 8 CPUs or more, else off */
    /* Cluster membership (docs/operations.md, "Cluster"): the registration
     * in etcd is run by the Python control plane (gdrkv.cluster), which
     * reports its state back through gdrkv_server_set_cluster. */
    const char *cluster;        /* "etcd://H1:2379,H2:2379/NAME"; NULL = none */
    const char *advertise;      /* "host:port" clients reach this server on;
                                   NULL = the listen address (this host's when
                                   listening on 0.0.0.0) */
    const char *zone;           /* failure domain; NULL = the host name */
    uint32_t cluster_ttl_ms;    /* the etcd lease of the entry, kept alive every
                                   third of it */
    uint32_t cluster_leave_ms;  /* on stop, how long the entry says "leaving"
                                   (reads go on, PUTs go elsewhere) before it
                                   is withdrawn */
} gdrkv_server_opts;

/* Every field above at its default. */
void gdrkv_server_opts_init(gdrkv_server_opts *opts);

/* One option of gdrkv_server_opts, described for the bindings: what
 * gdrkv.Server's keywords, `gdrkv serve`'s flags and its TOML keys are
 * made from (native/server/server_options.c holds the table). */
typedef struct gdrkv_server_option {
    const char *name;           /* the keyword and TOML key; the flag is --name with
                                   dashes (--no-name for a flag on by default) */
    const char *field;          /* the gdrkv_server_opts field it sets */
    const char *kind;           /* "text", "flag" (0/1), "mode" (-1 auto, 0 off, 1 on),
                                   "int", "int_or_auto" (-1 = auto), "size" (bytes),
                                   "ratio" */
    const char *help;
} gdrkv_server_option;

/* Option i, from 0 on; NULL past the last. */
const gdrkv_server_option *gdrkv_server_option_at(uint32_t i);
/* Starts the server's threads; returns 0 or a negative gdrkv_error with a
 * message in err. */
int gdrkv_server_start(const gdrkv_server_opts *opts, gdrkv_server **out,
                       char *err, size_t errlen);
/* The address actually bound, "host:port". */
int gdrkv_server_address(gdrkv_server *s, char *buf, size_t len);
/* The unix socket local clients reach it on; "" when shm is off. */
int gdrkv_server_unix_path(gdrkv_server *s, char *buf, size_t len);
/* Counters as "name value\n" lines; returns the length written (truncated to
 * len-1 and NUL-terminated) or a negative error. */
int gdrkv_server_stats(gdrkv_server *s, char *buf, size_t len);
/* The same counters in the Prometheus text format (what GET /metrics
 * serves), and where that endpoint listens ("" when off). */
int gdrkv_server_metrics(gdrkv_server *s, char *buf, size_t len);
int gdrkv_server_metrics_address(gdrkv_server *s, char *buf, size_t len);
/* The server's place in a cluster, as its registration reports it (stats
 * and /metrics show it): state, when its etcd lease was last granted or
 * renewed (gk clock: CLOCK_MONOTONIC ns; 0 = no lease) and the etcd
 * requests that failed so far. */
enum gdrkv_cluster_state {
    GDRKV_CLUSTER_NONE = 0,         /* not in a cluster */
    GDRKV_CLUSTER_UNREGISTERED = 1, /* no entry in etcd (yet, or lease lost) */
    GDRKV_CLUSTER_SERVING = 2,
    GDRKV_CLUSTER_LEAVING = 3,
};
void gdrkv_server_set_cluster(gdrkv_server *s, int state, uint64_t lease_renewed_ns,
                              uint64_t etcd_errors);
/* Drains and stops: no new connections, the frames in flight finish (for
 * at most drain_timeout_ms), every connection is closed, then the threads
 * end and the pool is freed. */
void gdrkv_server_stop(gdrkv_server *s);

/* ---------------------------------------------------------------- client */

typedef struct gdrkv_client gdrkv_client;

/* How a client reaches its servers (docs/transports.md). */
enum gdrkv_transport {
    GDRKV_TRANSPORT_AUTO = 0,   /* shm where a server's unix socket answers, else tcp */
    GDRKV_TRANSPORT_TCP = 1,
    GDRKV_TRANSPORT_SHM = 2,    /* shm or nothing: a server without it is unavailable */
    GDRKV_TRANSPORT_RDMA = 3    /* rdma or nothing (also to this host); auto uses rdma
                                   for remote servers when both sides have it */
};

/* How values move to and from GPU memory (docs/gpu.md). */
enum gdrkv_gpu_copy {
    GDRKV_GPU_COPY_AUTO = 0,    /* the kernel for small pieces, copy engines for large */
    GDRKV_GPU_COPY_KERNEL = 1,  /* one kernel launch per frame: link speed at any page
                                   size, but it uses SMs and HBM bandwidth */
    GDRKV_GPU_COPY_ENGINE = 2   /* cuMemcpyBatchAsync (per-piece cuMemcpyAsync on older
                                   drivers): no SMs, slower for small pages */
};

typedef struct gdrkv_client_opts {
    const char *servers;        /* "host:port[,host:port...]"; an entry "unix:PATH"
                                   is a local server reached on that socket */
    const char *ns;             /* namespace, at most 255 bytes; "" = default */
    uint32_t timeout_ms;        /* bound on every call, end to end */
    uint32_t connect_timeout_ms;/* bound on one connect attempt (<= timeout_ms) */
    uint32_t conns;             /* connections per server a batch stripes over */
    uint32_t backoff_min_ms;    /* first retry delay after a server failed */
    uint32_t backoff_max_ms;    /* cap of the exponential backoff */
    int transport;              /* enum gdrkv_transport */
    int gpu_copy;               /* enum gdrkv_gpu_copy */
    const char *token_file;     /* the servers' shared secret; NULL = none */
    uint64_t gpu_pin_limit;     /* most bytes of a server's shm pool registered with CUDA
                                   (pinned) for GPU copies; 0 = all of it (docs/gpu.md) */
    uint64_t gpu_pin_ahead;     /* of those, registered in the background from the first
                                   GPU copy on, before any copy asks for them; 0 = none
                                   (a registration holds up the process's CUDA calls) */
    uint32_t replicas;          /* copies of each key, 1..8 (docs/cluster.md): a PUT goes to
                                   the top `replicas` members, in distinct failure domains
                                   where there are enough; reads fall over between them */
    uint32_t settle_ms;         /* after gdrkv_client_set_members, a miss at a key's new
                                   owner is retried at its owners under the previous
                                   members for this long (read-through) */
    int members_later;          /* open with no servers (servers "" or NULL): they come
                                   from gdrkv_client_set_members; until then every key
                                   fails with GDRKV_E_UNAVAILABLE */
} gdrkv_client_opts;

void gdrkv_client_opts_init(gdrkv_client_opts *opts);
int gdrkv_client_open(const gdrkv_client_opts *opts, gdrkv_client **out,
                      char *err, size_t errlen);
void gdrkv_client_close(gdrkv_client *c);

/* Registers memory the batch calls will read from or write into. Over tcp
 * this only records the range; rdma registers it with the NIC (an MR: GPU
 * memory through dma-buf), and only registered memory moves by RDMA: frames
 * touching other host memory go over the control connection. GPU memory
 * (recognised through the CUDA driver, when the process has it loaded)
 * must lie in one allocation; GPU segments of batch calls must lie in a
 * registered range, else their key fails with GDRKV_E_INVALID. */
int gdrkv_client_register(gdrkv_client *c, uint64_t ptr, uint64_t len);
int gdrkv_client_unregister(gdrkv_client *c, uint64_t ptr);

/*
 * Batched operations. Keys are passed as one buffer of concatenated key
 * bytes with key_lens[i] giving each length. Object i is made of
 * seg_counts[i] segments, taken in order from seg_ptrs/seg_lens (so the
 * segment arrays hold the sum of seg_counts entries). results[i] receives:
 *   put:    0 (stored, or already present) or a negative gdrkv_error
 *   get:    bytes read into the segments, or a negative gdrkv_error
 *   exists: the object's size, or a negative gdrkv_error (NOT_FOUND)
 *   delete: 0 or a negative gdrkv_error
 * The call returns 0 when it ran (per-key results say what happened) or a
 * negative error when it could not run at all (closed client, bad arrays).
 * Every call returns within opts.timeout_ms; after it returns the client
 * never touches the caller's buffers again.
 */
int gdrkv_batch_put(gdrkv_client *c, uint32_t n, const char *keys,
                    const uint32_t *key_lens, const uint64_t *seg_ptrs,
                    const uint64_t *seg_lens, const uint32_t *seg_counts,
                    int64_t *results);
int gdrkv_batch_get(gdrkv_client *c, uint32_t n, const char *keys,
                    const uint32_t *key_lens, const uint64_t *seg_ptrs,
                    const uint64_t *seg_lens, const uint32_t *seg_counts,
                    int64_t *results);
/*
 * The same with a CUDA stream (a CUstream/cudaStream_t as an integer; 0 =
 * none) for the copies into and out of GPU segments: they are queued on
 * it, so a PUT reads GPU memory after the work queued there before the
 * call, and work queued after the call sees what a GET wrote. The call
 * still returns only once every copy is done (the shm lease, staging
 * buffers and the caller's buffers are free then). Without a stream the
 * copies run on streams of the client's own, ordered after work on the
 * legacy default stream.
 */
int gdrkv_batch_put_stream(gdrkv_client *c, uint32_t n, const char *keys,
                           const uint32_t *key_lens, const uint64_t *seg_ptrs,
                           const uint64_t *seg_lens, const uint32_t *seg_counts,
                           int64_t *results, uint64_t stream);
int gdrkv_batch_get_stream(gdrkv_client *c, uint32_t n, const char *keys,
                           const uint32_t *key_lens, const uint64_t *seg_ptrs,
                           const uint64_t *seg_lens, const uint32_t *seg_counts,
                           int64_t *results, uint64_t stream);
int gdrkv_batch_exists(gdrkv_client *c, uint32_t n, const char *keys,
                       const uint32_t *key_lens, int64_t *results);
int gdrkv_batch_delete(gdrkv_client *c, uint32_t n, const char *keys,
                       const uint32_t *key_lens, int64_t *results);
/* Reads the object under one key, whatever its size, into memory the call
 * allocates once the answer has told that size: one GET, so one round trip
 * and one lookup (hit or miss) on the server. *result gets the bytes read
 * or a negative gdrkv_error (NOT_FOUND, ...); on success *value points at
 * them (free it with gdrkv_free), else it is NULL. Returns 0 when the call
 * ran, as the batch calls do. The memory is the client's own, so over rdma
 * the value comes on the socket. */
int gdrkv_get_alloc(gdrkv_client *c, const char *key, uint32_t key_len, uint8_t **value,
                    int64_t *result);
void gdrkv_free(void *p);

/* Removes every object of the client's namespace on every server; returns
 * the number removed or a negative error (first failing server). */
int64_t gdrkv_clear(gdrkv_client *c);
/* Round trip to every server; 0 when all answered. */
int gdrkv_ping(gdrkv_client *c);

/*
 * The same as gdrkv_batch_put_stream, but results[i] is the number of
 * copies written (1..replicas) when the object was stored, or a negative
 * gdrkv_error when no copy was. (gdrkv_batch_put says 0 for any number.)
 */
int gdrkv_batch_put_copies(gdrkv_client *c, uint32_t n, const char *keys,
                           const uint32_t *key_lens, const uint64_t *seg_ptrs,
                           const uint64_t *seg_lens, const uint32_t *seg_counts,
                           int64_t *results, uint64_t stream);

/* ---------------------------------------------------------------- members */

/* One member of a client's server table (docs/cluster.md). */
typedef struct gdrkv_member {
    const char *addr;           /* "host:port" as in a URL (or "unix:PATH") */
    uint64_t capacity;          /* weight: the member's pool bytes (> 0) */
    const char *zone;           /* failure domain; NULL or "" = its host */
    int leaving;                /* 1: draining: readable, takes no PUTs */
} gdrkv_member;

/* Most members of a table. */
#define GDRKV_MAX_MEMBERS 4096

/*
 * Replaces the client's members at once. Calls in flight finish on the
 * table they began with; servers in both tables keep their connections
 * and health. Returns 0 or a negative gdrkv_error (err says why: bad
 * address, duplicate, ...); on error the old table stays. n may be 0 (every
 * key then fails with GDRKV_E_UNAVAILABLE).
 */
int gdrkv_client_set_members(gdrkv_client *c, const gdrkv_member *m, uint32_t n,
                             char *err, size_t errlen);

/*
 * Placement, as every client computes it: writes to out the indices of the
 * members that take a PUT of key under `replicas` copies, best first (the
 * first is the key's owner; members leaving are left out), and returns how
 * many (min(replicas, members not leaving)), or a negative gdrkv_error for
 * a bad member (address, capacity 0). The same answer in every process and
 * on every host.
 */
int gdrkv_place(const void *key, size_t key_len, const gdrkv_member *members, uint32_t n,
                uint32_t replicas, uint32_t *out);

uint32_t gdrkv_client_nservers(gdrkv_client *c);
/* The current members' "host:port", one per line, all of one table
 * (the names of servers 0..n-1 read one by one may span a swap); returns
 * the text's length or a negative error. */
int gdrkv_client_members_text(gdrkv_client *c, char *buf, size_t len);
/* "host:port" of server i. */
int gdrkv_client_server_name(gdrkv_client *c, uint32_t i, char *buf, size_t len);
/* Server i's counters as "name value\n" lines (same format as
 * gdrkv_server_stats); returns the length or a negative error. */
int gdrkv_client_server_stats(gdrkv_client *c, uint32_t i, char *buf, size_t len);
/* The client's own counters, same format. */
int gdrkv_client_stats(gdrkv_client *c, char *buf, size_t len);

/* ---------------------------------------------------------------- GPU */

/* 1 when the CUDA driver loads and sees a GPU, else 0; why gets a line
 * saying which (driver version and GPU count, or the reason). */
int gdrkv_gpu_available(char *why, size_t len);
/* Copies n pieces (unified addresses the GPU reaches: device memory,
 * pinned host memory) with gdrkv's GPU copy path (mode: enum
 * gdrkv_gpu_copy, or 3: one cuMemcpyAsync per piece, the baseline the
 * bench shows) in the primary context of GPU device, on stream (0 =
 * the library's own); returns once they are done: 0 or a negative error.
 * What `gdrkv bench --gpu` measures the one-launch ceiling with. */
int gdrkv_gpu_copy(int device, uint32_t n, const uint64_t *dsts, const uint64_t *srcs,
                   const uint64_t *lens, int mode, uint64_t stream);

#endif
