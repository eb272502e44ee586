/*
 * log.c - see log.h. One fprintf per line so lines from several threads do
 * not interleave.
 */
#include "log.h"

#include <stdarg.h>
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

void gk_log(int level, const char *fmt, ...)
{
    static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    if (!gk_log_enabled(level)) return;

    char line[1024];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    localtime_r(&tv.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02d %02d:%02d:%02d.%03d gdrkv %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, (int)(tv.tv_usec / 1000), names[level]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
