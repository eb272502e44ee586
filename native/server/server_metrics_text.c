/*
 * server_metrics_text.c - the server's counters in the Prometheus text
 * format (server_metrics.h).
 */
#include "server_metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/log.h"
#include "common/protocol.h"
#include "common/stats.h"
#include "rdma/rdma_dev.h"
#include "server_rdma.h"
#include "server_state.h"
#include "server_stats.h"
#include "store/store.h"

/* ------------------------------------------------------------ the text */

static void metric(struct gk_text *t, const char *name, const char *type, const char *help,
                   uint64_t value)
{
    gk_text_printf(t, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name,
                   (unsigned long long)value);
}

static void store_metric(struct gk_text *t, const char *field, const char *kind,
                         const char *help, uint64_t value)
{
    char name[96];
    int counter = !strcmp(kind, "COUNTER");
    snprintf(name, sizeof name, "gdrkv_store_%s%s", field, counter ? "_total" : "");
    metric(t, name, counter ? "counter" : "gauge", help, value);
}

/* The ops' latency histograms: bucket b of gk_latency holds [2^(b-1),
 * 2^b) microseconds, so its cumulative count is the one of le=2^b us. */
static void latency_histograms(struct gk_text *t, const struct server_counters *sum)
{
    gk_text_printf(t, "# HELP gdrkv_op_duration_seconds time from a request's header to "
                      "its answer being written\n# TYPE gdrkv_op_duration_seconds histogram\n");
    for (uint8_t op = 1; op <= GK_OP_MAX; op++) {
        const struct gk_latency *l = &sum->latency[op];
        uint64_t cumulative = 0;
        for (int b = 0; b < GK_LAT_BUCKETS; b++) {
            cumulative += l->buckets[b];
            gk_text_printf(t, "gdrkv_op_duration_seconds_bucket{op=\"%s\",le=\"%g\"} %llu\n",
                           gk_op_name(op), (double)(1ull << b) / 1e6,
                           (unsigned long long)cumulative);
        }
        gk_text_printf(t, "gdrkv_op_duration_seconds_bucket{op=\"%s\",le=\"+Inf\"} %llu\n"
                          "gdrkv_op_duration_seconds_sum{op=\"%s\"} %g\n"
                          "gdrkv_op_duration_seconds_count{op=\"%s\"} %llu\n",
                       gk_op_name(op), (unsigned long long)l->count, gk_op_name(op),
                       (double)l->sum_us / 1e6, gk_op_name(op), (unsigned long long)l->count);
    }
}

/* Per-namespace usage: the namespaces with most bytes get series of their
 * own (metrics_namespaces of them), the others are summed. The walk only
 * copies, under the store's lock: a min-heap on bytes keeps the leaders;
 * formatting comes after the lock is let go. */
struct ns_usage {
    uint64_t objects, bytes;
    uint32_t len;
    uint8_t name[GK_MAX_NS_LEN];
};

struct ns_top {
    uint32_t cap, n;                /* heap[0..n) of at most cap, fewest bytes on top */
    struct ns_usage *heap;
    uint64_t others, other_objects, other_bytes;
};

static void heap_swap(struct ns_usage *a, struct ns_usage *b)
{
    struct ns_usage t = *a;
    *a = *b;
    *b = t;
}

static void sift_down(struct ns_top *top, uint32_t i)
{
    for (;;) {
        uint32_t least = i, l = 2 * i + 1, r = l + 1;
        if (l < top->n && top->heap[l].bytes < top->heap[least].bytes)
            least = l;
        if (r < top->n && top->heap[r].bytes < top->heap[least].bytes)
            least = r;
        if (least == i)
            return;
        heap_swap(&top->heap[i], &top->heap[least]);
        i = least;
    }
}

static void count_other(struct ns_top *top, uint64_t objects, uint64_t bytes)
{
    top->others++;
    top->other_objects += objects;
    top->other_bytes += bytes;
}

/* Store lock held: a copy at most, no formatting. */
static void keep_namespace(void *arg, const uint8_t *name, uint32_t len, uint64_t objects,
                           uint64_t bytes)
{
    struct ns_top *top = arg;
    struct ns_usage *slot;

    if (top->n < top->cap) {
        uint32_t i = top->n++;
        slot = &top->heap[i];
        slot->objects = objects, slot->bytes = bytes, slot->len = len;
        memcpy(slot->name, name, len);
        for (; i > 0 && top->heap[(i - 1) / 2].bytes > top->heap[i].bytes; i = (i - 1) / 2)
            heap_swap(&top->heap[i], &top->heap[(i - 1) / 2]);
        return;
    }
    if (top->cap == 0 || bytes <= top->heap[0].bytes) {
        count_other(top, objects, bytes);
        return;
    }
    slot = &top->heap[0];
    count_other(top, slot->objects, slot->bytes);
    slot->objects = objects, slot->bytes = bytes, slot->len = len;
    memcpy(slot->name, name, len);
    sift_down(top, 0);
}

