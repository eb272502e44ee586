/*
 * check.h - the smallest harness that does the job for the native unit
 * tests: CHECK() and CHECK_EQ() say where and why and exit 1 at the first
 * failure (so later checks never run on a broken state), RUN() runs one test
 * function, check_done() prints the "N passed, 0 failed" closing line.
 */
#ifndef GDRKV_TEST_CHECK_H
#define GDRKV_TEST_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                         \
            fputc('\n', stderr);                                                  \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

#define CHECK_EQ(actual, expected)                                                \
    do {                                                                          \
        long long actual_ = (long long)(actual), expected_ = (long long)(expected); \
        if (actual_ != expected_) {                                               \
            fprintf(stderr, "%s:%d: %s is %lld, expected %s = %lld\n", __FILE__,  \
                    __LINE__, #actual, actual_, #expected, expected_);            \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

static int check_passed;

#define RUN(test)                             \
    do {                                      \
        test();                               \
        check_passed++;                       \
        printf("ok %s\n", #test);             \
        fflush(stdout);                       \
    } while (0)

static inline int check_done(const char *suite)
{
    printf("%s: %d passed, 0 failed\n", suite, check_passed);
    return 0;
}

/* xorshift64*: a fixed seed gives the same run everywhere. */
static inline uint64_t check_rand(uint64_t *state)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return *state * 0x2545f4914f6cdd1dull;
}

#endif
