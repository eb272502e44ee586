/*
 * stats.c - see stats.h.
 */
#include "stats.h"

#include <stdarg.h>
#include <stdio.h>

static unsigned bucket_of(uint64_t us)
{
    unsigned b = us ? 64u - (unsigned)__builtin_clzll(us) : 0;
    return b < GK_LAT_BUCKETS ? b : GK_LAT_BUCKETS - 1;
}

void gk_latency_record(struct gk_latency *l, uint64_t us)
{
    gk_counter_add(&l->buckets[bucket_of(us)], 1);
    gk_counter_add(&l->count, 1);
    gk_counter_add(&l->sum_us, us);
    uint64_t cur = gk_counter_get(&l->max_us);
    while (us > cur &&
           !__atomic_compare_exchange_n(&l->max_us, &cur, us, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

void gk_latency_merge(struct gk_latency *dst, const struct gk_latency *src)
{
    for (unsigned b = 0; b < GK_LAT_BUCKETS; b++)
        dst->buckets[b] += gk_counter_get(&src->buckets[b]);
    dst->count += gk_counter_get(&src->count);
    dst->sum_us += gk_counter_get(&src->sum_us);
    uint64_t m = gk_counter_get(&src->max_us);
    if (m > dst->max_us)
        dst->max_us = m;
}

/* Upper bound of the bucket holding the q-quantile (0 < q <= 1), in us. */
static uint64_t latency_quantile(const struct gk_latency *l, double q)
{
    uint64_t total = 0, seen = 0;
    for (unsigned b = 0; b < GK_LAT_BUCKETS; b++)
        total += l->buckets[b];
    if (total == 0)
        return 0;
    uint64_t rank = (uint64_t)(q * (double)total + 0.5);
    if (rank == 0)
        rank = 1;
    for (unsigned b = 0; b < GK_LAT_BUCKETS; b++) {
        seen += l->buckets[b];
        if (seen >= rank) {
            uint64_t upper = b ? (1ull << b) - 1 : 0;
            return upper < l->max_us ? upper : l->max_us;
        }
    }
    return l->max_us;
}

void gk_text_init(struct gk_text *t, char *buf, size_t cap)
{
    t->buf = buf;
    t->cap = cap;
    t->len = 0;
    if (cap)
        buf[0] = '\0';
}

void gk_text_printf(struct gk_text *t, const char *fmt, ...)
{
    if (t->len + 1 >= t->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    /* A line that did not fit is cut off whole, so readers never see half a value. */
    if (n < 0 || (size_t)n >= t->cap - t->len)
        t->buf[t->len] = '\0', t->cap = t->len + 1;
    else
        t->len += (size_t)n;
}

void gk_text_u64(struct gk_text *t, const char *name, uint64_t value)
{
    gk_text_printf(t, "%s %llu\n", name, (unsigned long long)value);
}

void gk_text_latency(struct gk_text *t, const char *name, const struct gk_latency *l)
{
    gk_text_printf(t, "%s_count %llu\n%s_us_p50 %llu\n%s_us_p99 %llu\n%s_us_max %llu\n",
           name, (unsigned long long)l->count,
           name, (unsigned long long)latency_quantile(l, 0.50),
           name, (unsigned long long)latency_quantile(l, 0.99),
           name, (unsigned long long)l->max_us);
}

int gk_text_finish(struct gk_text *t)
{
    return (int)t->len;
}
