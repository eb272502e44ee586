/*
 * server_state.h - the structs every file of the server wing shares, at
 * the bottom of the wing: the server, its workers and their counters, and
 * a client connection with what its frame holds in the store.
 *
 * The wing, top to bottom (a file calls only files below it):
 *   server.c          lifecycle, stage by stage: store, listening sockets,
 *                     threads; and the stop
 *   server_options.c  the options table: defaults, what the bindings make
 *                     keywords, flags and TOML keys of, the one check
 *   server_worker.c   one epoll loop per thread: accept, dispatch, ticks
 *   server_conn.c     a connection's bytes and frames: the non-blocking
 *                     read/execute/write state machine
 *   server_ops.c      the meaning of each op, and every hold a frame leaves
 *                     in the store (pins, leases, reservations, expiry)
 *   server_stats.c    per-worker counters summed into the stats text
 *   server_rdma.c     rdma resources: the registered pool, QPs per connection
 *   server_reply.c    the one way a handler answers a frame
 *   server_payload.c  where a frame's payload bytes go in the pool
 *   server_disk.c     reads parked while the disk threads bring keys back
 */
#ifndef GDRKV_SERVER_STATE_H
#define GDRKV_SERVER_STATE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/auth.h"
#include "common/copy.h"
#include "common/net.h"
#include "gdrkv.h"
#include "common/protocol.h"
#include "common/stats.h"
#include "server_payload.h"
#include "server_peers.h"
#include "server_gpu_pins.h"
#include "server_pins.h"
#include "server_staging.h"
#include "server_strangers.h"

struct disk_frame;
struct server_disk;
struct server_metrics;
struct server_rdma;
struct server_rdma_conn;
struct store;

#define SERVER_MAX_WORKERS 16
#define SERVER_MAX_DISKS 16          /* --disk paths */
#define SERVER_TICK_MS 100          /* how often workers look for stalled connections */
#define SERVER_SCRATCH_SIZE (64u << 10)
#define SERVER_STATS_MAX (16u << 10)
/* The slowest a request may arrive (after stall_timeout_ms of grace) and a
 * tcp GET's values be read (after lease_timeout_ms): 1 s and 10 ms per MiB. */
#define CONN_REQUEST_NS_PER_MIB 1000000000ull
#define CONN_ANSWER_NS_PER_MIB 10000000ull

/* Every plain counter of a worker, X(name, metric, what it counts): this
 * one list declares the fields, sums them over the workers and prints them
 * (server_stats.c) and exports them as gdrkv_<metric>_total
 * (server_metrics_text.c), so adding a counter is one line and the stats text,
 * `gdrkv stat` and the metrics can't drift apart. Per-op counters follow. */
#define SERVER_COUNTERS(X)                                                                      \
    X(connections_total, connections, "connections accepted")                                   \
    X(connections_rejected, connections_rejected, "connections refused at accept")              \
    X(connections_rejected_peer, connections_rejected_peer,                                     \
      "of those, over max_connections_per_peer")                                                \
    X(connections_idle_closed, connections_idle_closed,                                         \
      "closed after idle_timeout_ms without a frame")                                           \
    X(frames_too_slow, frames_too_slow, "requests not complete by their deadline: closed")      \
    X(frames_waited_for_buffer, frames_waited_for_buffer,                                       \
      "request bodies that waited for max_buffered_bytes")                                      \
    X(frames_waited_for_disk, frames_waited_for_disk,                                           \
      "GETs and LEASEs that waited for keys read back from the disk tier")                     \
    X(frames_waited_for_room, frames_waited_for_room,                                           \
      "PUTs that waited for the disk tier to make room (disk_full_policy throttle)")          \
    X(get_pins_expired, get_pins_expired,                                                       \
      "tcp GETs whose reader was too slow: closed, pins dropped")                               \
    X(pin_cap_refused_keys, pin_cap_refused_keys,                                               \
      "GET and LEASE keys answered BUSY: their peer had peer_pin_share of the pool pinned")     \
    X(bytes_in, received_bytes, "PUT payload bytes received")                                   \
    X(bytes_out, sent_bytes, "GET payload bytes sent")                                          \
    X(frames_bad, frames_bad, "malformed or rejected frames")                                   \
    X(shm_connections_total, shm_connections, "of connections_total, over the unix socket")    \
    X(shm_connections_refused, shm_connections_refused, "unix peers of another uid")            \
    X(shm_leases, shm_leases, "LEASE frames answered with offsets")                             \
    X(shm_lease_bytes, shm_leased_bytes, "object bytes handed out under leases")                \
    X(shm_leases_expired, leases_expired, "leases (and RESERVEs) dropped by the timeout")       \
    X(shm_staged_puts, shm_staged_puts, "PUT_STAGED frames: values copied from staging")        \
    X(shm_staged_bytes, shm_staged_bytes, "value bytes they copied into the pool")              \
    X(shm_staged_followed, shm_staged_followed,                                                 \
      "PUT_STAGED frames copied behind the client's copy (FOLLOW)")                              \
    X(shm_staged_follow_stalls, shm_staged_follow_stalls,                                       \
      "of those, frames whose client stalled: sent back, to come again")                         \
    X(shm_reserved_bytes, shm_reserved_bytes, "single-tenant: bytes RESERVE handed out")        \
    X(rdma_leases, rdma_leases, "LEASE frames of rdma connections")                             \
    X(rdma_lease_bytes, rdma_leased_bytes, "object bytes they handed out for READs")            \
    X(rdma_reserved_bytes, rdma_reserved_bytes, "bytes RESERVE handed out for WRITEs")          \
    X(auth_ok, auth_ok, "connections that proved they hold the token")                          \
    X(auth_denied, auth_denied, "frames refused: no or a wrong proof of the token")             \
    X(auth_timeouts, auth_timeouts, "connections closed unauthenticated after auth_timeout_ms") \
    X(unauthenticated_refused, unauthenticated_refused,                                         \
      "connections refused before AUTH: max_unauthenticated or its per-peer share full")        \
    X(unauthenticated_evicted, unauthenticated_evicted,                                         \
      "unauthenticated connections ended to make room for another address's")

