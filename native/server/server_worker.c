/*
 * server_worker.c - a worker thread: its own epoll instance holding the
 * shared listening sockets, tcp and unix (EPOLLEXCLUSIVE, so one worker
 * wakes per new connection), the stop eventfd, and its connections. The
 * worker that accepts a connection hands it to the next worker in turn
 * (memcached's dispatch): exclusive wakeups favour one waiting worker, and
 * a client's several connections must land on several workers for a
 * striped batch to run in parallel (the server's copies of shm PUTs). It wakes
 * at least every SERVER_TICK_MS to expire leases, close the connections that
 * are overdue (stalled, too slow, idle: server_conn.h) and retry the frames
 * that wait for buffer room.
 *
 * For busy_poll_ns after an event it polls instead of sleeping: a client's
 * next frame (the RELEASE or COMMIT after its copy, its next call) then
 * finds it awake. Not after a staged PUT: that client fills its staging
 * again first, and the CPUs are better left to the copies
 * (docs/operations.md, "Busy polling"). (A followed frame's client sends
 * its next request before it copies; polling after those is untried.)
 */
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"
#include "common/grow.h"
#include "common/log.h"
#include "common/net.h"
#include "server_conn.h"
#include "server_disk.h"
#include "server_ops.h"
#include "server_state.h"
#include "server_worker.h"

#define WORKER_EVENTS 256
/* Accepts per wakeup, so a burst of connections spreads over the workers. */
#define WORKER_ACCEPTS 32

/* epoll data of the fds that are not connections */
static char listen_token, unix_token, wake_token, handoff_token, disk_token;

static int watch(struct server_worker *w, int fd, void *token)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.ptr = token};
    /* EEXIST: still watched from before a pause that half failed. */
    if (fd < 0 || epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0 || errno == EEXIST)
        return 0;
    return -1;
}

static int watch_listeners(struct server_worker *w)
{
    struct gdrkv_server *s = w->server;
    if (watch(w, s->listen_fd, &listen_token) < 0 || watch(w, s->unix_fd, &unix_token) < 0)
        return -1;
    w->accepting = 1;
    return 0;
}

/* Out of file descriptors: the listeners would stay readable and spin the
 * loop, so leave them alone until the next tick. */
static void pause_accepting(struct server_worker *w, int err)
{
    struct gdrkv_server *s = w->server;

    GK_WARN("accept: %s; pausing for %d ms", strerror(err), SERVER_TICK_MS);
    epoll_ctl(w->epoll_fd, EPOLL_CTL_DEL, s->listen_fd, NULL);
    if (s->unix_fd >= 0)
        epoll_ctl(w->epoll_fd, EPOLL_CTL_DEL, s->unix_fd, NULL);
    w->accepting = 0;
}

void server_worker_destroy(struct server_worker *w)
{
    if (w->epoll_fd >= 0)
        close(w->epoll_fd);
    if (w->handoff_fd >= 0) {
        close(w->handoff_fd);
        pthread_mutex_destroy(&w->handoff_lock);
    }
    free(w->handoffs);
    if (w->disk_fd >= 0) {
        close(w->disk_fd);
        pthread_mutex_destroy(&w->disk_lock);
    }
    for (uint32_t i = 0; i < w->ndisk_done; i++)
        server_disk_release(w->disk_done[i]);
    free(w->disk_done);
    free(w->scratch);
    gk_copy_free(&w->copies);
}

int server_worker_init(struct server_worker *w, struct gdrkv_server *s)
{
    struct epoll_event wake = {.events = EPOLLIN, .data.ptr = &wake_token};
    struct epoll_event handoff = {.events = EPOLLIN, .data.ptr = &handoff_token};

    struct epoll_event disk = {.events = EPOLLIN, .data.ptr = &disk_token};

    w->server = s;
    w->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    w->handoff_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (w->handoff_fd >= 0)
        pthread_mutex_init(&w->handoff_lock, NULL);
    w->disk_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (w->disk_fd >= 0)
        pthread_mutex_init(&w->disk_lock, NULL);
    w->scratch = malloc(SERVER_SCRATCH_SIZE);
    if (w->epoll_fd < 0 || w->handoff_fd < 0 || w->disk_fd < 0 || !w->scratch ||
        epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, s->wake_fd, &wake) < 0 ||
        epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, w->handoff_fd, &handoff) < 0 ||
        epoll_ctl(w->epoll_fd, EPOLL_CTL_ADD, w->disk_fd, &disk) < 0 ||
        watch_listeners(w) < 0) {
        int saved = errno;
        server_worker_destroy(w);
        errno = saved;
        return -1;
    }
    return 0;
}

