/*
 * server_metrics.h - the server's counters in the Prometheus text format
 * (version 0.0.4), and the HTTP endpoint that serves them
 * (`gdrkv serve --metrics-listen`). Names are gdrkv_*, counters end in
 * _total, units are spelled out (bytes, seconds), op latencies are
 * histograms. The endpoint has a thread of its own and reads the counters
 * as stats calls do, so a scrape never waits on, or holds up, the data
 * path; a scraper that stalls holds up only other scrapes, for at most
 * METRICS_IO_TIMEOUT_MS.
 */
#ifndef GDRKV_SERVER_METRICS_H
#define GDRKV_SERVER_METRICS_H

#include <stddef.h>

struct gdrkv_server;
struct gk_addr;
struct gk_text;

#define METRICS_IO_TIMEOUT_MS 2000
#define METRICS_TEXT_MAX (2u << 20)
/* Namespaces in the per-namespace usage (the busiest deployments have a
 * few per model; a client can make many more), and their lines' room. */
#define METRICS_NAMESPACES_MAX 1000u
#define METRICS_NS_TEXT_MAX (METRICS_NAMESPACES_MAX * (3u * 255 + 64))

void server_metrics_text(struct gdrkv_server *s, struct gk_text *t);

/* Starts the endpoint on addr: 0, or a negative gdrkv_error with a message
 * in err. server_metrics_stop (safe when never started) ends it. */
int server_metrics_start(struct gdrkv_server *s, const struct gk_addr *addr, char *err,
                         size_t errlen);
void server_metrics_stop(struct gdrkv_server *s);

#endif
