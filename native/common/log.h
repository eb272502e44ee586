/*
 * log.h - leveled logging to stderr. The level comes from GDRKV_LOG
 * (error, warn, info, debug; default warn) and is read once.
 */
#ifndef GDRKV_LOG_H
#define GDRKV_LOG_H

#include <stdint.h>

enum gk_log_level { GK_LOG_ERROR = 0, GK_LOG_WARN = 1, GK_LOG_INFO = 2, GK_LOG_DEBUG = 3 };

int gk_log_enabled(int level);
void gk_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * A rate limit for one recurring message (a failing disk, say): the first
 * call logs, then at most one line per interval, which says how many were
 * held back since the line before. Any thread may call; the struct is the
 * message's own, zeroed but for interval_ms (GK_LOG_RATE(ms)).
 */
struct gk_log_rate {
    uint64_t interval_ms;
    uint64_t next_ns;           /* atomic: no line before then */
    uint64_t held;              /* atomic: calls held back since the last line */
};
#define GK_LOG_RATE(ms) {.interval_ms = (ms)}

void gk_log_rated(struct gk_log_rate *r, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define GK_ERROR(...) gk_log(GK_LOG_ERROR, __VA_ARGS__)
#define GK_WARN(...) gk_log(GK_LOG_WARN, __VA_ARGS__)
#define GK_INFO(...) gk_log(GK_LOG_INFO, __VA_ARGS__)
#define GK_DEBUG(...) do { if (gk_log_enabled(GK_LOG_DEBUG)) gk_log(GK_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif
