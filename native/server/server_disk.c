/*
 * server_disk.c - see server_disk.h.
 */
#include "server_disk.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>

#include "common/common.h"
#include "common/grow.h"
#include "common/log.h"
#include "server_state.h"
#include "store/store.h"

/* Threads reading keys back from disk: a few, so a slow key does not hold
 * every other reader up, and I/O queues stay shallow. */
#define SERVER_DISK_THREADS 4

/* A parked frame's keys: everything copied out of the connection. */
struct disk_job {
    struct disk_job *next;
    struct server_worker *worker;
    uint64_t serial;            /* the connection's */
    struct gk_ns ns;            /* points after the entries */
    uint32_t n;
    struct gk_entry entries[];  /* then the namespace and key bytes they point to */
};

struct server_disk {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    struct disk_job *head, *tail;
    int stopping;
    int nthreads;
    pthread_t threads[SERVER_DISK_THREADS];
};

static struct disk_job *job_new(struct server_conn *c)
{
    const struct server_batch *b = &c->batch;
    uint32_t n = c->req.count;
    size_t bytes = c->ns.len;
    for (uint32_t i = 0; i < n; i++)
        bytes += b->entries[i].key_len;
    struct disk_job *j = malloc(sizeof *j + n * sizeof *j->entries + bytes);
    if (!j)
        return NULL;
    j->next = NULL;
    j->worker = c->worker;
    j->serial = c->serial;
    j->n = n;
    uint8_t *p = (uint8_t *)(j->entries + n);
    memcpy(p, c->ns.name, c->ns.len);
    j->ns = (struct gk_ns){.name = p, .len = c->ns.len};
    p += c->ns.len;
    for (uint32_t i = 0; i < n; i++) {
        j->entries[i] = b->entries[i];
        memcpy(p, b->entries[i].key, b->entries[i].key_len);
        j->entries[i].key = p;
        p += b->entries[i].key_len;
    }
    return j;
}

/* Tells the job's worker that its connection may run the frame again. */
static void job_done(struct disk_job *j)
{
    struct server_worker *w = j->worker;
    pthread_mutex_lock(&w->disk_lock);
    if (gk_grow(&w->disk_done, &w->disk_done_cap, w->ndisk_done + 1, sizeof *w->disk_done,
                16) == 0)
        w->disk_done[w->ndisk_done++] = j->serial;
    pthread_mutex_unlock(&w->disk_lock);
    /* Out of memory: the connection's request deadline closes it. */
    eventfd_write(w->disk_fd, 1);
}

static void *disk_thread(void *arg)
{
    struct gdrkv_server *s = arg;
    struct server_disk *d = s->disk;
    pthread_mutex_lock(&d->lock);
    for (;;) {
        while (!d->head && !d->stopping)
            pthread_cond_wait(&d->wake, &d->lock);
        if (d->stopping)
            break;
        struct disk_job *j = d->head;
        d->head = j->next;
        if (!d->head)
            d->tail = NULL;
        pthread_mutex_unlock(&d->lock);
        store_promote_batch(s->store, &j->ns, j->entries, j->n);
        job_done(j);
        free(j);
        pthread_mutex_lock(&d->lock);
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

int server_disk_start(struct gdrkv_server *s)
{
    if (!store_has_disk(s->store))
        return 0;
    struct server_disk *d = calloc(1, sizeof *d);
    if (!d)
        return -1;
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->wake, NULL);
    s->disk = d;
    while (d->nthreads < SERVER_DISK_THREADS &&
           pthread_create(&d->threads[d->nthreads], NULL, disk_thread, s) == 0)
        d->nthreads++;
    return d->nthreads ? 0 : -1;
}

void server_disk_stop(struct gdrkv_server *s)
{
    struct server_disk *d = s->disk;
    if (!d)
        return;
    pthread_mutex_lock(&d->lock);
    d->stopping = 1;
    pthread_cond_broadcast(&d->wake);
    pthread_mutex_unlock(&d->lock);
    for (int i = 0; i < d->nthreads; i++)
        pthread_join(d->threads[i], NULL);
    while (d->head) {
        struct disk_job *j = d->head;
        d->head = j->next;
        free(j);
    }
    pthread_cond_destroy(&d->wake);
    pthread_mutex_destroy(&d->lock);
    free(d);
    s->disk = NULL;
}

int server_disk_park(struct server_conn *c)
{
    struct gdrkv_server *s = c->worker->server;
    struct server_disk *d = s->disk;
    if (!d || c->disk_done ||
        !store_on_disk_any(s->store, &c->ns, c->batch.entries, c->req.count))
        return 0;
    struct disk_job *j = job_new(c);
    if (!j)
        return 0;               /* out of memory: the keys are misses */
    pthread_mutex_lock(&d->lock);
    if (d->tail)
        d->tail->next = j;
    else
        d->head = j;
    d->tail = j;
    pthread_cond_signal(&d->wake);
    pthread_mutex_unlock(&d->lock);
    gk_counter_add(&c->worker->counters.frames_waited_for_disk, 1);
    return 1;
}
