/*
 * server_rdma.c - see server_rdma.h.
 */
#include "server_rdma.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/log.h"
#include "rdma/rdma_dev.h"
#include "rdma/rdma_qp.h"
#include "server_state.h"
#include "common/stats.h"
#include "store/store.h"

/* Registration runs at a few GB/s per thread: a large pool is registered
 * by this many threads at once, one region each. */
#define SERVER_RDMA_REG_THREADS 8

struct server_rdma {
    struct rdma_dev dev;
    struct ibv_mr **mrs;
    struct rdma_region *regions;
    uint32_t nregions;
    uint64_t reg_ms;
    uint64_t sessions;              /* atomic: RDMA_HELLOs accepted */
    uint64_t sessions_refused;      /* atomic */
};

struct server_rdma_conn {
    struct rdma_qps qps;
    int killed;
};

struct reg_job {
    struct server_rdma *r;
    uint8_t *base;
    uint32_t next;                  /* atomic: the next region to register */
    int failed;                     /* atomic */
};

static void *register_regions(void *arg)
{
    struct reg_job *j = arg;
    struct server_rdma *r = j->r;
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    for (;;) {
        uint32_t i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (i >= r->nregions)
            return NULL;
        struct rdma_region *g = &r->regions[i];
        r->mrs[i] = r->dev.ibv->reg_mr(r->dev.pd, j->base + g->pool_off, g->len, access);
        if (!r->mrs[i]) {
            GK_WARN("rdma: registering %llu bytes of the pool failed: %s",
                    (unsigned long long)g->len, strerror(errno));
            __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
            return NULL;
        }
        g->addr = (uint64_t)(uintptr_t)(j->base + g->pool_off);
        g->rkey = r->mrs[i]->rkey;
    }
}

static void free_rdma(struct server_rdma *r)
{
    for (uint32_t i = 0; r->mrs && i < r->nregions; i++)
        if (r->mrs[i])
            r->dev.ibv->dereg_mr(r->mrs[i]);
    rdma_dev_close(&r->dev);
    free(r->mrs);
    free(r->regions);
    free(r);
}

/* Splits the pool at the largest MR, in whole slab pages so no chunk
 * straddles two regions, and registers the pieces in parallel. */
static int register_pool(struct server_rdma *r, struct store *st, char *err, size_t errlen)
{
    uint64_t size = store_capacity(st);
    uint64_t page = store_page_size();
    uint64_t max = rdma_dev_max_mr(&r->dev, page);
    /* At least one region per registering thread, so a device whose MRs
     * may be as large as the pool still registers it in parallel. */
    uint64_t share = (size / SERVER_RDMA_REG_THREADS + page - 1) / page * page;
    uint64_t piece = GK_MIN(max, GK_MAX(share, page));
    if (max == 0) {
        snprintf(err, errlen, "%s registers at most %llu bytes, less than a slab page",
                 r->dev.name, (unsigned long long)r->dev.attr.max_mr_size);
        return GDRKV_E_UNAVAILABLE;
    }
    uint64_t n = (size + piece - 1) / piece;
    if (n > RDMA_MAX_REGIONS) {
        snprintf(err, errlen, "the pool needs %llu MRs on %s, over %d",
                 (unsigned long long)n, r->dev.name, RDMA_MAX_REGIONS);
        return GDRKV_E_UNAVAILABLE;
    }
    r->nregions = (uint32_t)n;
    r->mrs = calloc(n, sizeof *r->mrs);
    r->regions = calloc(n, sizeof *r->regions);
    if (!r->mrs || !r->regions) {
        snprintf(err, errlen, "out of memory");
        return GDRKV_E_INTERNAL;
    }
    for (uint32_t i = 0; i < n; i++) {
        r->regions[i].pool_off = i * piece;
        r->regions[i].len = GK_MIN(piece, size - i * piece);
    }
    uint64_t t0 = gk_now_ns();
    struct reg_job job = {.r = r, .base = store_base(st)};
    pthread_t threads[SERVER_RDMA_REG_THREADS];
    int started = 0;
    while (started < SERVER_RDMA_REG_THREADS - 1 && (uint32_t)started + 1 < r->nregions &&
           pthread_create(&threads[started], NULL, register_regions, &job) == 0)
        started++;
    register_regions(&job);
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    r->reg_ms = (gk_now_ns() - t0) / 1000000;
    if (job.failed) {
        snprintf(err, errlen, "cannot register the pool with %s (see the log)", r->dev.name);
        return GDRKV_E_UNAVAILABLE;
    }
    GK_INFO("rdma: pool of %llu MiB registered on %s port %u in %llu ms (%u MRs)",
            (unsigned long long)(size >> 20), r->dev.name, r->dev.port,
            (unsigned long long)r->reg_ms, r->nregions);
    return 0;
}

