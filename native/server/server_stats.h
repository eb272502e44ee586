/*
 * server_stats.h - the per-op counters of a worker and the stats text:
 * the store's figures, then every worker's counters summed at read time.
 */
#ifndef GDRKV_SERVER_STATS_H
#define GDRKV_SERVER_STATS_H

#include <stdint.h>

struct gdrkv_server;
struct gk_text;
struct server_counters;

void server_count_op(struct server_counters *c, uint8_t opcode, uint32_t keys, uint64_t latency_us);
/* Every worker's counters, summed. */
void server_stats_sum(struct gdrkv_server *s, struct server_counters *sum);
/* The cluster registration's state, as gdrkv_server_set_cluster last set it. */
struct server_cluster_view {
    uint64_t state;                 /* enum gdrkv_cluster_state */
    uint64_t lease_age_ms;          /* since the lease was last renewed; 0 without one */
    uint64_t etcd_errors;
};
void server_cluster_read(struct gdrkv_server *s, struct server_cluster_view *v);

/* Appends the cluster registration's state (cluster_state, _lease_age_ms,
 * _etcd_errors) as "name value" lines. */
void server_cluster_stats(struct gdrkv_server *s, struct gk_text *t);
/* Appends every server counter and the store's stats as "name value" lines. */
void server_stats_text(struct gdrkv_server *s, struct gk_text *t);

#endif
