/*
 * test_copy.c - common/copy.c: lists of pieces copied byte-exact by their
 * thread alone and with helpers, several threads through one copier at
 * once (as the server's workers copy staged PUTs), and nothing written
 * outside the pieces' destinations; every round at random either with
 * cached stores or streamed past the cache (pieces at any alignment), and
 * with or without the sources' lines demoted as they are read.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
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

int main(void)
{
    RUN(test_alone_below_the_threshold);
    RUN(test_one_thread_with_helpers);
    RUN(test_threads_share_the_helpers);
    RUN(test_no_helpers_copies_alone);
    return check_done("test_copy");
}