/* The slots a new connection takes at accept (server_conn.h), or for a
 * stranger only its peer's address; 0 or -1 (refused). */
static int take_slots(struct server_worker *w, int fd, int local, struct server_peer *peer)
{
    if (!local && server_peer_of(fd, peer) < 0) {
        gk_counter_add(&w->counters.connections_rejected, 1);
        return -1;
    }
    if (!server_conn_slot_at_accept(w->server, local))
        return 0;
    return server_conn_slot_take(w, local, peer);
}

/* Sets up an accepted connection on w, or closes it. */
static void open_connection(struct server_worker *w, int fd, int local,
                            const struct server_peer *peer)
{
    int rc = server_conn_open(w, fd, local, peer);
    if (rc < 0) {
        if (server_conn_slot_at_accept(w->server, local))
            server_conn_slot_give(w->server, local, peer);
        close(fd);
        if (rc == -1)
            GK_WARN("cannot set up a connection: %s", strerror(errno));
        return;
    }
    gk_counter_add(&w->counters.connections_total, 1);
    gk_counter_add(&w->counters.shm_connections_total, (uint64_t)local);
}

/* Queues the connection for worker `to`, or returns -1 (out of memory, or
 * its loop has ended): the acceptor keeps it then. */
static int hand_over(struct server_worker *to, int fd, int local, const struct server_peer *peer)
{
    int rc = -1;
    pthread_mutex_lock(&to->handoff_lock);
    if (!to->handoff_closed && (to->nhandoffs < to->handoff_cap ||
                                gk_grow(&to->handoffs, &to->handoff_cap, to->nhandoffs + 1,
                                        sizeof *to->handoffs, 16) == 0)) {
        to->handoffs[to->nhandoffs++] = (struct server_handoff){fd, local, *peer};
        rc = 0;
    }
    pthread_mutex_unlock(&to->handoff_lock);
    if (rc == 0) {
        uint64_t one = 1;
        if (write(to->handoff_fd, &one, sizeof one) < 0 && errno != EAGAIN)
            GK_WARN("handoff eventfd: %s", strerror(errno));
    }
    return rc;
}

/* Opens the connections other workers handed over; with closing, refuses
 * any later ones and closes those still queued (the loop has ended). */
static void take_handoffs(struct server_worker *w, int closing)
{
    uint64_t count;
    if (read(w->handoff_fd, &count, sizeof count) < 0 && errno != EAGAIN)
        GK_WARN("handoff eventfd: %s", strerror(errno));
    pthread_mutex_lock(&w->handoff_lock);
    struct server_handoff *queue = w->handoffs;
    uint32_t n = w->nhandoffs;
    w->handoffs = NULL;
    w->nhandoffs = w->handoff_cap = 0;
    w->handoff_closed |= closing;
    pthread_mutex_unlock(&w->handoff_lock);
    for (uint32_t i = 0; i < n; i++) {
        if (closing) {
            if (server_conn_slot_at_accept(w->server, queue[i].local))
                server_conn_slot_give(w->server, queue[i].local, &queue[i].peer);
            close(queue[i].fd);
        } else {
            open_connection(w, queue[i].fd, queue[i].local, &queue[i].peer);
        }
    }
    free(queue);
}

/* The disk threads brought keys back (server_disk.h): the frames parked
 * for them run again. A connection closed meanwhile is not found. The
 * demoter may have made room too (server_disk.c wake_writers): the writes
 * waiting for it try again. */
