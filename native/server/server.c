/*
 * server.c - the in-process server's lifecycle (gdrkv.h), started stage by
 * stage: the store, rdma, the listening sockets (tcp, and unix for the
 * shm transport), the metrics endpoint, worker threads plus one
 * housekeeping thread that runs the store's background eviction; and an
 * orderly stop. Its options are server_options.c's.
 *
 * Stopping is one eventfd that every thread polls: written once, never
 * read, it stays readable until every thread has seen it.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "common/log.h"
#include "common/net.h"
#include "server_disk.h"
#include "server_metrics.h"
#include "server_options.h"
#include "server_peers.h"
#include "server_strangers.h"
#include "server_rdma.h"
#include "server_state.h"
#include "server_stats.h"
#include "server_worker.h"
#include "store/store.h"

/* Staged PUT frames from 512 KiB up (clients send up to 8 MiB, 1 MiB on
 * hosts under 8 CPUs) are copied by their worker and up to 8 helpers
 * together: one core copies well below what a GPU or several clients
 * write into staging (docs/transports.md, "PUT: staging, then the
 * server's copy"). */
#define SERVER_COPY_HELPERS 8
#define SERVER_COPY_PARALLEL_BYTES (512u << 10)

/* Helpers for staged copies: half the CPUs but the worker's own, at most
 * SERVER_COPY_HELPERS. The other half stay with the clients that fill
 * staging meanwhile: on a 2-core host a helper takes the client's core
 * (docs/benchmarks-log.md, "Staged copies on helper threads"). */
static int copy_helpers(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return (int)GK_MIN(GK_MAX(cpus / 2 - 1, 0L), (long)SERVER_COPY_HELPERS);
}

static int worker_count(int asked)
{
    long cpus = asked > 0 ? asked : sysconf(_SC_NPROCESSORS_ONLN);
    return (int)GK_MAX(1, GK_MIN(cpus, SERVER_MAX_WORKERS));
}

static void *housekeeping_main(void *arg)
{
    struct gdrkv_server *s = arg;
    struct pollfd wake = {.fd = s->wake_fd, .events = POLLIN};

    while (poll(&wake, 1, SERVER_TICK_MS) <= 0)
        store_maintain(s->store);
    return NULL;
}

/* Server threads block every signal: they belong to the embedding process
 * (Python handles SIGINT on its main thread), and sockets use MSG_NOSIGNAL. */
static int start_threads(struct gdrkv_server *s)
{
    sigset_t all, old;
    int rc = 0;

    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (rc == 0 && s->nthreads < s->nworkers) {
        struct server_worker *w = &s->workers[s->nthreads];
        rc = pthread_create(&w->thread, NULL, server_worker_main, w);
        if (rc == 0)
            s->nthreads++;
    }
    if (rc == 0) {
        rc = pthread_create(&s->housekeeper, NULL, housekeeping_main, s);
        s->housekeeper_running = rc == 0;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* The shm listener. Asked for by path, it must work; the default is best
 * effort, since tcp serves every client anyway, unless its directory is
 * another user's. */
static int listen_unix(struct gdrkv_server *s, const char *asked, char *err, size_t errlen)
{
    char why[300];
    uint16_t port = (uint16_t)strtoul(strrchr(s->address, ':') + 1, NULL, 10);

    if (asked && !*asked)
        return 0;
    if (store_pool_fd(s->store) < 0) {
        if (!asked)
            return 0;
        snprintf(err, errlen, "the pool can't be shared (see the log), so no shm on %s", asked);
        return GDRKV_E_UNAVAILABLE;
    }
    if (!asked && gk_unix_default_path(port, s->unix_path, sizeof s->unix_path) != 0) {
        GK_WARN("no shm transport: the default unix socket path is too long");
        return 0;
    }
    if (asked)
        snprintf(s->unix_path, sizeof s->unix_path, "%s", asked);
    int fd = gk_listen_unix(s->unix_path, SOMAXCONN, why, sizeof why);
    if (fd < 0) {
        s->unix_path[0] = '\0';
        /* Someone else's directory where ours should be is no accident:
         * running without shm would leave it to them. */
        if (asked || fd == GDRKV_E_DENIED) {
            snprintf(err, errlen, "%s%s", why,
                     asked ? "" : " (remove it, or choose --unix-path; '' runs without shm)");
            return fd;
        }
        GK_WARN("no shm transport: %s", why);
        return 0;
    }
    s->unix_fd = fd;
    return 0;
}

/* Tears down whatever part of the server exists; also the error path of start. */
static void server_free(struct gdrkv_server *s)
{
    if (s->wake_fd >= 0)
        eventfd_write(s->wake_fd, 1);
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->workers[i].thread, NULL);
    if (s->housekeeper_running)
        pthread_join(s->housekeeper, NULL);
    server_metrics_stop(s);
    /* Every frame that was answered is in the store now: the drain's
     * outcome, for operators (and for tests that count what was acked). */
    if (s->store && s->nthreads) {
        struct store_stats st;
        store_get_stats(s->store, &st);
        GK_INFO("server on %s drained: %llu puts committed, %llu objects stored", s->address,
                (unsigned long long)st.puts, (unsigned long long)st.objects);
    }
    server_disk_stop(s);
    for (int i = 0; i < s->nworkers; i++)
        server_worker_destroy(&s->workers[i]);
    if (s->copier_ready)
        gk_copier_destroy(&s->copier);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->unix_fd >= 0) {
        close(s->unix_fd);
        unlink(s->unix_path);
    }
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    server_rdma_stop(s);
    if (s->store)
        store_close(s->store);
    server_peers_free(s->peers);
    server_gpu_pins_free(s->gpu_pins);
    server_strangers_free(s->strangers);
    server_pins_free(s->pins);
    free(s);
}

