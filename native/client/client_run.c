/*
 * client_run.c - drives one call's jobs: checks out a connection for each
 * (from its server's idle pool, else a new one), then runs every frame of
 * every server in one poll() loop in the calling thread, so the servers'
 * batches proceed in parallel without threads of their own. When all
 * frames are answered or the deadline passes, clean connections go back to
 * their pools, the rest are closed, and each server hears how it went.
 */
#include "client_run.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>

#include "client_conn.h"
#include "client_gpu_call.h"
#include "client_server.h"
#include "common/common.h"

static void count_failure(struct gdrkv_client *c, int err, uint64_t n)
{
    if (err == GDRKV_E_TIMEOUT)
        gk_counter_add(&c->counters.errors_timeout, n);
    else if (err == GDRKV_E_UNAVAILABLE)
        gk_counter_add(&c->counters.errors_unavailable, n);
    else if (err == GDRKV_E_PROTOCOL)
        gk_counter_add(&c->counters.errors_protocol, n);
    else if (err == GDRKV_E_DENIED)
        gk_counter_add(&c->counters.errors_denied, n);
}

/* Fails the frames of j not yet answered and closes its connection: after
 * an error its stream state is unknown, and closing is also what keeps a
 * late response from landing in the caller's buffers. */
static void fail_job(struct gdrkv_client *c, struct client_call *call, struct client_job *j,
                     int err, const char *why)
{
    uint64_t failed = 0;

    for (uint32_t f = j->done; f < j->nframes; f++) {
        client_frame_fail(&call->batch, &j->frames[f], err);
        failed += GK_MAX(j->frames[f].count, 1);
    }
    count_failure(c, err, failed);
    j->err = err;
    j->why = why;
    if (j->conn) {
        client_conn_close(j->conn);
        j->conn = NULL;
    }
}

static int job_active(const struct client_job *j)
{
    return j->conn && j->done < j->nframes;
}

/* Gives jobs [first, end), all of one server, a connection each. One
 * failed open fails them all: the server is unreachable, and trying again
 * per job would only multiply the wait. A tcp connect only starts here
 * (the poll loop finishes it, within connect_timeout_ms), so a server
 * that swallows SYNs holds up none of the other servers' keys; a name is
 * resolved here, within the call's deadline. */
static void check_out(struct gdrkv_client *c, struct client_call *call, uint32_t first,
                      uint32_t end)
{
    struct client_server *s = call->servers[call->jobs[first].server];
    uint64_t connect_ns = (uint64_t)c->opts.connect_timeout_ms * 1000000u;
    /* A unix socket's HELLO is answered here, synchronously: a local server
     * that accepts but never answers (stopped) holds up the whole call.
     * Where the call has other servers it may take at most half of the
     * time left, so that theirs still runs (and a read with replicas still
     * falls over within its pass: client_keyed.c). */
    int others = call->jobs[0].server != call->jobs[call->njobs - 1].server;

    for (uint32_t j = first; j < end; j++) {
        struct client_conn *conn;
        while ((conn = client_server_pop_idle(s)) && !client_conn_usable(conn))
            client_conn_close(conn);
        if (!conn) {
            int err;
            uint64_t now = gk_now_ns();
            uint64_t deadline = GK_MIN(call->deadline_ns, now + connect_ns);
            if (others && now < call->deadline_ns)
                deadline = GK_MIN(deadline, now + (call->deadline_ns - now) / 2);
            conn = client_conn_open(&s->ep, deadline, &err);
            if (!conn) {
                gk_counter_add(&c->counters.connect_failures, 1);
                /* Past connect_timeout_ms but within the call's deadline
                 * the server is unreachable rather than slow. */
                if (err == GDRKV_E_TIMEOUT && gk_now_ns() < call->deadline_ns)
                    err = GDRKV_E_UNAVAILABLE;
                const char *why = err == GDRKV_E_DENIED ? "authentication failed (token_file)"
                                                        : "connect failed";
                for (uint32_t k = first; k < end; k++)
                    fail_job(c, call, &call->jobs[k], err, why);
                return;
            }
            gk_counter_add(&c->counters.connects, 1);
            gk_counter_add(&c->counters.shm_connects, (uint64_t)client_conn_is_shm(conn));
        }
        call->jobs[j].conn = conn;
    }
}

/* Moves j's frames as far as its socket allows; a finished frame makes
 * room for the job's next one at once. */