static int most_bytes_first(const void *a, const void *b)
{
    const struct ns_usage *x = a, *y = b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : 0;
}

void metrics_label_value(char *out, const uint8_t *name, uint32_t len)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (uint32_t i = 0; i < len; i++) {
        uint8_t ch = name[i];
        if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\' && ch != '%') {
            out[o++] = (char)ch;
        } else {
            out[o++] = '%';
            out[o++] = hex[ch >> 4];
            out[o++] = hex[ch & 15];
        }
    }
    out[o] = '\0';
}

static void namespace_series(struct gk_text *t, const struct ns_top *top, int bytes)
{
    char label[METRICS_LABEL_MAX];
    for (uint32_t i = 0; i < top->n; i++) {
        const struct ns_usage *u = &top->heap[i];
        metrics_label_value(label, u->name, u->len);
        gk_text_printf(t, "gdrkv_namespace_%s{namespace=\"%s\"} %llu\n",
                       bytes ? "bytes" : "objects", label,
                       (unsigned long long)(bytes ? u->bytes : u->objects));
    }
}

static void namespace_metrics(struct gdrkv_server *s, struct gk_text *t)
{
    struct ns_top top = {.cap = s->opts.metrics_namespaces};
    if (top.cap && !(top.heap = malloc((size_t)top.cap * sizeof *top.heap))) {
        GK_WARN("metrics: no memory for the namespaces' usage");
        return;
    }
    store_each_namespace(s->store, UINT32_MAX, keep_namespace, &top);
    qsort(top.heap, top.n, sizeof *top.heap, most_bytes_first);

    gk_text_printf(t, "# HELP gdrkv_namespace_objects committed objects, by namespace (the "
                      "%u with most bytes)\n# TYPE gdrkv_namespace_objects gauge\n",
                   top.cap);
    namespace_series(t, &top, 0);
    gk_text_printf(t, "# HELP gdrkv_namespace_bytes committed bytes, by namespace (the %u "
                      "with most)\n# TYPE gdrkv_namespace_bytes gauge\n", top.cap);
    namespace_series(t, &top, 1);
    metric(t, "gdrkv_namespace_series_max", "gauge",
           "namespaces with series of their own (metrics_namespaces)", top.cap);
    metric(t, "gdrkv_namespace_others", "gauge",
           "namespaces with objects past that cap, summed below", top.others);
    metric(t, "gdrkv_namespace_others_objects", "gauge",
           "committed objects of the namespaces past the cap", top.other_objects);
    metric(t, "gdrkv_namespace_others_bytes", "gauge",
           "committed bytes of the namespaces past the cap", top.other_bytes);
    free(top.heap);
}

/* The NICs' own counters (sysfs; rdma_port_counters), one family at a
 * time since each family's lines must stay together: the data words as
 * bytes, then every other counter under its sysfs name. */
enum nic_family { NIC_RECEIVED, NIC_SENT, NIC_OTHER };

struct nic_lines {
    struct gk_text *t;
    enum nic_family family;
};

static void nic_line(void *arg, const char *device, int port, const char *group,
                     const char *name, uint64_t value)
{
    struct nic_lines *l = arg;
    int received = !strcmp(name, "port_rcv_data"), sent = !strcmp(name, "port_xmit_data");
    const char *metric = l->family == NIC_RECEIVED ? "gdrkv_nic_received_bytes_total"
                         : l->family == NIC_SENT   ? "gdrkv_nic_sent_bytes_total"
                                                   : "gdrkv_nic_counter_total";
    if (l->family == NIC_OTHER && !received && !sent)
        gk_text_printf(l->t, "%s{device=\"%s\",port=\"%d\",group=\"%s\",counter=\"%s\"} %llu\n",
                       metric, device, port, group, name, (unsigned long long)value);
    else if ((l->family == NIC_RECEIVED && received) || (l->family == NIC_SENT && sent))
        gk_text_printf(l->t, "%s{device=\"%s\",port=\"%d\"} %llu\n", metric, device, port,
                       (unsigned long long)value * 4);     /* 4-byte words */
}

static void nic_metrics(struct gk_text *t)
{
    static const char *const heads[] = {
        "# HELP gdrkv_nic_received_bytes_total bytes the RDMA port received (all traffic)\n"
        "# TYPE gdrkv_nic_received_bytes_total counter\n",
        "# HELP gdrkv_nic_sent_bytes_total bytes the RDMA port sent (all traffic)\n"
        "# TYPE gdrkv_nic_sent_bytes_total counter\n",
        "# HELP gdrkv_nic_counter_total the RDMA port's other counters, by sysfs name\n"
        "# TYPE gdrkv_nic_counter_total counter\n",
    };
    for (int family = NIC_RECEIVED; family <= NIC_OTHER; family++) {
        struct nic_lines lines = {.t = t, .family = (enum nic_family)family};
        gk_text_printf(t, "%s", heads[family]);
        rdma_port_counters(nic_line, &lines);
    }
}