/* ------------------------------------------------------------ start, by stage
 *
 * Each stage takes what the ones before it set up; on failure it leaves
 * its own part where server_free finds it, and says why in err. */

typedef int server_stage(struct gdrkv_server *s, const gdrkv_server_opts *opts, char *err,
                         size_t errlen);

/* The server's struct with the options the workers read, and the stop
 * eventfd every later thread polls. */
static struct gdrkv_server *server_new(const gdrkv_server_opts *opts, char *err, size_t errlen)
{
    struct gdrkv_server *s = calloc(1, sizeof *s);

    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->listen_fd = s->unix_fd = -1;
    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->wake_fd < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        server_free(s);
        return NULL;
    }
    s->peers = server_peers_new(opts->max_connections, opts->max_connections_per_peer);
    s->strangers = server_strangers_new(opts->max_unauthenticated,
                                        opts->max_unauthenticated_per_peer);
    if (!s->peers || !s->strangers) {
        snprintf(err, errlen, "out of memory");
        server_free(s);
        return NULL;
    }
    server_options_keep(&s->opts, opts);
    s->busy_poll_ns = server_busy_poll_ns(opts->busy_poll_us);
    s->started_ns = gk_now_ns();
    return s;
}

/* The pool's file as clients map it (past the capacity where pages round
 * it up): what one mapping of it may pin at most. */
static uint64_t pool_file_bytes(struct gdrkv_server *s)
{
    struct stat st;
    uint64_t capacity = store_capacity(s->store);
    return fstat(store_pool_fd(s->store), &st) == 0 && (uint64_t)st.st_size > capacity
               ? (uint64_t)st.st_size
               : capacity;
}

static int load_token(struct gdrkv_server *s, const gdrkv_server_opts *opts, char *err,
                      size_t errlen)
{
    if (!opts->auth_token_file || !*opts->auth_token_file)
        return 0;
    return gk_token_load(opts->auth_token_file, &s->token, err, errlen);
}

/* The disk option's comma-separated directories, cut in place in list. */
static int split_disks(char *list, const char **paths, uint32_t *n, char *err, size_t errlen)
{
    char *save = NULL;

    *n = 0;
    for (char *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        if (*n == SERVER_MAX_DISKS) {
            snprintf(err, errlen, "at most %d disk paths", SERVER_MAX_DISKS);
            return GDRKV_E_INVALID;
        }
        paths[(*n)++] = p;
    }
    return 0;
}

/* The store over the pool (and its file and disk tier), with the disk
 * tier's threads. */
