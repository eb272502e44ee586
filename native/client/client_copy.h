/*
 * client_copy.h - the copies of the shm transport: a list of (pool source,
 * caller destination) pieces, run by the calling thread alone when small,
 * or shared with a few helper threads of the client when a frame carries
 * enough bytes for one core's memory bandwidth to be the limit.
 */
#ifndef GDRKV_CLIENT_COPY_H
#define GDRKV_CLIENT_COPY_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define CLIENT_COPY_HELPERS_MAX 3

struct client_copy_piece {
    uint8_t *dst;
    const uint8_t *src;
    size_t len;
};

/* A growable list of pieces, reused from frame to frame by its owner. */
struct client_copy_list {
    struct client_copy_piece *pieces;
    uint32_t count, cap;
    uint64_t bytes;
};

/* Appends a piece; 0, or -1 when out of memory. */
int client_copy_add(struct client_copy_list *l, uint8_t *dst, const uint8_t *src, size_t len);
/* Empties the list, freeing it when it grew large, so the idle connections
 * a client keeps stay small. */
void client_copy_reset(struct client_copy_list *l);
void client_copy_free(struct client_copy_list *l);

/* The helpers, started on the first large copy. One copy uses them at a
 * time; a thread that finds them busy copies alone rather than wait. */
struct client_copier {
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    pthread_t threads[CLIENT_COPY_HELPERS_MAX];
    int nthreads;           /* running helpers */
    int started;            /* tried to start them */
    int busy;               /* a copy owns the helpers */
    int stop;
    uint64_t job;           /* generation: a helper runs each job once */
    const struct client_copy_list *list;
    int shares;             /* the job split in this many byte ranges */
    int next_share;         /* ranges handed out so far */
    int running;            /* helpers still copying a range */
};

int client_copier_init(struct client_copier *c);
void client_copier_destroy(struct client_copier *c);
/* Runs every copy of l; returns when all bytes are in place. */
void client_copy_run(struct client_copier *c, const struct client_copy_list *l);

#endif