static void take_disk_done(struct server_worker *w)
{
    uint64_t count;
    if (read(w->disk_fd, &count, sizeof count) < 0 && errno != EAGAIN)
        GK_WARN("disk eventfd: %s", strerror(errno));
    pthread_mutex_lock(&w->disk_lock);
    struct disk_frame **done = w->disk_done;
    uint32_t n = w->ndisk_done;
    w->disk_done = NULL;
    w->ndisk_done = w->disk_done_cap = 0;
    pthread_mutex_unlock(&w->disk_lock);
    for (uint32_t i = 0; i < n; i++) {
        struct server_conn *c = w->conns;
        while (c && !(c->serial == server_disk_serial(done[i]) && c->state == CONN_WAIT_DISK))
            c = c->next;
        if (c)
            server_conn_resume_after_disk(c, done[i]);
        else
            server_disk_release(done[i]);
    }
    free(done);
    for (struct server_conn *c = w->conns, *next; c; c = next) {
        next = c->next;
        if (c->state == CONN_WAIT_ROOM)
            server_conn_on_event(c);
    }
}

/* local: connections on the unix socket, which may use shm. Each goes to
 * the next worker in turn. */
static void accept_connections(struct server_worker *w, int listen_fd, int local)
{
    struct gdrkv_server *s = w->server;

    for (int i = 0; i < WORKER_ACCEPTS; i++) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                pause_accepting(w, errno);
            return;     /* EAGAIN: the queue is empty, or another worker was quicker */
        }
        if (local && !gk_peer_is_us(fd)) {
            gk_counter_add(&w->counters.shm_connections_refused, 1);
            close(fd);
            GK_WARN("unix connection from another user refused");
            continue;
        }
        struct server_peer peer = {0};
        if (take_slots(w, fd, local, &peer) < 0) {
            close(fd);
            continue;
        }
        if (!local)
            gk_set_nodelay(fd);
        uint32_t turn = __atomic_fetch_add(&s->next_worker, 1, __ATOMIC_RELAXED);
        struct server_worker *to = &s->workers[turn % (uint32_t)s->nworkers];
        if (to == w || hand_over(to, fd, local, &peer) < 0)
            open_connection(w, fd, local, &peer);
    }
}

/* Closes c when it is overdue (server_conn.h says for what), counting why. */
static void close_if_overdue(struct server_worker *w, struct server_conn *c, uint64_t now_ns)
{
    static const char *const why[] = {
        [CONN_OVERDUE_STALLED] = "no progress mid-frame",
        [CONN_OVERDUE_REQUEST] = "request not in by its deadline",
        [CONN_OVERDUE_ANSWER] = "GET values not read by their deadline",
        [CONN_OVERDUE_IDLE] = "idle",
        [CONN_OVERDUE_AUTH] = "not authenticated in time",
    };
    enum server_conn_overdue overdue = server_conn_overdue(c, now_ns);
    if (overdue == CONN_OVERDUE_NO)
        return;
    if (overdue == CONN_OVERDUE_REQUEST)
        gk_counter_add(&w->counters.frames_too_slow, 1);
    else if (overdue == CONN_OVERDUE_ANSWER)
        gk_counter_add(&w->counters.get_pins_expired, 1);
    else if (overdue == CONN_OVERDUE_IDLE)
        gk_counter_add(&w->counters.connections_idle_closed, 1);
    else if (overdue == CONN_OVERDUE_AUTH)
        gk_counter_add(&w->counters.auth_timeouts, 1);
    GK_DEBUG("fd %d: %s, closing", c->fd, why[overdue]);
    server_conn_close(c);
}

static void tick(struct server_worker *w, uint64_t now_ns)
{
    for (struct server_conn *c = w->conns, *next; c; c = next) {
        next = c->next;
        server_ops_expire(c, now_ns);
        close_if_overdue(w, c, now_ns);
    }
    /* Frames waiting for buffer room or for the disk tier's room try again
     * (server_conn.c). */
    for (struct server_conn *c = w->conns, *next; c; c = next) {
        next = c->next;
        if (c->state == CONN_WAIT_BUFFER || c->state == CONN_WAIT_ROOM)
            server_conn_on_event(c);
    }
    if (!w->accepting && !w->draining && watch_listeners(w) < 0)
        GK_WARN("cannot watch the listening sockets again: %s", strerror(errno));
}