static int open_store(struct gdrkv_server *s, const gdrkv_server_opts *opts, char *err,
                      size_t errlen)
{
    const char *disk_paths[SERVER_MAX_DISKS];
    char *disk_list = strdup(opts->disk ? opts->disk : "");
    struct store_opts so = {
        .memory_bytes = opts->memory_bytes,
        .hugepages = opts->hugepages,
        .pretouch = opts->pretouch,
        .high_watermark = opts->high_watermark,
        .low_watermark = opts->low_watermark,
        .writable_share = opts->single_tenant,
        .pool_file = opts->pool_file && *opts->pool_file ? opts->pool_file : NULL,
        .reset_pool_file = opts->reset_pool_file,
        .disk_paths = disk_paths,
        .disk_bytes_per_path = opts->disk_size,
        .reset_disk = opts->reset_disk,
        .disk_full_drop = opts->disk_full_policy && !strcmp(opts->disk_full_policy, "drop"),
    };
    int rc;

    if (!disk_list) {
        snprintf(err, errlen, "out of memory");
        return GDRKV_E_INTERNAL;
    }
    rc = split_disks(disk_list, disk_paths, &so.disk_npaths, err, errlen);
    if (rc == 0 && (rc = store_open(&s->store, &so, err, errlen)) != 0)
        s->store = NULL;
    free(disk_list);
    if (rc == 0 && !(s->gpu_pins = server_gpu_pins_new(opts->max_connections, pool_file_bytes(s)))) {
        snprintf(err, errlen, "out of memory");
        rc = GDRKV_E_INTERNAL;
    }
    if (rc == 0 && server_disk_start(s) != 0) {
        snprintf(err, errlen, "cannot start the disk threads");
        rc = GDRKV_E_INTERNAL;
    }
    return rc;
}

/* The pins each peer may hold: a share of the pool the store got. */
static int open_pin_accounts(struct gdrkv_server *s, const gdrkv_server_opts *opts, char *err,
                             size_t errlen)
{
    s->pins = server_pins_new((uint64_t)(opts->peer_pin_share * (double)store_capacity(s->store)));
    if (s->pins)
        return 0;
    snprintf(err, errlen, "out of memory");
    return GDRKV_E_INTERNAL;
}

static int start_rdma(struct gdrkv_server *s, const gdrkv_server_opts *opts, char *err,
                      size_t errlen)
{
    return server_rdma_start(s, opts->rdma, err, errlen);
}

/* The tcp listener, refused where other hosts reach it unguarded, then
 * the unix one of the shm transport. */
static int open_listeners(struct gdrkv_server *s, const gdrkv_server_opts *opts, char *err,
                          size_t errlen)
{
    struct gk_addr addr;

    gk_parse_addr(opts->listen, 0, &addr);      /* server_options_check parsed it */
    s->listen_fd = gk_listen_tcp(&addr, SOMAXCONN, err, errlen);
    if (s->listen_fd < 0)
        return s->listen_fd;
    gk_sock_name(s->listen_fd, s->address, sizeof s->address);
    /* Redis's protected mode: reachable from other hosts only with a token,
     * or when the operator says so. */
    if (!s->token.len && !opts->insecure_no_auth && !gk_sock_is_loopback(s->listen_fd)) {
        snprintf(err, errlen, "%s is reachable from other hosts: give it a secret with "
                 "--auth-token-file (auth_token_file), or accept that anyone who reaches it "
                 "can read, overwrite and clear the cache with --insecure-no-auth", s->address);
        return GDRKV_E_INVALID;
    }
    return listen_unix(s, opts->unix_path, err, errlen);
}

static int start_metrics(struct gdrkv_server *s, const gdrkv_server_opts *opts, char *err,
                         size_t errlen)
{
    const char *given = opts->metrics_listen;
    char loopback[300];
    struct gk_addr addr;

    if (!given || !*given)
        return 0;
    /* A port alone (9480 or :9480) listens on loopback: other hosts only
     * when told so. */
    if (given[0] == ':' || strspn(given, "0123456789") == strlen(given)) {
        snprintf(loopback, sizeof loopback, "127.0.0.1:%s", given + (given[0] == ':'));
        given = loopback;
    }
    if (gk_parse_addr(given, 0, &addr) < 0) {
        snprintf(err, errlen, "metrics_listen must be host:port or a port, not %s",
                 opts->metrics_listen);
        return GDRKV_E_INVALID;
    }
    return server_metrics_start(s, &addr, opts->metrics_token_file, err, errlen);
}

