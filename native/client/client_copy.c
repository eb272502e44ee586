/*
 * client_copy.c - see client_copy.h.
 *
 * A job is cut into byte ranges of equal size, not into pieces, so a batch
 * of one huge object spreads as well as a batch of many small ones. The
 * calling thread takes the first range itself: helpers only add to it.
 */
#include "client_copy.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "common/grow.h"

/* Below this many bytes a copy is over before a helper would wake up. */
#define CLIENT_COPY_PARALLEL_BYTES (4u << 20)
/* Pieces a list keeps room for between frames. */
#define CLIENT_COPY_KEEP_PIECES 4096

int client_copy_add(struct client_copy_list *l, uint8_t *dst, const uint8_t *src, size_t len)
{
    if (gk_grow(&l->pieces, &l->cap, (size_t)l->count + 1, sizeof *l->pieces, 64) < 0)
        return -1;
    l->pieces[l->count++] = (struct client_copy_piece){dst, src, len};
    l->bytes += len;
    return 0;
}

void client_copy_reset(struct client_copy_list *l)
{
    if (l->cap > CLIENT_COPY_KEEP_PIECES)
        client_copy_free(l);
    l->count = 0;
    l->bytes = 0;
}

void client_copy_free(struct client_copy_list *l)
{
    free(l->pieces);
    *l = (struct client_copy_list){0};
}

/* Copies bytes [from, to) of the list's concatenated pieces. */
static void copy_range(const struct client_copy_list *l, uint64_t from, uint64_t to)
{
    uint64_t at = 0;
    for (uint32_t i = 0; i < l->count && at < to; i++) {
        const struct client_copy_piece *p = &l->pieces[i];
        uint64_t start = GK_MAX(at, from), end = GK_MIN(at + p->len, to);
        if (start < end)
            memcpy(p->dst + (start - at), p->src + (start - at), (size_t)(end - start));
        at += p->len;
    }
}

static void copy_share(const struct client_copy_list *l, int share, int shares)
{
    copy_range(l, l->bytes * (uint64_t)share / (uint64_t)shares,
               l->bytes * (uint64_t)(share + 1) / (uint64_t)shares);
}

static void *helper_main(void *arg)
{
    struct client_copier *c = arg;
    uint64_t seen = 0;

    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!c->stop && (c->job == seen || c->next_share == c->shares))
            pthread_cond_wait(&c->wake, &c->lock);
        if (c->stop)
            break;
        seen = c->job;
        int share = c->next_share++;
        c->running++;
        pthread_mutex_unlock(&c->lock);
        copy_share(c->list, share, c->shares);
        pthread_mutex_lock(&c->lock);
        if (--c->running == 0)
            pthread_cond_signal(&c->done);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

int client_copier_init(struct client_copier *c)
{
    memset(c, 0, sizeof *c);
    if (pthread_mutex_init(&c->lock, NULL))
        return -1;
    if (pthread_cond_init(&c->wake, NULL)) {
        pthread_mutex_destroy(&c->lock);
        return -1;
    }
    if (pthread_cond_init(&c->done, NULL)) {
        pthread_cond_destroy(&c->wake);
        pthread_mutex_destroy(&c->lock);
        return -1;
    }
    return 0;
}

void client_copier_destroy(struct client_copier *c)
{
    pthread_mutex_lock(&c->lock);
    c->stop = 1;
    pthread_cond_broadcast(&c->wake);
    pthread_mutex_unlock(&c->lock);
    for (int i = 0; i < c->nthreads; i++)
        pthread_join(c->threads[i], NULL);
    pthread_cond_destroy(&c->done);
    pthread_cond_destroy(&c->wake);
    pthread_mutex_destroy(&c->lock);
}

/* One helper per further CPU, up to the maximum; none on one CPU. */
static void start_helpers(struct client_copier *c)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int want = (int)GK_MIN(GK_MAX(cpus - 1, 0L), (long)CLIENT_COPY_HELPERS_MAX);

    c->started = 1;
    while (c->nthreads < want &&
           pthread_create(&c->threads[c->nthreads], NULL, helper_main, c) == 0)
        c->nthreads++;
}

/* Takes the helpers for one job; 0 when they are busy or there are none. */
static int take_helpers(struct client_copier *c, const struct client_copy_list *l)
{
    int taken = 0;

    pthread_mutex_lock(&c->lock);
    if (!c->started)
        start_helpers(c);
    if (!c->busy && c->nthreads > 0) {
        c->busy = taken = 1;
        c->list = l;
        c->shares = c->nthreads + 1;
        c->next_share = 1;     /* share 0 is the caller's */
        c->job++;
        pthread_cond_broadcast(&c->wake);
    }
    pthread_mutex_unlock(&c->lock);
    return taken;
}

void client_copy_run(struct client_copier *c, const struct client_copy_list *l)
{
    if (l->bytes < CLIENT_COPY_PARALLEL_BYTES || !take_helpers(c, l)) {
        copy_range(l, 0, l->bytes);
        return;
    }
    copy_share(l, 0, c->shares);
    pthread_mutex_lock(&c->lock);
    /* Shares no helper took yet (all still asleep) are the caller's too. */
    while (c->next_share < c->shares) {
        int share = c->next_share++;
        pthread_mutex_unlock(&c->lock);
        copy_share(l, share, c->shares);
        pthread_mutex_lock(&c->lock);
    }
    while (c->running > 0)
        pthread_cond_wait(&c->done, &c->lock);
    c->busy = 0;
    c->list = NULL;
    pthread_mutex_unlock(&c->lock);
}