/* Runs again the connections that stopped at their step bound. */
static void run_runnable(struct server_worker *w)
{
    w->runnable = 0;
    for (struct server_conn *c = w->conns, *next; c; c = next) {
        next = c->next;
        if (c->runnable)
            server_conn_on_event(c);
    }
}

/* Stop began: no new connections for this worker, and no more wakeups
 * from the stop eventfd (it stays readable). Returns when to give up on
 * the frames still in flight. */
static uint64_t begin_drain(struct server_worker *w)
{
    struct gdrkv_server *s = w->server;
    w->draining = 1;
    epoll_ctl(w->epoll_fd, EPOLL_CTL_DEL, s->wake_fd, NULL);
    if (w->accepting) {
        epoll_ctl(w->epoll_fd, EPOLL_CTL_DEL, s->listen_fd, NULL);
        if (s->unix_fd >= 0)
            epoll_ctl(w->epoll_fd, EPOLL_CTL_DEL, s->unix_fd, NULL);
        w->accepting = 0;
    }
    return gk_now_ns() + (uint64_t)s->opts.drain_timeout_ms * 1000000ull;
}

/* Closes the connections between frames: their clients have every answer
 * they asked for. Returns whether any is left mid-frame. */
static int close_between_frames(struct server_worker *w)
{
    for (struct server_conn *c = w->conns, *next; c; c = next) {
        next = c->next;
        if (server_conn_between_frames(c))
            server_conn_close(c);
    }
    return w->conns != NULL;
}

/* Polling, the worker gives way to any thread waiting for its CPU (the
 * copy helpers, on either side, must not wait for a worker with nothing to
 * do), then waits a few microseconds before it polls again: polls back to
 * back, even yielding, cost CPU PUTs over shm (docs/benchmarks-log.md,
 * "Workers that poll before they sleep"). A likely reason: each
 * epoll_wait takes the lock a client's send takes to wake the worker. */
static void between_polls(void)
{
    sched_yield();
    for (int i = 0; i < 64; i++)
        gk_cpu_relax();
}

void *server_worker_main(void *arg)
{
    struct server_worker *w = arg;
    struct epoll_event events[WORKER_EVENTS];
    uint64_t tick_ns = SERVER_TICK_MS * 1000000ull;
    uint64_t next_tick = gk_now_ns() + tick_ns;
    uint64_t drain_until = 0;       /* stopping: the frames in flight may finish until then */
    uint64_t busy_until = 0;        /* polling without sleeping until then */

    for (;;) {
        int polling = busy_until && gk_now_ns() < busy_until;
        int n = epoll_wait(w->epoll_fd, events, WORKER_EVENTS,
                           w->runnable || polling ? 0 : SERVER_TICK_MS);
        if (n == 0 && polling && !w->runnable)
            between_polls();
        if (n < 0 && errno != EINTR) {
            GK_ERROR("epoll_wait: %s; worker stops", strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            void *p = events[i].data.ptr;
            if (p == &wake_token)
                drain_until = begin_drain(w);
            else if (p == &listen_token)
                accept_connections(w, w->server->listen_fd, 0);
            else if (p == &unix_token)
                accept_connections(w, w->server->unix_fd, 1);
            else if (p == &handoff_token)
                take_handoffs(w, 0);
            else if (p == &disk_token)
                take_disk_done(w);
            else
                server_conn_on_event(p);
        }
        if (w->runnable)
            run_runnable(w);
        uint64_t now = gk_now_ns();
        if (n > 0 && w->server->busy_poll_ns)
            busy_until = w->last_was_staged ? 0 : now + w->server->busy_poll_ns;
        if (now >= next_tick) {
            tick(w, now);
            next_tick = now + tick_ns;
        }
        if (drain_until && (!close_between_frames(w) || now >= drain_until))
            break;
    }
    take_handoffs(w, 1);
    while (w->conns)
        server_conn_close(w->conns);
    return NULL;
}