int server_rdma_start(struct gdrkv_server *s, int mode, char *err, size_t errlen)
{
    char why[300];
    if (mode == 0)
        return 0;
    struct server_rdma *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return GDRKV_E_INTERNAL;
    }
    int rc = rdma_dev_open(&r->dev, NULL, why, sizeof why);
    if (rc == 0)
        rc = register_pool(r, s->store, why, sizeof why);
    if (rc) {
        free_rdma(r);
        if (mode == 1) {
            snprintf(err, errlen, "rdma: %s", why);
            return rc;
        }
        GK_INFO("rdma off: %s", why);
        return 0;
    }
    s->rdma = r;
    return 0;
}

void server_rdma_stop(struct gdrkv_server *s)
{
    if (s->rdma)
        free_rdma(s->rdma);
    s->rdma = NULL;
}

/* ------------------------------------------------------------ sessions */

int server_rdma_conn_create(struct server_conn *c, struct rdma_endpoint *peer,
                            struct rdma_endpoint *mine, const char **why)
{
    struct server_rdma *r = c->worker->server->rdma;

    if (peer->eth != r->dev.eth) {
        *why = "link layers differ (IB vs RoCE)";
        return GDRKV_E_UNAVAILABLE;
    }
    /* What both sides can do, never what either assumes. */
    const struct ibv_device_attr *a = &r->dev.attr;
    peer->rd_atomic = GK_MIN(peer->rd_atomic, (uint32_t)GK_MAX(a->max_qp_rd_atom, 1));
    uint32_t sq_depth = GK_MIN(peer->sq_depth, (uint32_t)GK_MAX(a->max_qp_wr, 1));
    uint32_t max_sge = GK_MIN(peer->max_sge, (uint32_t)GK_MAX(a->max_sge, 1));

    struct server_rdma_conn *rc = calloc(1, sizeof *rc);
    if (!rc)
        return GDRKV_E_INTERNAL;
    if (rdma_qps_create(&r->dev, &rc->qps, peer->nqps, 1, 1, 1) ||
        rdma_qps_connect(&r->dev, &rc->qps, peer, 0)) {
        if (rc->qps.n)
            rdma_qps_destroy(&r->dev, &rc->qps);
        free(rc);
        *why = "cannot set up QPs (see the server log)";
        return GDRKV_E_UNAVAILABLE;
    }
    rdma_qps_describe(&r->dev, &rc->qps, mine);
    mine->sq_depth = sq_depth;
    mine->max_sge = max_sge;
    c->rdma = rc;
    return 0;
}

const struct rdma_region *server_rdma_regions(const struct gdrkv_server *s, uint32_t *n)
{
    *n = s->rdma->nregions;
    return s->rdma->regions;
}

void server_rdma_count_hello(const struct gdrkv_server *s, int accepted)
{
    __atomic_fetch_add(accepted ? &s->rdma->sessions : &s->rdma->sessions_refused, 1,
                       __ATOMIC_RELAXED);
}

int server_rdma_conn_active(const struct server_conn *c)
{
    return c->rdma && !c->rdma->killed;
}

void server_rdma_conn_kill(struct server_conn *c)
{
    if (c->rdma && !c->rdma->killed) {
        rdma_qps_kill(&c->worker->server->rdma->dev, &c->rdma->qps);
        c->rdma->killed = 1;
    }
}

void server_rdma_conn_destroy(struct server_conn *c)
{
    if (!c->rdma)
        return;
    struct server_rdma *r = c->worker->server->rdma;
    rdma_qps_kill(&r->dev, &c->rdma->qps);
    rdma_qps_destroy(&r->dev, &c->rdma->qps);
    free(c->rdma);
    c->rdma = NULL;
}

void server_rdma_stats(const struct gdrkv_server *s, struct gk_text *t)
{
    const struct server_rdma *r = s->rdma;
    gk_text_u64(t, "rdma_enabled", r != NULL);
    if (!r)
        return;
    gk_text_u64(t, "rdma_pool_mrs", r->nregions);
    gk_text_u64(t, "rdma_pool_register_ms", r->reg_ms);
    gk_text_u64(t, "rdma_sessions", __atomic_load_n(&r->sessions, __ATOMIC_RELAXED));
    gk_text_u64(t, "rdma_sessions_refused",
                __atomic_load_n(&r->sessions_refused, __ATOMIC_RELAXED));
}