/* The staged-copy helpers, then the workers and their threads. */
static int start_workers(struct gdrkv_server *s, const gdrkv_server_opts *opts, char *err,
                         size_t errlen)
{
    if (gk_copier_init(&s->copier, copy_helpers(), SERVER_COPY_PARALLEL_BYTES)) {
        snprintf(err, errlen, "cannot set up the copy helpers");
        return GDRKV_E_INTERNAL;
    }
    s->copier_ready = 1;
    for (int want = worker_count(opts->workers); s->nworkers < want; s->nworkers++) {
        if (server_worker_init(&s->workers[s->nworkers], s) < 0) {
            snprintf(err, errlen, "cannot set up worker %d: %s", s->nworkers, strerror(errno));
            return GDRKV_E_INTERNAL;
        }
    }
    if (start_threads(s) != 0) {
        snprintf(err, errlen, "cannot start the server's threads");
        return GDRKV_E_INTERNAL;
    }
    return 0;
}

static server_stage *const start_stages[] = {
    load_token, open_store, open_pin_accounts, start_rdma, open_listeners, start_metrics, start_workers,
};

static void log_started(struct gdrkv_server *s)
{
    struct store_stats st;

    store_get_stats(s->store, &st);
    GK_INFO("server listening on %s%s%s: pool %llu MiB, hugepages %s, %d workers, rdma %s",
            s->address, s->unix_fd >= 0 ? " and " : "", s->unix_path,
            (unsigned long long)(st.pool_bytes >> 20), st.hugepages ? "yes" : "no", s->nworkers,
            s->rdma ? "on" : "off");
}

int gdrkv_server_start(const gdrkv_server_opts *opts, gdrkv_server **out, char *err, size_t errlen)
{
    char unused[1];
    struct gk_addr addr;
    struct gdrkv_server *s;
    int rc;

    if (!err || errlen == 0)
        err = unused, errlen = sizeof unused;
    if (!opts || !out) {
        snprintf(err, errlen, "opts and out are required");
        return GDRKV_E_INVALID;
    }
    rc = server_options_check(opts, &addr, err, errlen);
    if (rc)
        return rc;
    s = server_new(opts, err, errlen);
    if (!s)
        return GDRKV_E_INTERNAL;
    for (size_t i = 0; rc == 0 && i < GK_ARRAY_LEN(start_stages); i++)
        rc = start_stages[i](s, opts, err, errlen);
    if (rc) {
        server_free(s);
        return rc;
    }
    log_started(s);
    *out = s;
    return 0;
}

/* One of the server's strings into the caller's buffer, whole or not at all. */
static int copy_out(const gdrkv_server *s, const char *text, char *buf, size_t len)
{
    if (!s || !buf)
        return GDRKV_E_INVALID;
    int n = snprintf(buf, len, "%s", text);
    return n >= 0 && (size_t)n < len ? 0 : GDRKV_E_INVALID;
}

int gdrkv_server_address(gdrkv_server *s, char *buf, size_t len)
{
    return copy_out(s, s ? s->address : NULL, buf, len);
}

int gdrkv_server_unix_path(gdrkv_server *s, char *buf, size_t len)
{
    return copy_out(s, s ? s->unix_path : NULL, buf, len);
}

/* A text the server writes into the caller's buffer (cut at its end). */
static int write_text(gdrkv_server *s, char *buf, size_t len,
                      void (*fill)(struct gdrkv_server *, struct gk_text *))
{
    struct gk_text t;

    if (!s || !buf || len == 0)
        return GDRKV_E_INVALID;
    gk_text_init(&t, buf, len);
    fill(s, &t);
    return gk_text_finish(&t);
}

int gdrkv_server_stats(gdrkv_server *s, char *buf, size_t len)
{
    return write_text(s, buf, len, server_stats_text);
}

int gdrkv_server_metrics(gdrkv_server *s, char *buf, size_t len)
{
    return write_text(s, buf, len, server_metrics_text);
}

int gdrkv_server_metrics_address(gdrkv_server *s, char *buf, size_t len)
{
    return copy_out(s, s ? s->metrics_address : NULL, buf, len);
}

void gdrkv_server_set_cluster(gdrkv_server *s, int state, uint64_t lease_renewed_ns,
                              uint64_t etcd_errors)
{
    if (!s)
        return;
    __atomic_store_n(&s->cluster.state, state, __ATOMIC_RELAXED);
    __atomic_store_n(&s->cluster.lease_renewed_ns, lease_renewed_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&s->cluster.etcd_errors, etcd_errors, __ATOMIC_RELAXED);
}

void gdrkv_server_stop(gdrkv_server *s)
{
    if (!s)
        return;
    GK_INFO("server on %s stopping", s->address);
    server_free(s);
}
