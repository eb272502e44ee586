/*
 * log.c - see log.h. One fprintf per line so lines from several threads do
 * not interleave.
 */
#include "log.h"

#include "common.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

static int log_level = -1;

static int level_from_env(void)
{
    const char *s = getenv("GDRKV_LOG");
    if (!s || !*s) return GK_LOG_WARN;
    if (!strcasecmp(s, "error")) return GK_LOG_ERROR;
    if (!strcasecmp(s, "warn") || !strcasecmp(s, "warning")) return GK_LOG_WARN;
    if (!strcasecmp(s, "info")) return GK_LOG_INFO;
    if (!strcasecmp(s, "debug") || !strcasecmp(s, "trace")) return GK_LOG_DEBUG;
    return GK_LOG_WARN;
}

int gk_log_enabled(int level)
{
    int cur = __atomic_load_n(&log_level, __ATOMIC_RELAXED);
    if (cur < 0) {
        cur = level_from_env();
        __atomic_store_n(&log_level, cur, __ATOMIC_RELAXED);
    }
    return level <= cur;
}

static void log_line(int level, const char *fmt, va_list ap, uint64_t held,
                     uint64_t interval_ms)
{
    static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    char line[1024];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    localtime_r(&tv.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02d %02d:%02d:%02d.%03d gdrkv %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, (int)(tv.tv_usec / 1000), names[level]);
    if (n > 0 && (size_t)n < sizeof line)
        n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    if (held && n > 0 && (size_t)n < sizeof line)
        snprintf(line + n, sizeof line - (size_t)n,
                 " (%llu more like this in the last %llu ms, not logged)",
                 (unsigned long long)held, (unsigned long long)interval_ms);
    fprintf(stderr, "%s\n", line);
}

void gk_log(int level, const char *fmt, ...)
{
    if (!gk_log_enabled(level)) return;
    va_list ap;
    va_start(ap, fmt);
    log_line(level, fmt, ap, 0, 0);
    va_end(ap);
}

void gk_log_rated(struct gk_log_rate *r, int level, const char *fmt, ...)
{
    if (!gk_log_enabled(level)) return;
    uint64_t now = gk_now_ns();
    uint64_t next = __atomic_load_n(&r->next_ns, __ATOMIC_RELAXED);
    /* One caller wins the interval's line; the others count themselves. */
    if (now < next || !__atomic_compare_exchange_n(&r->next_ns, &next,
                                                   now + r->interval_ms * 1000000ull, 0,
                                                   __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        __atomic_add_fetch(&r->held, 1, __ATOMIC_RELAXED);
        return;
    }
    uint64_t held = __atomic_exchange_n(&r->held, 0, __ATOMIC_RELAXED);
    va_list ap;
    va_start(ap, fmt);
    log_line(level, fmt, ap, held, r->interval_ms);
    va_end(ap);
}
