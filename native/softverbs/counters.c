/*
 * counters.c - per-process counters that let tests assert the transport
 * really batches (doorbells vs WRs, completions vs WRs), and the error
 * injection hook. Relaxed atomics: each counter is exact, a snapshot of
 * all of them is not taken at one instant.
 */
#include "sv.h"

static _Atomic uint64_t counters[SVC_COUNT];

/* Injection: armed with the number of WRs still to let through. */
static pthread_mutex_t inject_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int inject_armed;
static uint64_t inject_left;
static int inject_status;

void sv_count(enum sv_counter c, uint64_t n)
{
    atomic_fetch_add_explicit(&counters[c], n, memory_order_relaxed);
}

void softverbs_counters(struct softverbs_counters *out)
{
    if (!out)
        return;
    uint64_t v[SVC_COUNT];
    for (int i = 0; i < SVC_COUNT; i++)
        v[i] = atomic_load_explicit(&counters[i], memory_order_relaxed);
    out->post_send_calls = v[SVC_POST_SEND_CALLS];
    out->post_recv_calls = v[SVC_POST_RECV_CALLS];
    out->wrs_posted = v[SVC_WRS_POSTED];
    out->wrs_executed = v[SVC_WRS_EXECUTED];
    out->sges = v[SVC_SGES];
    out->completions = v[SVC_COMPLETIONS];
    out->cqes_polled = v[SVC_CQES_POLLED];
    out->poll_calls = v[SVC_POLL_CALLS];
    out->error_completions = v[SVC_ERROR_COMPLETIONS];
    out->post_failures = v[SVC_POST_FAILURES];
    out->cq_overflows = v[SVC_CQ_OVERFLOWS];
}

void softverbs_reset_counters(void)
{
    for (int i = 0; i < SVC_COUNT; i++)
        atomic_store_explicit(&counters[i], 0, memory_order_relaxed);
}

void softverbs_inject_error(uint64_t after_wrs, int wc_status)
{
    pthread_mutex_lock(&inject_lock);
    inject_left = after_wrs;
    inject_status = wc_status;
    atomic_store(&inject_armed, 1);
    pthread_mutex_unlock(&inject_lock);
}

enum ibv_wc_status sv_injected_status(void)
{
    if (!atomic_load_explicit(&inject_armed, memory_order_relaxed))
        return IBV_WC_SUCCESS;
    enum ibv_wc_status st = IBV_WC_SUCCESS;
    pthread_mutex_lock(&inject_lock);
    if (atomic_load(&inject_armed)) {
        if (inject_left == 0) {
            st = (enum ibv_wc_status)inject_status;
            atomic_store(&inject_armed, 0);
        } else {
            inject_left--;
        }
    }
    pthread_mutex_unlock(&inject_lock);
    return st;
}
