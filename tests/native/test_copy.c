/*
 * test_copy.c - common/copy.c: lists of pieces copied byte-exact by their
 * thread alone and with helpers, several threads through one copier at
 * once (as the server's workers copy staged PUTs), and nothing written
 * outside the pieces' destinations; every round at random either with
 * cached stores or streamed past the cache (pieces at any alignment), and
 * with or without the sources' lines demoted as they are read; and a
 * copy that follows another thread's, published through a word, as the
 * server follows a client's staged PUT, which stops where the word stops.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/common.h"
#include "common/copy.h"

#define AREA (4u << 20)
#define THREADS 4
#define ROUNDS 40

struct worker {
    struct gk_copier *copier;
    unsigned seed;
    uint8_t *src, *dst, *want;
};

/* One list of random pieces from src into dst at random places (pieces
 * never overlap), mirrored into want; every other byte of dst stays 0xEE. */
static void one_round(struct worker *w, struct gk_copy_list *l)
{
    memset(w->dst, 0xEE, AREA);
    memset(w->want, 0xEE, AREA);
    for (uint32_t i = 0; i < AREA; i++)
        w->src[i] = (uint8_t)rand_r(&w->seed);
    uint64_t at = 0, budget = (uint64_t)(rand_r(&w->seed) % 3) << 20;   /* 0, 1 or 2 MiB */
    while (at < AREA) {
        size_t len = (size_t)(rand_r(&w->seed) % (300u << 10)) + 1;
        uint64_t gap = (uint64_t)(rand_r(&w->seed) % 4096);
        if (at + gap + len > AREA || l->bytes + len > budget + (64u << 10))
            break;
        size_t from = (size_t)(rand_r(&w->seed) % (AREA - len));
        CHECK_EQ(gk_copy_add(l, w->dst + at + gap, w->src + from, len), 0);
        memcpy(w->want + at + gap, w->src + from, len);
        at += gap + len;
    }
    l->streamed = rand_r(&w->seed) & 1;
    l->demote_sources = rand_r(&w->seed) & 1;
    gk_copy_run(w->copier, l);
    CHECK(memcmp(w->dst, w->want, AREA) == 0,
          "a list of %u pieces (%llu bytes, streamed %d, sources demoted %d) copied wrong",
          l->count, (unsigned long long)l->bytes, l->streamed, l->demote_sources);
    gk_copy_reset(l);
    CHECK_EQ(l->streamed, 0);
    CHECK_EQ(l->demote_sources, 0);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct gk_copy_list l = {0};
    for (int r = 0; r < ROUNDS; r++)
        one_round(w, &l);
    gk_copy_free(&l);
    return NULL;
}