/* The rdma figures come as "name value" lines (server_rdma_stats): each
 * becomes gdrkv_<name>, a gauge. */
static void rdma_metrics(struct gdrkv_server *s, struct gk_text *t)
{
    char lines[4096], name[96];
    unsigned long long value;
    struct gk_text r;
    int used;

    gk_text_init(&r, lines, sizeof lines);
    server_rdma_stats(s, &r);
    gk_text_finish(&r);
    for (const char *p = lines; sscanf(p, "%63s %llu%n", name + 6, &value, &used) == 2;
         p += used) {
        memcpy(name, "gdrkv_", 6);
        gk_text_printf(t, "# TYPE %s gauge\n%s %llu\n", name, name, value);
    }
}

/* The cluster registration's state (gdrkv_server_set_cluster). */
static void cluster_metrics(struct gdrkv_server *s, struct gk_text *t)
{
    struct server_cluster_view v;
    server_cluster_read(s, &v);
    metric(t, "gdrkv_cluster_state", "gauge",
           "0 not in a cluster, 1 unregistered (no lease), 2 serving, 3 leaving", v.state);
    gk_text_printf(t, "# HELP gdrkv_cluster_lease_age_seconds time since the etcd lease was "
                      "last renewed\n# TYPE gdrkv_cluster_lease_age_seconds gauge\n"
                      "gdrkv_cluster_lease_age_seconds %g\n", (double)v.lease_age_ms / 1e3);
    metric(t, "gdrkv_cluster_etcd_errors_total", "counter",
           "etcd requests of the registration that failed", v.etcd_errors);
}

void server_metrics_text(struct gdrkv_server *s, struct gk_text *t)
{
    struct store_stats st;
    struct server_counters sum;

    store_get_stats(s->store, &st);
    server_stats_sum(s, &sum);
#define STORE_METRIC(field, kind, help) store_metric(t, #field, #kind, help, st.field);
    STORE_STATS(STORE_METRIC)
#undef STORE_METRIC
#define COUNTER_METRIC(field, name, help) \
    metric(t, "gdrkv_" #name "_total", "counter", help, sum.field);
    SERVER_COUNTERS(COUNTER_METRIC)
#undef COUNTER_METRIC
    gk_text_printf(t, "# HELP gdrkv_connections_open connections open now\n"
                      "# TYPE gdrkv_connections_open gauge\n"
                      "gdrkv_connections_open{transport=\"tcp\"} %u\n"
                      "gdrkv_connections_open{transport=\"unix\"} %u\n",
                   __atomic_load_n(&s->connections, __ATOMIC_RELAXED),
                   __atomic_load_n(&s->local_connections, __ATOMIC_RELAXED));
    metric(t, "gdrkv_buffered_request_bytes", "gauge", "request bodies buffered now",
           __atomic_load_n(&s->buffered_bytes, __ATOMIC_RELAXED));
    metric(t, "gdrkv_uptime_seconds", "gauge", "seconds since the server started",
           (gk_now_ns() - s->started_ns) / 1000000000ull);
    metric(t, "gdrkv_shm_enabled", "gauge", "whether local clients get the pool (0 or 1)",
           (uint64_t)(s->unix_fd >= 0));
    struct server_gpu_pins_totals pins;
    server_gpu_pins_totals(s->gpu_pins, &pins);
    metric(t, "gdrkv_client_pinned_bytes", "gauge",
           "bytes of the pool local client processes report registered with CUDA", pins.bytes);
    metric(t, "gdrkv_client_pinned_max_process_bytes", "gauge",
           "the most one client process reports pinned", pins.max_process_bytes);
    metric(t, "gdrkv_client_pinning_processes", "gauge",
           "client processes that report bytes pinned", pins.processes);
    gk_text_printf(t, "# HELP gdrkv_ops_total frames answered, by op\n"
                      "# TYPE gdrkv_ops_total counter\n");
    for (uint8_t op = 1; op <= GK_OP_MAX; op++)
        gk_text_printf(t, "gdrkv_ops_total{op=\"%s\"} %llu\n", gk_op_name(op),
                       (unsigned long long)sum.ops[op]);
    gk_text_printf(t, "# HELP gdrkv_keys_total keys in the frames answered, by op\n"
                      "# TYPE gdrkv_keys_total counter\n");
    for (uint8_t op = 1; op <= GK_OP_MAX; op++)
        gk_text_printf(t, "gdrkv_keys_total{op=\"%s\"} %llu\n", gk_op_name(op),
                       (unsigned long long)sum.keys[op]);
    latency_histograms(t, &sum);
    namespace_metrics(s, t);
    cluster_metrics(s, t);
    rdma_metrics(s, t);
    nic_metrics(t);
}

