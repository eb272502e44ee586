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

/* A parked frame: its keys are read side by side (a disk serves several
 * reads at once far faster than one after the other): all in one job
 * where the store reads through io_uring, else split over up to
 * SERVER_DISK_THREADS jobs; the last job to finish hands the frame, with
 * the pins its jobs hold, to the worker. */
struct disk_frame {
    uint32_t jobs_left;         /* atomic */
    uint32_t njobs;
    struct server_worker *worker;
    uint64_t serial;            /* the connection's */
    struct disk_job *jobs[SERVER_DISK_THREADS];
    uint32_t n;                 /* the frame's keys */
    struct store_obj *held[];   /* n: the keys that were in the pool at the start */
};

/* Part of a parked frame's keys: everything copied out of the connection,
 * and the objects store_promote_batch pinned for them. */
struct disk_job {
    struct disk_job *next;
    struct disk_frame *frame;
    struct gk_ns ns;            /* points after the entries */
    uint32_t n;
    struct store_obj **held;    /* n, after the entries */
    struct gk_entry entries[];  /* then held, then the namespace and key bytes */
};

struct server_disk {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    struct disk_job *head, *tail;
    int stopping;
    int nthreads;
    pthread_t threads[SERVER_DISK_THREADS];
};

/* The job of keys [first, first + n) of c's frame. */
static struct disk_job *job_new(struct server_conn *c, struct disk_frame *frame, uint32_t first,
                                uint32_t n)
{
    const struct gk_entry *e = c->batch.entries + first;
    size_t bytes = c->ns.len;
    for (uint32_t i = 0; i < n; i++)
        bytes += e[i].key_len;
    struct disk_job *j = malloc(sizeof *j + n * (sizeof *j->entries + sizeof *j->held) + bytes);
    if (!j)
        return NULL;
    j->next = NULL;
    j->frame = frame;
    j->n = n;
    j->held = (struct store_obj **)(j->entries + n);
    memset(j->held, 0, n * sizeof *j->held);
    uint8_t *p = (uint8_t *)(j->held + n);
    memcpy(p, c->ns.name, c->ns.len);
    j->ns = (struct gk_ns){.name = p, .len = c->ns.len};
    p += c->ns.len;
    for (uint32_t i = 0; i < n; i++) {
        j->entries[i] = e[i];
        memcpy(p, e[i].key, e[i].key_len);
        j->entries[i].key = p;
        p += e[i].key_len;
    }
    return j;
}

void server_disk_release(struct disk_frame *f)
{
    if (!f)
        return;
    struct store *store = f->worker->server->store;
    store_unpin_batch(store, f->held, f->n);
    for (uint32_t k = 0; k < f->njobs; k++) {
        if (f->jobs[k])
            store_unpin_batch(store, f->jobs[k]->held, f->jobs[k]->n);
        free(f->jobs[k]);
    }
    free(f);
}

uint64_t server_disk_serial(const struct disk_frame *f) { return f->serial; }

/* Hands the frame to its worker, whose connection may run it again. */
static void frame_done(struct disk_frame *f)
{
    struct server_worker *w = f->worker;
    int posted = 0;
    pthread_mutex_lock(&w->disk_lock);
    if (gk_grow(&w->disk_done, &w->disk_done_cap, w->ndisk_done + 1, sizeof *w->disk_done,
                16) == 0) {
        w->disk_done[w->ndisk_done++] = f;
        posted = 1;
    }
    pthread_mutex_unlock(&w->disk_lock);
    /* Out of memory: the connection's stall timeout closes it. */
    if (!posted)
        server_disk_release(f);
    eventfd_write(w->disk_fd, 1);
}

static void job_finished(struct disk_job *j)
{
    if (__atomic_sub_fetch(&j->frame->jobs_left, 1, __ATOMIC_ACQ_REL) == 0)
        frame_done(j->frame);
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
        store_promote_batch(s->store, &j->ns, j->entries, j->n, j->held);
        job_finished(j);
        pthread_mutex_lock(&d->lock);
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

/* The store's room hook: the demoter wrote objects to disk, which writers
 * waiting for room (CONN_WAIT_ROOM) may now evict. Each worker looks at its
 * own (server_worker.c take_disk_done). */
static void wake_writers(void *arg)
{
    struct gdrkv_server *s = arg;
    for (int i = 0; i < s->nworkers; i++)
        eventfd_write(s->workers[i].disk_fd, 1);
}

int server_disk_start(struct gdrkv_server *s)
{
    if (!store_has_disk(s->store))
        return 0;
    store_set_room_hook(s->store, wake_writers, s);
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
    /* The workers' eventfds go next. */
    store_set_room_hook(s->store, NULL, NULL);
    pthread_mutex_lock(&d->lock);
    d->stopping = 1;
    pthread_cond_broadcast(&d->wake);
    pthread_mutex_unlock(&d->lock);
    for (int i = 0; i < d->nthreads; i++)
        pthread_join(d->threads[i], NULL);
    while (d->head) {
        struct disk_job *j = d->head;
        d->head = j->next;
        if (__atomic_sub_fetch(&j->frame->jobs_left, 1, __ATOMIC_ACQ_REL) == 0)
            server_disk_release(j->frame);
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
    uint32_t n = c->req.count;
    if (!d || c->disk_frame)
        return 0;
    struct disk_frame *frame = calloc(1, sizeof *frame + n * sizeof *frame->held);
    if (!frame)
        return 0;               /* out of memory: the keys are misses */
    *frame = (struct disk_frame){.worker = c->worker, .serial = c->serial, .n = n};
    /* Whatever is in the pool stays there until the frame has run, disk or
     * not: between this look and the frame's own pins, the demoter or
     * another reader's promotions would otherwise be free to evict it. */
    if (!store_hold_batch(s->store, &c->ns, c->batch.entries, n, frame->held)) {
        c->disk_frame = frame;
        return 0;
    }
    /* With io_uring one thread keeps a frame's reads in flight together;
     * with preads, the frame's keys are spread over the threads. */
    uint32_t njobs = store_disk_reads_overlap(s->store) ? 1 : GK_MIN((uint32_t)d->nthreads, n);
    uint32_t per_job = (n + njobs - 1) / njobs;
    njobs = (n + per_job - 1) / per_job;
    frame->jobs_left = frame->njobs = njobs;
    for (uint32_t k = 0; k < njobs; k++) {
        frame->jobs[k] = job_new(c, frame, k * per_job, GK_MIN(per_job, n - k * per_job));
        if (!frame->jobs[k]) {
            server_disk_release(frame);
            return 0;
        }
    }
    pthread_mutex_lock(&d->lock);
    for (uint32_t k = 0; k < njobs; k++) {
        if (d->tail)
            d->tail->next = frame->jobs[k];
        else
            d->head = frame->jobs[k];
        d->tail = frame->jobs[k];
    }
    pthread_cond_broadcast(&d->wake);
    pthread_mutex_unlock(&d->lock);
    gk_counter_add(&c->worker->counters.frames_waited_for_disk, 1);
    return 1;
}