static void run_workers(struct gk_copier *copier, int nthreads)
{
    struct worker w[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < nthreads; i++) {
        w[i] = (struct worker){copier, 1234u + (unsigned)i, malloc(AREA), malloc(AREA),
                               malloc(AREA)};
        CHECK(w[i].src && w[i].dst && w[i].want, "out of memory");
        CHECK_EQ(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < nthreads; i++) {
        pthread_join(t[i], NULL);
        free(w[i].src);
        free(w[i].dst);
        free(w[i].want);
    }
}

static void test_alone_below_the_threshold(void)
{
    struct gk_copier c;
    CHECK_EQ(gk_copier_init(&c, 4, UINT64_MAX), 0);
    run_workers(&c, 1);
    CHECK_EQ(c.nthreads, 0);        /* never needed: never started */
    gk_copier_destroy(&c);
}

static void test_one_thread_with_helpers(void)
{
    struct gk_copier c;
    CHECK_EQ(gk_copier_init(&c, 4, 128u << 10), 0);
    run_workers(&c, 1);
    gk_copier_destroy(&c);
}

static void test_threads_share_the_helpers(void)
{
    struct gk_copier c;
    CHECK_EQ(gk_copier_init(&c, 3, 128u << 10), 0);
    run_workers(&c, THREADS);
    gk_copier_destroy(&c);
}

static void test_no_helpers_copies_alone(void)
{
    struct gk_copier c;
    CHECK_EQ(gk_copier_init(&c, 0, 0), 0);
    run_workers(&c, 2);
    CHECK_EQ(c.nthreads, 0);
    gk_copier_destroy(&c);
}

/* ------------------------------------------------------------ following */

#define STAGING (1u << 20)

struct writer {
    const uint8_t *values;
    uint8_t *staging;
    uint64_t word;
    uint64_t stop_at;       /* the writer stops publishing here (a stalled client) */
    unsigned seed;
};

/* The client's side: the values into staging in pieces of random sizes
 * (some far above the 32 KiB it publishes at, which it cuts), up to
 * stop_at. */
static void *writer_main(void *arg)
{
    struct writer *w = arg;
    struct gk_copy_list l = {0};
    uint64_t at = 0;
    while (at < w->stop_at) {
        unsigned most = rand_r(&w->seed) % 8 ? 9000 : 100000;
        size_t len = (size_t)(rand_r(&w->seed) % most) + 1;
        len = GK_MIN(len, (size_t)(w->stop_at - at));
        CHECK_EQ(gk_copy_add(&l, w->staging + at, w->values + at, len), 0);
        at += len;
    }
    gk_copy_run_published(&l, w->staging, &w->word, 32u << 10);
    gk_copy_free(&l);
    return NULL;
}

struct waits {
    uint64_t calls;
    uint64_t give_up_below;     /* need the word never reaches: stop */
};

static int count_wait(void *arg, uint64_t have, uint64_t need)
{
    struct waits *w = arg;
    w->calls++;
    CHECK(have < need, "waited for a word that covers the piece");
    return need > w->give_up_below;
}

/* The server's side: staging's values into dst in pieces of random sizes
 * with gaps (objects already stored are skipped), behind the writer. */
static int follow_round(unsigned seed, uint64_t stop_at, struct waits *waits)
{
    uint8_t *values = malloc(STAGING), *staging = malloc(STAGING), *dst = malloc(STAGING);
    CHECK(values && staging && dst, "out of memory");
    for (uint32_t i = 0; i < STAGING; i++)
        values[i] = (uint8_t)rand_r(&seed);
    memset(staging, 0xAA, STAGING);
    memset(dst, 0xEE, STAGING);
    struct writer w = {values, staging, 0, stop_at, seed};
    struct gk_copy_list l = {0};
    uint64_t at = 0;
    while (at < STAGING) {
        uint64_t len = (uint64_t)(rand_r(&seed) % 20000) + 1;
        len = GK_MIN(len, STAGING - at);
        if (rand_r(&seed) % 4)
            CHECK_EQ(gk_copy_add(&l, dst + at, staging + at, (size_t)len), 0);
        at += len;
    }
    l.streamed = rand_r(&seed) & 1;
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, writer_main, &w), 0);
    int rc = gk_copy_follow(&l, staging, &w.word, count_wait, waits);
    pthread_join(t, NULL);
    /* Copied: every piece the word covered before the stop, each whole;
     * nothing else. */
    for (uint32_t i = 0; i < l.count; i++) {
        uint64_t off = (uint64_t)(l.pieces[i].src - staging), len = l.pieces[i].len;
        int copied = rc == 0 || off + len <= stop_at;
        for (uint64_t b = off; b < off + len; b++)
            CHECK(dst[b] == (copied ? values[b] : 0xEE),
                  "byte %llu of a piece at %llu (%llu bytes): copied %d, stop at %llu",
                  (unsigned long long)b, (unsigned long long)off, (unsigned long long)len,
                  copied, (unsigned long long)stop_at);
    }
    gk_copy_free(&l);
    free(values);
    free(staging);
    free(dst);
    return rc;
}

static void test_a_follower_copies_behind_the_writer(void)
{
    for (unsigned r = 0; r < 8; r++) {
        struct waits waits = {0, UINT64_MAX};
        CHECK_EQ(follow_round(77u + r, STAGING, &waits), 0);
    }
}

static void test_a_follower_stops_where_the_writer_stalls(void)
{
    for (unsigned r = 0; r < 8; r++) {
        uint64_t stop_at = (uint64_t)(r + 1) * (STAGING / 10) + r * 777;
        struct waits waits = {0, stop_at};
        CHECK_EQ(follow_round(99u + r, stop_at, &waits), -1);
        CHECK(waits.calls > 0, "stopped without waiting");
    }
}

int main(void)
{
    RUN(test_alone_below_the_threshold);
    RUN(test_one_thread_with_helpers);
    RUN(test_threads_share_the_helpers);
    RUN(test_no_helpers_copies_alone);
    RUN(test_a_follower_copies_behind_the_writer);
    RUN(test_a_follower_stops_where_the_writer_stalls);
    return check_done("test_copy");
}