/* Written only by the worker that owns them, read by whoever asks for
 * stats: relaxed atomics on both sides, summed over workers at read time. */
struct server_counters {
#define SERVER_COUNTER_FIELD(name, metric, help) uint64_t name;
    SERVER_COUNTERS(SERVER_COUNTER_FIELD)
#undef SERVER_COUNTER_FIELD
    uint64_t ops[GK_OP_MAX + 1];
    uint64_t keys[GK_OP_MAX + 1];
    struct gk_latency latency[GK_OP_MAX + 1];
};

/* A connection accepted by one worker for another (server_worker.c). */
struct server_handoff {
    int fd;
    int local;
    struct server_peer peer;
};

struct server_worker {
    struct gdrkv_server *server;
    int epoll_fd;
    int handoff_fd;                 /* eventfd: connections handed over are queued */
    pthread_mutex_t handoff_lock;   /* guards the queue and handoff_closed */
    struct server_handoff *handoffs;
    uint32_t nhandoffs, handoff_cap;
    int handoff_closed;             /* the loop ended: hand nothing more over */
    int accepting;                  /* listeners in this epoll; off for a tick after EMFILE */
    int draining;                   /* stop began: no accepts, frames in flight finish */
    int runnable;                   /* some connection has work left without an event */
    int last_was_staged;            /* the last frame served was a PUT_STAGED: no busy poll */
    int disk_fd;                    /* eventfd: frames parked for the disk may run again,
                                       writes waiting for room (CONN_WAIT_ROOM) try again */
    pthread_mutex_t disk_lock;      /* guards disk_done */
    struct disk_frame **disk_done;  /* frames whose keys came back (server_disk.h) */
    uint32_t ndisk_done, disk_done_cap;
    uint64_t next_serial;
    pthread_t thread;
    struct server_conn *conns;      /* every connection this worker owns */
    uint8_t *scratch;               /* sink for payload bytes nobody keeps */
    struct gk_copy_list copies;     /* the current PUT_STAGED frame's copies */
    struct server_counters counters;
};

