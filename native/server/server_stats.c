/*
 * server_stats.c - the server's counters as "name value" lines: the
 * store's own stats, then the workers' counters summed at read time.
 */
#include <stdio.h>

#include "common/common.h"
#include "server_rdma.h"
#include "server_state.h"
#include "server_strangers.h"
#include "server_stats.h"
#include "store/store.h"


void server_count_op(struct server_counters *c, uint8_t opcode, uint32_t keys, uint64_t latency_us)
{
    gk_counter_add(&c->ops[opcode], 1);
    gk_counter_add(&c->keys[opcode], keys);
    gk_latency_record(&c->latency[opcode], latency_us);
}

static void sum_counters(struct server_counters *sum, const struct server_counters *c)
{
#define SUM_COUNTER(name, metric, help) sum->name += gk_counter_get(&c->name);
    SERVER_COUNTERS(SUM_COUNTER)
#undef SUM_COUNTER
    for (int op = 1; op <= GK_OP_MAX; op++) {
        sum->ops[op] += gk_counter_get(&c->ops[op]);
        sum->keys[op] += gk_counter_get(&c->keys[op]);
        gk_latency_merge(&sum->latency[op], &c->latency[op]);
    }
}

void server_stats_sum(struct gdrkv_server *s, struct server_counters *sum)
{
    *sum = (struct server_counters){0};
    for (int i = 0; i < s->nworkers; i++)
        sum_counters(sum, &s->workers[i].counters);
}

void server_cluster_read(struct gdrkv_server *s, struct server_cluster_view *v)
{
    uint64_t renewed = __atomic_load_n(&s->cluster.lease_renewed_ns, __ATOMIC_RELAXED);
    uint64_t now = gk_now_ns();

    v->state = (uint64_t)__atomic_load_n(&s->cluster.state, __ATOMIC_RELAXED);
    v->lease_age_ms = renewed && now > renewed ? (now - renewed) / 1000000u : 0;
    v->etcd_errors = __atomic_load_n(&s->cluster.etcd_errors, __ATOMIC_RELAXED);
}

void server_cluster_stats(struct gdrkv_server *s, struct gk_text *t)
{
    struct server_cluster_view v;
    server_cluster_read(s, &v);
    gk_text_u64(t, "cluster_state", v.state);
    gk_text_u64(t, "cluster_lease_age_ms", v.lease_age_ms);
    gk_text_u64(t, "cluster_etcd_errors", v.etcd_errors);
}

/* Each line is named after the field it prints, so names can't drift. */
#define STORE_LINE(field, kind, help) gk_text_u64(t, #field, (uint64_t)st.field);
#define COUNTER_LINE(field, metric, help) gk_text_u64(t, #field, sum.field);

void server_stats_text(struct gdrkv_server *s, struct gk_text *t)
{
    struct store_stats st;
    struct server_counters sum;
    char name[64];

    store_get_stats(s->store, &st);
    STORE_STATS(STORE_LINE)

    server_stats_sum(s, &sum);
    gk_text_u64(t, "uptime_seconds", (gk_now_ns() - s->started_ns) / 1000000000ull);
    gk_text_u64(t, "workers", (uint64_t)s->nworkers);
    gk_text_u64(t, "busy_poll_us", s->busy_poll_ns / 1000u);
    gk_text_u64(t, "connections_current", __atomic_load_n(&s->connections, __ATOMIC_RELAXED));
    gk_text_u64(t, "local_connections_current",
                __atomic_load_n(&s->local_connections, __ATOMIC_RELAXED));
    gk_text_u64(t, "unauthenticated_connections_current", server_strangers_count(s->strangers));
    gk_text_u64(t, "buffered_bytes", __atomic_load_n(&s->buffered_bytes, __ATOMIC_RELAXED));
    gk_text_u64(t, "shm_enabled", (uint64_t)(s->unix_fd >= 0));
    struct server_gpu_pins_totals pins;
    server_gpu_pins_totals(s->gpu_pins, &pins);
    gk_text_u64(t, "client_pinned_bytes", pins.bytes);
    gk_text_u64(t, "client_pinned_max_process_bytes", pins.max_process_bytes);
    gk_text_u64(t, "client_pinning_processes", pins.processes);
    SERVER_COUNTERS(COUNTER_LINE)
    server_cluster_stats(s, t);
    server_rdma_stats(s, t);
    for (uint8_t op = 1; op <= GK_OP_MAX; op++) {
        snprintf(name, sizeof name, "ops_%s", gk_op_name(op));
        gk_text_u64(t, name, sum.ops[op]);
        snprintf(name, sizeof name, "keys_%s", gk_op_name(op));
        gk_text_u64(t, name, sum.keys[op]);
        snprintf(name, sizeof name, "latency_%s", gk_op_name(op));
        gk_text_latency(t, name, &sum.latency[op]);
    }
}