static void step(struct gdrkv_client *c, struct client_call *call, struct client_job *j)
{
    int rc;
    while ((rc = client_conn_progress(j->conn)) == 1) {
        if (++j->done == j->nframes)
            return;
        client_conn_start(j->conn, &call->batch, &j->frames[j->done]);
    }
    if (rc < 0 && client_conn_connecting(j->conn))
        gk_counter_add(&c->counters.connect_failures, 1);
    if (rc < 0)
        fail_job(c, call, j, rc, j->conn->why);
}

/* Fails the jobs whose tcp connect is not done by its deadline (within
 * the call's: the server is unreachable rather than slow), and returns
 * the earliest deadline of those still connecting (0: none). */
static uint64_t expire_connects(struct gdrkv_client *c, struct client_call *call, uint64_t now)
{
    uint64_t earliest = 0;
    for (uint32_t j = 0; j < call->njobs; j++) {
        struct client_job *job = &call->jobs[j];
        uint64_t deadline = job_active(job) ? client_conn_connect_deadline(job->conn) : 0;
        if (deadline && now >= deadline) {
            gk_counter_add(&c->counters.connect_failures, 1);
            fail_job(c, call, job, GDRKV_E_UNAVAILABLE, "connect timed out");
        } else if (deadline && (!earliest || deadline < earliest)) {
            earliest = deadline;
        }
    }
    return earliest;
}

static void fail_active(struct gdrkv_client *c, struct client_call *call, int err,
                        const char *why)
{
    for (uint32_t j = 0; j < call->njobs; j++)
        if (job_active(&call->jobs[j]))
            fail_job(c, call, &call->jobs[j], err, why);
}

/* Sets up call->pollfds for jobs [0, n): how many are active, and how many
 * of those busy (a GPU copy to poll for, not a socket). */
static uint32_t watch_jobs(struct client_call *call, uint32_t n, uint32_t *busy)
{
    uint32_t active = 0;
    *busy = 0;
    for (uint32_t j = 0; j < n; j++) {
        struct client_job *job = &call->jobs[j];
        struct pollfd *pfd = &call->pollfds[j];
        /* poll() skips negative fds: finished and failed jobs. */
        pfd->fd = job_active(job) ? job->conn->fd : -1;
        pfd->events = pfd->fd >= 0 ? client_conn_events(job->conn) : 0;
        pfd->revents = 0;
        active += pfd->fd >= 0;
        *busy += pfd->fd >= 0 && client_conn_busy(job->conn);
    }
    return active;
}

/* After poll(): steps the jobs [0, n) whose socket is ready or whose GPU
 * copy is to be polled. */
static void step_polled(struct gdrkv_client *c, struct client_call *call, uint32_t n)
{
    for (uint32_t j = 0; j < n; j++) {
        struct client_job *job = &call->jobs[j];
        if (call->pollfds[j].revents || (job_active(job) && client_conn_busy(job->conn)))
            step(c, call, job);
    }
}

/* Steps the jobs [0, n) that can go on now, without waiting. */
static void step_ready(struct gdrkv_client *c, struct client_call *call, uint32_t n)
{
    uint32_t busy;
    if (watch_jobs(call, n, &busy) && (poll(call->pollfds, n, 0) > 0 || busy))
        step_polled(c, call, n);
}

/* How long the calling thread polls for a followed frame's answer before
 * it sleeps in poll(). The server copies behind this thread's copy, so
 * the answer comes within tens of us of its end: sooner than a sleeping
 * thread is back on a VM's CPU (docs/transports.md, "PUT: staging, then
 * the server's copy"). */
#define CLIENT_FOLLOWED_SPIN_NS 80000ull

/* Polls the call's sockets without sleeping until one is ready, the spin
 * is over or the call's deadline passed; poll()'s result. */
static int spin_for_followed(struct client_call *call)
{
    uint64_t until = GK_MIN(gk_now_ns() + CLIENT_FOLLOWED_SPIN_NS, call->deadline_ns);
    int n;
    while ((n = poll(call->pollfds, call->njobs, 0)) == 0 && gk_now_ns() < until)
        gk_cpu_relax();
    return n;
}

