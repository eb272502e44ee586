/*
 * copy.h - memcpy of a list of (destination, source) pieces, run by the
 * calling thread alone when small, or shared with a few helper threads
 * when a list carries enough bytes for one core's memory bandwidth to be
 * the limit: the client's shm copies out of the pool, the server's copies
 * of staged PUT values into it.
 *
 * Several threads may copy through one copier at once (the server's
 * workers do): each list is cut into byte ranges that its own thread and
 * any idle helper take in turn, so a helper never waits for a list that
 * is still being taken apart by others.
 */
#ifndef GDRKV_COPY_H
#define GDRKV_COPY_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define GK_COPY_HELPERS_MAX 8

struct gk_copy_piece {
    uint8_t *dst;
    const uint8_t *src;
    size_t len;
};

/* A growable list of pieces, reused from frame to frame by its owner. */
struct gk_copy_list {
    struct gk_copy_piece *pieces;
    uint32_t count, cap;
    uint64_t bytes;
    /* Set by the planner when the destinations are the pool, which other
     * processes read later, not this core soon: the copies then store past
     * the cache, sparing memory the read of every destination line that a
     * cached store makes first. Reset clears it. */
    int streamed;
    /* Set when the sources are a buffer that a device writes again soon (a
     * connection's staging, which a GPU's copy engines fill frame after
     * frame): each source line read is demoted from this core's caches to
     * the shared last level. A DMA write to a line still in a core's cache
     * waits for the snoop that takes it away, which halved a copy engine's
     * rate into staging (docs/transports.md, "PUT: staging, then the
     * server's copy"). A hint: a no-op where the CPU lacks it. Reset clears
     * it. */
    int demote_sources;
};

/* Appends a piece; 0, or -1 when out of memory. */
int gk_copy_add(struct gk_copy_list *l, uint8_t *dst, const uint8_t *src, size_t len);
/* Empties the list, freeing it when it grew large, so idle connections
 * stay small. */
void gk_copy_reset(struct gk_copy_list *l);
void gk_copy_free(struct gk_copy_list *l);

struct gk_copy_job;

/* The helpers, started on the first large copy. */
struct gk_copier {
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    pthread_t threads[GK_COPY_HELPERS_MAX];
    int max_helpers;        /* at most this many, and one fewer than the CPUs */
    uint64_t parallel_bytes;    /* lists below this are copied by their thread alone */
    int nthreads;           /* running helpers */
    int started;            /* tried to start them */
    int stop;
    struct gk_copy_job *jobs;   /* lists with ranges nobody took yet */
};

/* 0, or -1 when the lock or conditions can't be made. */
int gk_copier_init(struct gk_copier *c, int max_helpers, uint64_t parallel_bytes);
void gk_copier_destroy(struct gk_copier *c);
/* Runs every copy of l; returns when all bytes are in place. */
void gk_copy_run(struct gk_copier *c, const struct gk_copy_list *l);

/* Copying behind a writer in another process (a staged PUT the server
 * follows, docs/transports.md). The writer's list has its destinations in
 * one buffer, one after another from base on; it copies them in order and
 * tells how far it got through a word in shared memory, every
 * publish_bytes (publish_bytes > 0) and at the end: the count of bytes in
 * place from base on. */
void gk_copy_publish(uint64_t *word, uint64_t bytes);
void gk_copy_run_published(const struct gk_copy_list *l, const uint8_t *base, uint64_t *word,
                           uint64_t publish_bytes);
/* The follower's list has its sources in that buffer (from base on, in
 * increasing order); each piece is copied once the word covers it. While
 * it does not, wait(arg, have, need) is called with the word's value and
 * the one needed: nonzero stops the copy there, and -1 is returned. 0 once
 * every piece is copied. */
int gk_copy_follow(const struct gk_copy_list *l, const uint8_t *base, const uint64_t *word,
                   int (*wait)(void *arg, uint64_t have, uint64_t need), void *arg);

#endif
