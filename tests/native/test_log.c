/*
 * test_log.c - common/log.c's rate limit (gk_log_rated): the first call of
 * a message logs, the calls within its interval only count, and the next
 * line after the interval says how many it held back; a level below
 * GDRKV_LOG logs nothing and counts nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "common/log.h"

/* Runs fn with stderr going to a file; returns what it wrote. */
static char *captured(void (*fn)(struct gk_log_rate *), struct gk_log_rate *r)
{
    static char text[4096];
    FILE *f = tmpfile();
    CHECK(f != NULL, "tmpfile");
    fflush(stderr);
    int saved = dup(2);
    dup2(fileno(f), 2);
    fn(r);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    return text;
}

static int lines(const char *text)
{
    int n = 0;
    for (; *text; text++)
        n += *text == '\n';
    return n;
}

static void burst(struct gk_log_rate *r)
{
    for (int i = 0; i < 5; i++)
        gk_log_rated(r, GK_LOG_WARN, "disk: write %d failed", i);
}

/* One interval (and a little) later. */
static void after_interval(struct gk_log_rate *r)
{
    struct timespec t = {0, (long)(r->interval_ms + 20) * 1000000l};
    nanosleep(&t, NULL);
    gk_log_rated(r, GK_LOG_WARN, "disk: write %d failed", 5);
}

static void quiet(struct gk_log_rate *r)
{
    for (int i = 0; i < 3; i++)
        gk_log_rated(r, GK_LOG_DEBUG, "not shown");
}

static void test_one_line_per_interval_with_counts(void)
{
    struct gk_log_rate r = GK_LOG_RATE(200);
    char *text = captured(burst, &r);
    CHECK_EQ(lines(text), 1);
    CHECK(strstr(text, "disk: write 0 failed\n") != NULL, "first line: %s", text);
    text = captured(after_interval, &r);
    CHECK_EQ(lines(text), 1);
    CHECK(strstr(text, "disk: write 5 failed (4 more like this in the last 200 ms, not "
                       "logged)") != NULL, "second line: %s", text);
    CHECK_EQ(r.held, 0);
}

static void test_levels_below_the_log_level_count_nothing(void)
{
    struct gk_log_rate r = GK_LOG_RATE(200);
    CHECK_EQ(lines(captured(quiet, &r)), 0);
    CHECK_EQ(r.held, 0);
}

int main(void)
{
    setenv("GDRKV_LOG", "warn", 1);
    RUN(test_one_line_per_interval_with_counts);
    RUN(test_levels_below_the_log_level_count_nothing);
    return check_done("test_log");
}