static void drive(struct gdrkv_client *c, struct client_call *call)
{
    /* Between two jobs' first frames, the answers already back are taken:
     * a GPU GET's first frame is small (client_call.c) so that its copy
     * starts while the other frames are still going out. */
    for (uint32_t j = 0; j < call->njobs; j++) {
        struct client_job *job = &call->jobs[j];
        if (j > 0)
            step_ready(c, call, j);
        if (job->conn) {
            client_conn_start(job->conn, &call->batch, &job->frames[0]);
            step(c, call, job);
        }
    }
    for (;;) {
        uint64_t connect_deadline = expire_connects(c, call, gk_now_ns());
        uint32_t busy;
        uint32_t active = watch_jobs(call, call->njobs, &busy);
        if (!active)
            return;
        int ms = gk_poll_ms_left(call->deadline_ns);
        if (ms == 0) {
            fail_active(c, call, GDRKV_E_TIMEOUT, "timed out");
            return;
        }
        if (connect_deadline)
            ms = GK_MIN(ms, GK_MAX(1, gk_poll_ms_left(connect_deadline)));
        /* A GPU copy in flight is polled, not waited for: its end has no fd.
         * When nothing else is left, let other threads have the core. */
        if (busy && busy == active)
            sched_yield();
        if (!busy && call->batch.follows_in_flight && spin_for_followed(call) > 0) {
            step_polled(c, call, call->njobs);
            continue;
        }
        if (poll(call->pollfds, call->njobs, busy ? 0 : ms) < 0 && errno != EINTR) {
            fail_active(c, call, GDRKV_E_INTERNAL, "poll failed");
            return;
        }
        step_polled(c, call, call->njobs);
    }
}

/* Returns the connections of jobs [first, end) (one server) and reports
 * the server's outcome once for the whole call. */
static void check_in(struct gdrkv_client *c, struct client_call *call, uint32_t first,
                     uint32_t end)
{
    struct client_server *s = call->servers[call->jobs[first].server];
    int err = 0;
    const char *why = NULL;

    for (uint32_t j = first; j < end; j++) {
        struct client_job *job = &call->jobs[j];
        /* INVALID is the caller's fault (a bad segment): it costs that
         * job's connection, but must not put the server in backoff for
         * every other thread. */
        if (job->err && job->err != GDRKV_E_INVALID && !err) {
            err = job->err;
            why = job->why;
        }
        if (job->conn && client_conn_reusable(job->conn))
            client_server_push_idle(s, job->conn);
        else if (job->conn)
            client_conn_close(job->conn);
        job->conn = NULL;
    }
    client_server_report(s, err, why);
}

/* Calls fn on each run of jobs that share a server. */
static void for_each_server(struct gdrkv_client *c, struct client_call *call,
                            void (*fn)(struct gdrkv_client *, struct client_call *, uint32_t,
                                       uint32_t))
{
    uint32_t end;
    for (uint32_t first = 0; first < call->njobs; first = end) {
        for (end = first + 1; end < call->njobs; end++)
            if (call->jobs[end].server != call->jobs[first].server)
                break;
        fn(c, call, first, end);
    }
}

/* GPU copies still in flight (tcp GETs) finish before the call returns;
 * a job whose copy failed has its keys failed. */
static void finish_gpu(struct gdrkv_client *c, struct client_call *call)
{
    struct gpu_call *g = call->batch.gpu;

    for (uint32_t j = 0; j < call->njobs; j++) {
        struct client_job *job = &call->jobs[j];
        if (job->conn && client_conn_gpu_drain(job->conn)) {
            job->done = 0;
            fail_job(c, call, job, GDRKV_E_INTERNAL, "GPU copy failed");
        }
    }
#define ADD_GPU_COUNTER(name) gk_counter_add(&c->counters.gpu_##name, g->stats.name);
    GPU_STATS(ADD_GPU_COUNTER)
#undef ADD_GPU_COUNTER
}

void client_run(struct gdrkv_client *c, struct client_call *call)
{
    for_each_server(c, call, check_out);
    drive(c, call);
    if (call->batch.gpu)
        finish_gpu(c, call);
    for_each_server(c, call, check_in);
#define ADD_CALL_COUNTER(name) gk_counter_add(&c->counters.name, call->batch.name);
    CLIENT_COUNTERS(CLIENT_COUNTER_NONE, ADD_CALL_COUNTER, CLIENT_COUNTER_NONE2,
                    CLIENT_COUNTER_NONE2, CLIENT_COUNTER_NONE)
#undef ADD_CALL_COUNTER
}
