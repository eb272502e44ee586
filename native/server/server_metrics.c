/*
 * server_metrics.c - see server_metrics.h.
 */
#include "server_metrics.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/common.h"
#include "common/log.h"
#include "common/net.h"
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

/* Per-namespace usage: a namespace's name is client bytes, so in a label
 * it is percent-encoded past printable ASCII, and for the quote, the
 * backslash and the percent sign. */
struct ns_lines {
    struct gk_text *objects, *bytes;
};

static void label_value(char *out, size_t cap, const uint8_t *name, uint32_t len)
{
    size_t o = 0;
    for (uint32_t i = 0; i < len && o + 4 < cap; i++) {
        uint8_t ch = name[i];
        if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\' && ch != '%')
            out[o++] = (char)ch;
        else
            o += (size_t)snprintf(out + o, cap - o, "%%%02X", ch);
    }
    out[o] = '\0';
}

static void namespace_lines(void *arg, const uint8_t *name, uint32_t len, uint64_t objects,
                            uint64_t bytes)
{
    struct ns_lines *lines = arg;
    char label[3 * GK_MAX_NS_LEN + 1];
    label_value(label, sizeof label, name, len);
    gk_text_printf(lines->objects, "gdrkv_namespace_objects{namespace=\"%s\"} %llu\n", label,
                   (unsigned long long)objects);
    gk_text_printf(lines->bytes, "gdrkv_namespace_bytes{namespace=\"%s\"} %llu\n", label,
                   (unsigned long long)bytes);
}

/* The namespaces' objects, then their bytes: each metric's lines stay
 * together, as the format wants, from one walk under the lock. */
static void namespace_metrics(struct gdrkv_server *s, struct gk_text *t)
{
    char *bytes_buf = malloc(METRICS_NS_TEXT_MAX);
    if (!bytes_buf)
        return;
    struct gk_text bytes_text;
    gk_text_init(&bytes_text, bytes_buf, METRICS_NS_TEXT_MAX);
    struct ns_lines lines = {.objects = t, .bytes = &bytes_text};
    gk_text_printf(t, "# HELP gdrkv_namespace_objects committed objects, by namespace "
                      "(the first %u)\n# TYPE gdrkv_namespace_objects gauge\n",
                   METRICS_NAMESPACES_MAX);
    store_each_namespace(s->store, METRICS_NAMESPACES_MAX, namespace_lines, &lines);
    gk_text_printf(t, "# HELP gdrkv_namespace_bytes committed bytes, by namespace\n"
                      "# TYPE gdrkv_namespace_bytes gauge\n%.*s",
                   gk_text_finish(&bytes_text), bytes_buf);
    free(bytes_buf);
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

/* The cluster registration's state (server_cluster_stats's lines). */
static void cluster_metrics(struct gdrkv_server *s, struct gk_text *t)
{
    char lines[256];
    unsigned long long state = 0, age_ms = 0, errors = 0;
    struct gk_text r;

    gk_text_init(&r, lines, sizeof lines);
    server_cluster_stats(s, &r);
    gk_text_finish(&r);
    if (sscanf(lines, "cluster_state %llu cluster_lease_age_ms %llu cluster_etcd_errors %llu",
               &state, &age_ms, &errors) != 3)
        return;
    metric(t, "gdrkv_cluster_state", "gauge",
           "0 not in a cluster, 1 unregistered (no lease), 2 serving, 3 leaving", state);
    gk_text_printf(t, "# HELP gdrkv_cluster_lease_age_seconds time since the etcd lease was "
                      "last renewed\n# TYPE gdrkv_cluster_lease_age_seconds gauge\n"
                      "gdrkv_cluster_lease_age_seconds %g\n", (double)age_ms / 1e3);
    metric(t, "gdrkv_cluster_etcd_errors_total", "counter",
           "etcd requests of the registration that failed", errors);
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

/* ------------------------------------------------------------ the endpoint */

struct server_metrics {
    int listen_fd;
    pthread_t thread;
    char *text;
};

/* Reads the request head (bounded in size and time) and answers it. */
static void serve_scrape(struct gdrkv_server *s, int fd)
{
    struct timeval tv = {.tv_sec = METRICS_IO_TIMEOUT_MS / 1000,
                         .tv_usec = METRICS_IO_TIMEOUT_MS % 1000 * 1000};
    char req[2048];
    size_t got = 0;

    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    while (got < sizeof req - 1) {
        ssize_t n = recv(fd, req + got, sizeof req - 1 - got, 0);
        if (n <= 0)
            return;
        got += (size_t)n;
        req[got] = '\0';
        if (strstr(req, "\r\n\r\n") || strstr(req, "\n\n"))
            break;
    }
    req[got] = '\0';
    const char *status = "404 Not Found", *type = "text/plain";
    struct gk_text t;
    gk_text_init(&t, s->metrics->text, METRICS_TEXT_MAX);
    if (!strncmp(req, "GET /metrics ", 13) || !strncmp(req, "GET /metrics?", 13)) {
        status = "200 OK";
        type = "text/plain; version=0.0.4; charset=utf-8";
        server_metrics_text(s, &t);
    } else {
        gk_text_printf(&t, "gdrkv serves its metrics at /metrics\n");
    }
    int len = gk_text_finish(&t);
    char head[256];
    int hlen = snprintf(head, sizeof head,
                        "HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                        "Connection: close\r\n\r\n", status, type, len);
    if (send(fd, head, (size_t)hlen, MSG_NOSIGNAL) == hlen)
        for (int sent = 0, n; sent < len; sent += n)
            if ((n = (int)send(fd, s->metrics->text + sent, (size_t)(len - sent), MSG_NOSIGNAL)) <= 0)
                break;
}

static void *metrics_main(void *arg)
{
    struct gdrkv_server *s = arg;
    struct pollfd fds[2] = {{.fd = s->metrics->listen_fd, .events = POLLIN},
                            {.fd = s->wake_fd, .events = POLLIN}};
    for (;;) {
        if (poll(fds, 2, -1) < 0 && errno != EINTR)
            break;
        if (fds[1].revents)
            break;
        if (!(fds[0].revents & POLLIN))
            continue;
        int fd = accept4(s->metrics->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            serve_scrape(s, fd);
            close(fd);
        }
    }
    return NULL;
}

int server_metrics_start(struct gdrkv_server *s, const struct gk_addr *addr, char *err,
                         size_t errlen)
{
    struct server_metrics *m = calloc(1, sizeof *m);
    if (!m || !(m->text = malloc(METRICS_TEXT_MAX))) {
        free(m);
        snprintf(err, errlen, "out of memory");
        return GDRKV_E_INTERNAL;
    }
    m->listen_fd = gk_listen_tcp(addr, 16, err, errlen);
    if (m->listen_fd < 0) {
        int rc = m->listen_fd;
        free(m->text);
        free(m);
        return rc;
    }
    gk_sock_name(m->listen_fd, s->metrics_address, sizeof s->metrics_address);
    s->metrics = m;
    if (pthread_create(&m->thread, NULL, metrics_main, s) != 0) {
        close(m->listen_fd);
        free(m->text);
        free(m);
        s->metrics = NULL;
        snprintf(err, errlen, "cannot start the metrics thread");
        return GDRKV_E_INTERNAL;
    }
    GK_INFO("metrics on http://%s/metrics", s->metrics_address);
    return 0;
}

void server_metrics_stop(struct gdrkv_server *s)
{
    struct server_metrics *m = s->metrics;
    if (!m)
        return;
    pthread_join(m->thread, NULL);      /* wake_fd is readable: stop has begun */
    close(m->listen_fd);
    free(m->text);
    free(m);
    s->metrics = NULL;
}
