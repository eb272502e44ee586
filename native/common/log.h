/*
 * log.h - leveled logging to stderr. The level comes from GDRKV_LOG
 * (error, warn, info, debug; default warn) and is read once.
 */
#ifndef GDRKV_LOG_H
#define GDRKV_LOG_H

enum gk_log_level { GK_LOG_ERROR = 0, GK_LOG_WARN = 1, GK_LOG_INFO = 2, GK_LOG_DEBUG = 3 };

int gk_log_enabled(int level);
void gk_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define GK_ERROR(...) gk_log(GK_LOG_ERROR, __VA_ARGS__)
#define GK_WARN(...) gk_log(GK_LOG_WARN, __VA_ARGS__)
#define GK_INFO(...) gk_log(GK_LOG_INFO, __VA_ARGS__)
#define GK_DEBUG(...) do { if (gk_log_enabled(GK_LOG_DEBUG)) gk_log(GK_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif
