/*
 * test_client_pins.c - the client's PINS reports (client_shm.c) against
 * the real in-process server, with CUDA's registration stood in for at the
 * C level (as test_gpu_slices.c does): the pool's GPU slices are set up
 * with a stub registration, slices are demanded, and the server's stats
 * must show what the slices pin once a call has gone, summed over the
 * process's clients (each maps the pool once), counted once per process;
 * a call without a change carries no report; and with many threads
 * calling while slices register, the server ends on the latest figure.
 */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "client/client_server.h"
#include "client/client_state.h"
#include "client/client_table.h"
#include "common/common.h"
#include "gdrkv.h"
#include "gpu/gpu_slices.h"

#define POOL_BYTES (64ull << 20)
#define SLICE (1ull << 20)          /* the smallest slice: many in a small pool */
#define THREADS 4

static int stub_reg(void *ctx, const void *base, uint64_t len, int readonly, uint64_t *dptr)
{
    (void)ctx, (void)len, (void)readonly;
    *dptr = (uint64_t)(uintptr_t)base;
    return 0;
}

static void stub_unreg(void *ctx, const void *base)
{
    (void)ctx, (void)base;
}

static int64_t stat_in(const char *text, const char *name)
{
    size_t len = strlen(name);
    for (const char *line = text; line; line = strchr(line, '\n')) {
        line += *line == '\n';
        if (!strncmp(line, name, len) && line[len] == ' ')
            return strtoll(line + len + 1, NULL, 10);
    }
    return -1;
}

static int64_t server_stat(gdrkv_server *s, const char *name)
{
    static char text[1 << 16];
    CHECK(gdrkv_server_stats(s, text, sizeof text) > 0, "server stats");
    return stat_in(text, name);
}

static gdrkv_client *open_shm_client(const char *addr)
{
    gdrkv_client_opts o;
    gdrkv_client *c = NULL;
    char err[256] = "";
    gdrkv_client_opts_init(&o);
    o.servers = addr;
    o.timeout_ms = 5000;
    o.ns = "pins";
    o.transport = GDRKV_TRANSPORT_SHM;
    CHECK(gdrkv_client_open(&o, &c, err, sizeof err) == 0, "client open: %s", err);
    return c;
}

/* A keyed call: it goes through a connection's start, where reports go. */
static void call(gdrkv_client *c)
{
    uint32_t len = 3;
    int64_t result;
    CHECK(gdrkv_batch_exists(c, 1, "key", &len, &result) == 0, "exists call");
}

/* The client's mapping of the pool, its slices set up with the stub (in
 * place of the first GPU copy, which would set them up with CUDA's). */
static struct gpu_slices *stub_slices(gdrkv_client *c)
{
    call(c);                        /* a connection, so the pool is mapped */
    struct client_table *t = client_table_get(c);
    struct client_pool *pool = t->all[0]->ep.pool;
    client_table_put(t);
    CHECK(pool != NULL && pool->gpu_slices == NULL, "a mapped pool without slices");
    struct gpu_slices_ops ops = {NULL, stub_reg, stub_unreg, NULL};
    struct gpu_slices *s = calloc(1, sizeof *s);
    CHECK(s && gpu_slices_init(s, pool->base, pool->map_len, 1, SLICE, 0, 0, &ops,
                               &c->gpu_pins.stats) == 0, "slices set up");
    __atomic_store_n(&pool->gpu_slices, s, __ATOMIC_RELEASE);
    return s;
}

/* Demands slices [first, first + n) and waits until they are registered. */
static void pin(struct gpu_slices *s, uint32_t first, uint32_t n)
{
    uint64_t base = (uint64_t)(uintptr_t)s->base;
    gpu_slices_reach(s, base + first * SLICE, n * SLICE);
    CHECK(gpu_slices_wait_idle(s, 5000), "registrations done");
    CHECK(gpu_slices_reach(s, base + first * SLICE, n * SLICE), "slices ready");
}

struct caller {
    gdrkv_client *c;
    int stop;
};

static void *keep_calling(void *arg)
{
    struct caller *k = arg;
    while (!__atomic_load_n(&k->stop, __ATOMIC_RELAXED))
        call(k->c);
    return NULL;
}

static gdrkv_server *start_server(uint32_t idle_timeout_ms, char *addr, size_t len)
{
    gdrkv_server_opts so;
    gdrkv_server *server = NULL;
    char err[256] = "";
    gdrkv_server_opts_init(&so);
    so.listen = "127.0.0.1:0";
    so.memory_bytes = POOL_BYTES;
    so.workers = 2;
    so.hugepages = 0;
    so.pretouch = 0;
    if (idle_timeout_ms)
        so.idle_timeout_ms = idle_timeout_ms;
    CHECK(gdrkv_server_start(&so, &server, err, sizeof err) == 0, "server start: %s", err);
    CHECK(gdrkv_server_address(server, addr, len) == 0, "server address");
    return server;
}

/* Polls the server's figure until it is want (5 s at most). */
static void wait_stat(gdrkv_server *server, const char *name, int64_t want)
{
    uint64_t deadline = gk_now_ns() + 5000000000ull;
    while (server_stat(server, name) != want) {
        CHECK(gk_now_ns() < deadline, "%s never became %lld", name, (long long)want);
        usleep(1000);
    }
}

/* The server closes idle connections, and forgets the process's reports
 * with its last: the connection the client opens next tells it again,
 * though the pins did not change. */
static void test_a_new_connection_tells_the_server_again(void)
{
    char addr[64];
    gdrkv_server *server = start_server(200, addr, sizeof addr);
    gdrkv_client *c = open_shm_client(addr);
    pin(stub_slices(c), 0, 3);
    call(c);
    CHECK_EQ(server_stat(server, "client_pinned_bytes"), (int64_t)(3 * SLICE));
    wait_stat(server, "local_connections_current", 0);
    CHECK_EQ(server_stat(server, "client_pinned_bytes"), 0);
    call(c);
    CHECK_EQ(server_stat(server, "client_pinned_bytes"), (int64_t)(3 * SLICE));
    gdrkv_client_close(c);
    gdrkv_server_stop(server);
}

int main(void)
{
    char addr[64];
    gdrkv_server *server = start_server(0, addr, sizeof addr);

    gdrkv_client *a = open_shm_client(addr), *b = open_shm_client(addr);
    struct gpu_slices *sa = stub_slices(a), *sb = stub_slices(b);
    CHECK_EQ(server_stat(server, "client_pinning_processes"), 0);

    /* A's slices register; the next call tells the server. */
    pin(sa, 0, 5);
    int64_t reports = server_stat(server, "ops_pins");
    call(a);
    CHECK_EQ(server_stat(server, "ops_pins"), reports + 1);
    CHECK_EQ(server_stat(server, "client_pinned_bytes"), (int64_t)(5 * SLICE));
    CHECK_EQ(server_stat(server, "client_pinning_processes"), 1);
    /* Nothing changed: no report. */
    call(a);
    CHECK_EQ(server_stat(server, "ops_pins"), reports + 1);
    check_passed++;
    printf("ok a report goes with the call after a change, and only then\n");

    /* B is this process's second mapping: the process pins both. */
    pin(sb, 10, 2);
    call(b);
    CHECK_EQ(server_stat(server, "client_pinned_bytes"), (int64_t)(7 * SLICE));
    CHECK_EQ(server_stat(server, "client_pinned_max_process_bytes"), (int64_t)(7 * SLICE));
    CHECK_EQ(server_stat(server, "client_pinning_processes"), 1);
    check_passed++;
    printf("ok two clients of one process: one process, their sum\n");

    /* Many threads call while A's slices register one by one: whatever
     * order their reports reach the server in, it ends on the last. */
    struct caller callers[THREADS];
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++) {
        callers[i] = (struct caller){.c = a};
        CHECK(pthread_create(&threads[i], NULL, keep_calling, &callers[i]) == 0, "thread");
    }
    for (uint32_t i = 5; i < 40; i++)
        pin(sa, i, 1);
    for (int i = 0; i < THREADS; i++) {
        __atomic_store_n(&callers[i].stop, 1, __ATOMIC_RELAXED);
        pthread_join(threads[i], NULL);
    }
    call(a);
    CHECK_EQ(server_stat(server, "client_pinned_bytes"), (int64_t)(42 * SLICE));
    CHECK_EQ((int64_t)gpu_slices_pinned(sa), (int64_t)(40 * SLICE));
    check_passed++;
    printf("ok concurrent calls leave the server on the latest figure\n");

    /* The process's reports go with its last connection. */
    gdrkv_client_close(a);
    gdrkv_client_close(b);
    wait_stat(server, "client_pinning_processes", 0);
    CHECK_EQ(server_stat(server, "client_pinned_bytes"), 0);
    check_passed++;
    printf("ok the reports go with the process's connections\n");
    gdrkv_server_stop(server);

    RUN(test_a_new_connection_tells_the_server_again);
    return check_done("test_client_pins");
}
