/*
 * stats.h - counters shared by the server and the client: latency
 * histograms with log2 microsecond buckets, and the "name value\n" text
 * format every stats call returns (easy to parse, and one step from the
 * Prometheus text format).
 */
#ifndef GDRKV_STATS_H
#define GDRKV_STATS_H

#include <stddef.h>
#include <stdint.h>

/* Counters that many threads bump and a stats call reads: relaxed atomics,
 * since each counter is read on its own, never as a consistent set. */
static inline void gk_counter_add(uint64_t *counter, uint64_t n)
{
    __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}

static inline uint64_t gk_counter_get(const uint64_t *counter)
{
    return __atomic_load_n(counter, __ATOMIC_RELAXED);
}

#define GK_LAT_BUCKETS 32   /* bucket b counts latencies in [2^(b-1), 2^b) us */

/* Updated with relaxed atomics so any thread may record without a lock. */
struct gk_latency {
    uint64_t buckets[GK_LAT_BUCKETS];
    uint64_t count;
    uint64_t sum_us;
    uint64_t max_us;
};

void gk_latency_record(struct gk_latency *l, uint64_t us);
/* Adds src into dst (both read with relaxed atomics). */
void gk_latency_merge(struct gk_latency *dst, const struct gk_latency *src);

/* A bounded text buffer; appends past the end are dropped, never overflow. */
struct gk_text {
    char *buf;
    size_t cap;
    size_t len;
};

void gk_text_init(struct gk_text *t, char *buf, size_t cap);
void gk_text_u64(struct gk_text *t, const char *name, uint64_t value);
void gk_text_printf(struct gk_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends name_p50/_p99/_max (microseconds) and name_count. */
void gk_text_latency(struct gk_text *t, const char *name, const struct gk_latency *l);
/* Length of the text (NUL-terminated in buf when cap > 0). */
int gk_text_finish(struct gk_text *t);

#endif