struct gdrkv_server {
    gdrkv_server_opts opts;         /* as started, for whatever reads an option at run
                                       time; its strings are the caller's, so NULL here
                                       (server_options_keep) */
    struct store *store;
    int listen_fd;
    int unix_fd;                    /* shm listener, or -1 */
    char unix_path[GK_UNIX_PATH_MAX];   /* "" when shm is off */
    uint64_t busy_poll_ns;          /* a worker polls this long after an event before it sleeps */
    struct gk_copier copier;        /* helpers the workers share for staged PUT copies */
    int copier_ready;               /* copier initialised (destroy it) */
    struct gk_token token;          /* clients must prove they hold it; len 0: none */
    struct server_metrics *metrics; /* the /metrics endpoint, or NULL */
    char metrics_address[300];      /* where it listens; "" when off */
    struct server_rdma *rdma;       /* NULL when rdma is off or unavailable */
    struct server_disk *disk;       /* the disk threads; NULL without a disk tier */
    int wake_fd;                    /* eventfd; becomes readable when stop begins */
    char address[300];
    uint32_t connections;           /* open tcp connections over all workers (atomic) */
    uint32_t local_connections;     /* open unix ones (atomic) */
    struct server_peers *peers;     /* tcp connections per peer address */
    struct server_gpu_pins *gpu_pins;   /* what local client processes pin of the pool for GPU copies */
    struct server_strangers *strangers; /* tcp connections before AUTH (with a token) */
    struct server_pins *pins;       /* bytes each peer's reads hold pinned */
    uint64_t buffered_bytes;        /* request body buffers held by all connections (atomic) */
    struct {                        /* what the cluster registration reports (atomic each;
                                       gdrkv_server_set_cluster) */
        int state;                  /* enum gdrkv_cluster_state */
        uint64_t lease_renewed_ns;  /* gk_now_ns of the last grant or renewal; 0: none */
        uint64_t etcd_errors;
    } cluster;
    uint64_t started_ns;
    int nworkers;                   /* workers set up (epoll, scratch) */
    uint32_t next_worker;           /* round robin of accepted connections (atomic) */
    int nthreads;                   /* worker threads actually running */
    int housekeeper_running;
    pthread_t housekeeper;
    struct server_worker workers[SERVER_MAX_WORKERS];
};

/* ------------------------------------------------------------ connections
 *
 * One client connection of the server: a non-blocking
 * state machine that reads a frame (header, body, and for PUT the payload
 * straight into reserved pool chunks), has it executed (server_ops.c), and
 * writes the response (for GET the values straight from pinned chunks).
 * A connection belongs to the worker that accepted it and is only ever
 * touched by that worker's thread.
 *
 * A local connection (unix socket) may also use the shm transport: HELLO
 * passes it the pool's fd, and a LEASE's pins outlive the frame as the
 * connection's lease, until RELEASE, the next frame, the lease timeout or
 * the connection's end.
 *
 * HELLO also gives it a staging memfd (server_staging.h) for PUT_STAGED.
 *
 * Any connection may become an rdma one (server_rdma.h): RDMA_HELLO gives
 * it QPs, and a RESERVE's reservations outlive the frame until COMMIT. In
 * single-tenant mode a local connection RESERVEs and COMMITs too, copying
 * into the pool it maps writable.
 */

enum server_conn_state {
    CONN_READ_HDR,          /* between frames, or part of a header read */
    CONN_WAIT_BUFFER,       /* header read; its body waits for max_buffered_bytes room */
    CONN_READ_BODY,
    CONN_SKIP,              /* dropping body and payload of a frame we can't serve */
    CONN_READ_PAYLOAD,      /* PUT values, into reserved chunks */
    CONN_WAIT_DISK,         /* a read waits for its keys to come back from disk */
    CONN_WAIT_ROOM,         /* a write waits for the disk tier to make room, holding nothing */
    CONN_EXECUTE,           /* ...and they came back: run the frame again */
    CONN_WRITE              /* response, then GET values from pinned chunks */
};

/* What a connection holds in the store: one state per hold. The first two
 * belong to the frame in progress and end with it (or with the
 * connection); the last two outlive their frame until the frame that ends
 * them, the hold timeout or the connection's end (server_ops.h). */
enum server_conn_hold {
    CONN_HOLDS_NOTHING,
    CONN_HOLDS_PINS,        /* this frame's: GET values being sent, LEASE chunks described */
    CONN_HOLDS_RESERVATIONS,/* this frame's: PUT values being received or copied from
                               staging, RESERVE chunks described */
    CONN_HOLDS_LEASE,       /* a LEASE's pins: the client copies or READs the objects
                               out of the pool, until RELEASE (conn.lease) */
    CONN_HOLDS_COMMIT       /* a RESERVE's reservations: the client copies or WRITEs
                               the values into them, until COMMIT (conn.reserved) */
};

/* A LEASE's pins, held past the frame (CONN_HOLDS_LEASE). */
struct server_lease {
    uint32_t count;                 /* keys pinned (batch.objs) */
    uint64_t bytes;                 /* their bytes: a big transfer gets longer */
    uint64_t deadline_ns;
};

