/*
 * server_options.c - every field of gdrkv_server_opts, one line each
 * (Redis config.c's static_configs[]): its name, which is gdrkv.Server's
 * keyword, the TOML key and the `gdrkv serve` flag (--name with dashes;
 * --no-name for a flag that is on by default), the field it sets, how its
 * value is written, its default and its help. gdrkv_server_opts_init takes
 * the defaults from here and Python takes the rest (gdrkv_server_option_at),
 * so a new option is two edits: its field in gdrkv.h and its line below.
 * server_options_check is the one validator.
 *
 * Kinds: text (a string, NULL = none), flag (0/1), mode (-1 auto, 0 off,
 * 1 on), int, int_or_auto (-1 = auto), size (bytes; "1GiB" in Python),
 * ratio (a double).
 */
#include "server_options.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "common/net.h"
#include "common/protocol.h"
#include "server_metrics.h"
#include "server_strangers.h"

struct server_option {
    gdrkv_server_option about;
    size_t offset, size;            /* of its field in gdrkv_server_opts */
    double number;                  /* default of every kind but text */
    const char *text;               /* default of text */
};

/* The width each kind is written with (set_default): a field of another
 * width makes a negative array size, so the table does not compile. */
#define WIDTH_text sizeof(const char *)
#define WIDTH_flag sizeof(int)
#define WIDTH_mode sizeof(int)
#define WIDTH_int sizeof(int32_t)
#define WIDTH_int_or_auto sizeof(int)
#define WIDTH_size sizeof(uint64_t)
#define WIDTH_ratio sizeof(double)
#define FIELD_SIZE(field) sizeof(((gdrkv_server_opts *)0)->field)
#define FIELD(field, kind)                                                                  \
    offsetof(gdrkv_server_opts, field),                                                     \
        FIELD_SIZE(field) + 0 * sizeof(char[FIELD_SIZE(field) == WIDTH_##kind ? 1 : -1])

#define OPTION(name, field, kind, default, help) \
    {{#name, #field, #kind, help}, FIELD(field, kind), (double)(default), NULL}
#define TEXT_OPTION(name, default, help) \
    {{#name, #name, "text", help}, FIELD(name, text), 0, default}

static const struct server_option options[] = {
    TEXT_OPTION(listen, "127.0.0.1:7480", "address to serve on, host:port (port 0 picks one)"),
    OPTION(memory, memory_bytes, size, 1ull << 30, "pool size, e.g. 16GiB"),
    OPTION(workers, workers, int, 0, "network threads; 0: one per CPU, at most 16"),
    OPTION(busy_poll_us, busy_poll_us, int_or_auto, -1,
           "after serving a frame, a network thread polls this many microseconds before it "
           "sleeps, so a busy client's next frame finds it awake: less latency for some CPU "
           "(auto: 1000 on hosts of 8 CPUs or more, else 0, off)"),
    OPTION(hugepages, hugepages, mode, -1,
           "back the pool by huge pages: auto where the system has them, on to require them"),
    OPTION(pretouch, pretouch, flag, 1,
           "fault the pool in at start (a slower start, faster first writes)"),
    OPTION(high_watermark, high_watermark, ratio, 0.95,
           "evict least recently used objects in the background above this share of the "
           "pool in use"),
    OPTION(low_watermark, low_watermark, ratio, 0.90, "... down to this share"),
    OPTION(stall_timeout_ms, stall_timeout_ms, int, 30000,
           "close connections stalled mid-frame this long (and drop their pins)"),
    OPTION(max_connections, max_connections, int, 4096,
           "tcp connections at a time; local (unix) ones have as many apart"),
    OPTION(max_connections_per_peer, max_connections_per_peer, int, 512,
           "tcp connections from one IP address"),
    OPTION(idle_timeout_ms, idle_timeout_ms, int, 300000,
           "close connections without a frame for this long; clients reconnect"),
    OPTION(auth_timeout_ms, auth_timeout_ms, int, 1000,
           "with --auth-token-file: close connections not authenticated this long after "
           "they open"),
    OPTION(max_unauthenticated, max_unauthenticated, int, 512,
           "with --auth-token-file: tcp connections not yet authenticated, apart from "
           "--max-connections (when full, the address with most gives up its oldest)"),
    OPTION(max_unauthenticated_per_peer, max_unauthenticated_per_peer, int, 64,
           "with --auth-token-file: of those, from one IP address"),
    OPTION(max_buffered, max_buffered_bytes, size, 256ull << 20,
           "request bodies buffered over all connections; bigger ones wait"),
    TEXT_OPTION(unix_path, NULL,
                "unix socket for local clients (the shm transport); default "
                "/tmp/gdrkv-<uid>/<port>.sock, or $GDRKV_RUNTIME_DIR/<port>.sock; '' turns "
                "shm off"),
    OPTION(lease_timeout_ms, lease_timeout_ms, int, 5000,
           "longest an shm or rdma client may hold the objects it reads or the room it "
           "writes into"),
    OPTION(peer_pin_share, peer_pin_share, ratio, 0.25,
           "most of the pool one peer (an IP address; a local process) may hold pinned by "
           "its reads at a time (tcp GET values being sent, shm and rdma leases): keys past "
           "it are answered BUSY, so no reader can keep the writers out of the pool"),
    OPTION(shm_staging, shm_staging_bytes, size, 64ull << 20,
           "staging memfd of each local connection: shm PUT values go there and the server "
           "copies them into the pool (0 sends them on the socket)"),
    OPTION(single_tenant, single_tenant, flag, 0,
           "local clients map the pool writable and copy PUT values straight into their "
           "reservations: faster writes, but any local client of this user can then "
           "overwrite any object"),
    TEXT_OPTION(pool_file, NULL,
                "keep the pool in PATH (on tmpfs such as /dev/shm, or hugetlbfs) and, when "
                "PATH holds the pool of an earlier server of the same --memory, serve its "
                "objects again: the cache survives a restart, a crash or kill -9 (not a "
                "reboot)"),
    OPTION(reset_pool_file, reset_pool_file, flag, 0,
           "start the --pool-file empty whatever it holds (another size, another version, "
           "damaged)"),
    TEXT_OPTION(disk, NULL,
                "a disk tier under the pool, directories separated by commas: objects the "
                "pool evicts go to a file in each directory (a local SSD) instead of being "
                "dropped, and come back when read; the next server finds them again"),
    OPTION(disk_size, disk_size, size, 0,
           "size of the disk tier's file in each --disk directory, e.g. 500GiB"),
    OPTION(reset_disk, reset_disk, flag, 0, "start the --disk files empty whatever they hold"),
    TEXT_OPTION(disk_full_policy, "throttle",
                "with --disk, what a PUT does when the pool is full of objects not on disk "
                "yet: throttle (wait for the disk to take some, so nothing acknowledged is "
                "dropped while the disk has room; writers go at the disk's speed) or drop "
                "(evict them: writers go at memory speed, the excess is lost)"),
    OPTION(disk_full_wait_ms, disk_full_wait_ms, int, 4000,
           "the longest a throttled PUT waits for room before its keys fail NO_SPACE (a "
           "failing disk fails them at once)"),
    OPTION(rdma, rdma, mode, -1,
           "serve rdma clients: auto when a device is there, on to require one"),
    TEXT_OPTION(auth_token_file, NULL,
                "serve only clients holding the secret in PATH (mode 600; clients give "
                "token_file= or GDRKV_TOKEN_FILE); required to listen on an address other "
                "hosts can reach"),
    OPTION(insecure_no_auth, insecure_no_auth, flag, 0,
           "listen on an address other hosts can reach without a token: anyone reaching it "
           "can read, overwrite and clear the cache"),
    OPTION(drain_timeout_ms, drain_timeout_ms, int, 5000,
           "on stop (SIGTERM), let frames in flight finish this long, accepting nothing new"),
    TEXT_OPTION(metrics_listen, NULL,
                "serve the counters in the Prometheus text format at http://HOST:PORT/metrics "
                "(a port alone: on 127.0.0.1)"),
    TEXT_OPTION(metrics_token_file, NULL,
                "/metrics answers only requests with 'Authorization: Bearer' and the secret in "
                "PATH (mode 600; Prometheus' authorization: credentials_file), 401 otherwise"),
    OPTION(metrics_namespaces, metrics_namespaces, int, 100,
           "namespaces with series of their own in /metrics, those with most bytes; the "
           "others are summed in gdrkv_namespace_others_*"),
    TEXT_OPTION(cluster, NULL,
                "join the cluster etcd://H1:2379[,H2:2379...]/NAME: keep this server's entry "
                "(address, capacity, zone, state) in that etcd on a lease, so that clients of "
                "gdrkv+etcd://H1:2379/NAME find it"),
    TEXT_OPTION(advertise, NULL,
                "host:port clients reach this server on, as published in the cluster (default: "
                "the listen address, or this host's address when listening on 0.0.0.0)"),
    TEXT_OPTION(zone, NULL,
                "failure domain published in the cluster: replicas go to distinct zones "
                "(default: the host name)"),
    OPTION(cluster_ttl_ms, cluster_ttl_ms, int, 5000,
           "the cluster entry's etcd lease: a server that stops renewing it (every third of "
           "it) leaves every client's table this long after; whole seconds, at least 2000"),
    OPTION(cluster_leave_ms, cluster_leave_ms, int, 2000,
           "on stop, how long the cluster entry says leaving (reads go on, PUTs go "
           "elsewhere) before it is withdrawn and the server drains"),
};

const gdrkv_server_option *gdrkv_server_option_at(uint32_t i)
{
    return i < GK_ARRAY_LEN(options) ? &options[i].about : NULL;
}

/* Writes an option's default into its field, as the field's C type. */
static void set_default(gdrkv_server_opts *opts, const struct server_option *o)
{
    char *field = (char *)opts + o->offset;

    if (!strcmp(o->about.kind, "text")) {
        memcpy(field, &o->text, sizeof o->text);
    } else if (!strcmp(o->about.kind, "ratio")) {
        double v = o->number;
        memcpy(field, &v, sizeof v);
    } else if (o->size == sizeof(uint64_t)) {
        uint64_t v = (uint64_t)o->number;
        memcpy(field, &v, sizeof v);
    } else {
        int32_t v = (int32_t)o->number;     /* int and uint32_t fields alike */
        memcpy(field, &v, sizeof v);
    }
}

void gdrkv_server_opts_init(gdrkv_server_opts *opts)
{
    *opts = (gdrkv_server_opts){0};
    for (size_t i = 0; i < GK_ARRAY_LEN(options); i++)
        set_default(opts, &options[i]);
}

void server_options_keep(gdrkv_server_opts *kept, const gdrkv_server_opts *given)
{
    static const char *const none = NULL;

    *kept = *given;
    for (size_t i = 0; i < GK_ARRAY_LEN(options); i++)
        if (!strcmp(options[i].about.kind, "text"))
            memcpy((char *)kept + options[i].offset, &none, sizeof none);
}

/* busy_poll_us -1 (auto): a worker that sleeps between the frames of a
 * call answers them later, but on a host of few CPUs the polling worker
 * takes the client's core (docs/operations.md, "Busy polling"). */
#define BUSY_POLL_MANY_CPUS 8
#define BUSY_POLL_AUTO_US 1000
#define BUSY_POLL_MAX_US 1000000

uint64_t server_busy_poll_ns(int busy_poll_us)
{
    if (busy_poll_us < 0)
        busy_poll_us = sysconf(_SC_NPROCESSORS_ONLN) >= BUSY_POLL_MANY_CPUS ? BUSY_POLL_AUTO_US : 0;
    return (uint64_t)busy_poll_us * 1000u;
}

/* etcd grants no lease shorter than about 1.5 s (its election timeout's
 * share), and counts them in whole seconds. */
#define CLUSTER_TTL_MIN_MS 2000
#define CLUSTER_LEAVE_MAX_MS 600000
#define CLUSTER_ZONE_MAX 255

/* The first fault of an option on its own, or NULL. */
static const char *range_fault(const gdrkv_server_opts *o, struct gk_addr *listen)
{
    if (!o->listen || gk_parse_addr(o->listen, 0, listen) < 0)
        return "listen must be host:port";
    if (o->memory_bytes == 0)
        return "memory_bytes must be > 0";
    if (o->workers < 0)
        return "workers must be >= 0";
    if (o->hugepages < -1 || o->hugepages > 1)
        return "hugepages must be -1, 0 or 1";
    if (!(o->low_watermark > 0 && o->low_watermark <= o->high_watermark &&
          o->high_watermark <= 1))
        return "watermarks need 0 < low <= high <= 1";
    if (o->stall_timeout_ms == 0)
        return "stall_timeout_ms must be > 0";
    if (o->max_connections == 0)
        return "max_connections must be > 0";
    if (o->max_connections_per_peer == 0)
        return "max_connections_per_peer must be > 0";
    if (o->idle_timeout_ms == 0)
        return "idle_timeout_ms must be > 0";
    if (o->auth_timeout_ms == 0)
        return "auth_timeout_ms must be > 0";
    if (o->max_unauthenticated == 0 || o->max_unauthenticated > SERVER_STRANGERS_MAX)
        return "max_unauthenticated must be 1 to 65536";
    if (o->max_unauthenticated_per_peer == 0)
        return "max_unauthenticated_per_peer must be > 0";
    if (o->max_buffered_bytes < GK_MAX_BODY)
        return "max_buffered_bytes must be at least 8MiB (one largest request body)";
    if (o->lease_timeout_ms == 0)
        return "lease_timeout_ms must be > 0";
    if (!(o->peer_pin_share > 0 && o->peer_pin_share <= 1))
        return "peer_pin_share needs 0 < share <= 1";
    if (o->rdma < -1 || o->rdma > 1)
        return "rdma must be -1, 0 or 1";
    if (o->shm_staging_bytes > GK_MAX_OBJECT * 4ull)
        return "shm_staging_bytes must be at most 4GiB";
    if (o->single_tenant < 0 || o->single_tenant > 1)
        return "single_tenant must be 0 or 1";
    if (o->busy_poll_us < -1)
        return "busy_poll_us must be at least 0 (or -1, auto)";
    if (o->busy_poll_us > BUSY_POLL_MAX_US)
        return "busy_poll_us must be -1 (auto) or 0 to 1000000";
    if (o->disk_full_policy && strcmp(o->disk_full_policy, "throttle") != 0 &&
        strcmp(o->disk_full_policy, "drop") != 0)
        return "disk_full_policy must be throttle or drop";
    if (o->disk_full_wait_ms == 0)
        return "disk_full_wait_ms must be > 0";
    if (o->metrics_namespaces > METRICS_NAMESPACES_MAX)
        return "metrics_namespaces must be at most 10000";
    if (o->unix_path && strlen(o->unix_path) >= GK_UNIX_PATH_MAX)
        return "unix_path is too long for a unix socket";
    if (o->cluster_ttl_ms < CLUSTER_TTL_MIN_MS || o->cluster_ttl_ms % 1000)
        return "cluster_ttl_ms must be whole seconds, at least 2000";
    if (o->cluster_leave_ms > CLUSTER_LEAVE_MAX_MS)
        return "cluster_leave_ms must be at most 600000";
    if (o->zone && (!*o->zone || strlen(o->zone) > CLUSTER_ZONE_MAX))
        return "zone must be 1 to 255 bytes";
    return NULL;
}

/* The first fault of options that go together, or NULL. */
static const char *pairing_fault(const gdrkv_server_opts *o)
{
    int has_disk = o->disk && *o->disk;

    if (o->reset_pool_file && !(o->pool_file && *o->pool_file))
        return "reset_pool_file needs a pool_file";
    if (has_disk != (o->disk_size > 0))
        return "disk and disk_size go together";
    if (o->reset_disk && !has_disk)
        return "reset_disk needs a disk";
    if (o->metrics_token_file && *o->metrics_token_file &&
        !(o->metrics_listen && *o->metrics_listen))
        return "metrics_token_file needs a metrics_listen";
    if (!(o->cluster && *o->cluster) && (o->advertise || o->zone))
        return "advertise and zone need a cluster";
    return NULL;
}

int server_options_check(const gdrkv_server_opts *o, struct gk_addr *listen, char *err,
                         size_t errlen)
{
    const char *bad = range_fault(o, listen);

    if (!bad)
        bad = pairing_fault(o);
    if (bad)
        snprintf(err, errlen, "%s", bad);
    return bad ? GDRKV_E_INVALID : 0;
}