/* A RESERVE's reservations, held past the frame for COMMIT
 * (CONN_HOLDS_COMMIT). */
struct server_reservation {
    uint32_t count;                 /* keys reserved (batch.objs); COMMIT must name as many */
    uint64_t bytes;                 /* bytes of the objects reserved */
    uint64_t deadline_ns;
};

/* Where a connection stands in the handshake (common/auth.h). */
enum server_conn_auth {
    CONN_AUTH_NONE,         /* nothing but AUTH is answered */
    CONN_AUTH_CHALLENGED,   /* the server's proof sent; the client's awaited */
    CONN_AUTH_DONE          /* proven, or the server has no token */
};

/* Which budget a connection counts in (server_conn.h): max_connections
 * and its peer's share, or the strangers' before AUTH (server_strangers.h). */
enum server_conn_slot {
    CONN_SLOT_NONE,         /* neither: AUTH found max_connections full; it ends */
    CONN_SLOT_CLIENT,
    CONN_SLOT_STRANGER
};

/* The per-key arrays of the frame in progress; they keep the largest size
 * seen so far (at most GK_MAX_KEYS entries). */
struct server_batch {
    uint32_t cap;
    struct gk_entry *entries;
    struct store_obj **objs;
    uint64_t *sizes;
    int32_t *status;
};

struct server_conn {
    int fd;
    uint64_t serial;                /* unique in its worker: disk jobs find it by this */
    struct disk_frame *disk_frame;  /* the frame's keys were brought back from disk: their pins */
    struct server_worker *worker;
    struct server_conn *prev, *next; /* the worker's list */
    enum server_conn_state state;
    enum server_conn_hold holds;    /* what the store keeps for this connection */
    uint32_t events;                /* epoll interest registered now */
    int local;                      /* on the unix socket: shm allowed */
    struct server_peer peer;        /* tcp: whose per-peer slot it holds */
    pid_t pid;                      /* local: the peer process (server_gpu_pins.h) */
    struct server_pin_account *pin_account; /* its peer's pins, from its first read on */
    uint64_t pins_charged;          /* bytes of the pins it holds, charged there */
    int close_after_write;          /* the stream can't be trusted past this frame */
    int frame_executed;             /* counts in the per-op stats once written */
    int runnable;                   /* stopped at the step bound with work left */
    int waited_for_buffer;          /* this frame is counted in frames_waited_for_buffer */
    uint64_t last_progress_ns;      /* last time a byte moved: stall detection */
    uint64_t opened_ns;             /* accepted, or the last frame answered: idle detection */
    uint64_t first_byte_ns;         /* the request's first header byte arrived */
    uint64_t frame_start_ns;        /* header complete: op latency */
    uint64_t request_deadline_ns;   /* the whole request must be in by then */
    uint64_t answer_deadline_ns;    /* a GET's pinned values must be out by then */
    uint64_t room_deadline_ns;      /* a write waiting for room stops waiting then (0: none) */
    uint64_t room_wait_ns;          /* when this wait for room began */

    uint8_t hdr_raw[GK_HDR_SIZE];
    uint32_t hdr_got;
    struct gk_hdr req;

    uint8_t *body;
    size_t body_cap;                /* counted in the server's buffered_bytes */
    uint32_t body_got;
    uint64_t skip_left;

    struct gk_ns ns;                /* points into body */
    struct server_batch batch;
    struct server_payload payload;

    uint8_t *out;                   /* response header + body */
    size_t out_cap, out_len, out_sent;
    int pass_fds[2];                /* sent with the response's first byte, or -1 */
    struct server_staging staging;  /* local: PUT_STAGED values, after HELLO */

    struct server_lease lease;      /* CONN_HOLDS_LEASE */
    struct server_reservation reserved; /* CONN_HOLDS_COMMIT */
    int hold_expired;               /* the last lease or reservation was dropped by the
                                       timeout: the RELEASE or COMMIT for it says so */
    enum server_conn_auth auth;
    uint64_t accepted_ns;           /* AUTH must be done by auth_timeout_ms past it */
    enum server_conn_slot slot;     /* which budget it counts in */
    struct server_stranger stranger;/* CONN_SLOT_STRANGER: its place in that table */
    uint8_t client_nonce[GK_AUTH_NONCE_SIZE];  /* of the handshake in progress */
    uint8_t server_nonce[GK_AUTH_NONCE_SIZE];
    struct server_rdma_conn *rdma;  /* QPs, after RDMA_HELLO */
};

#endif
