/*
 * server_gpu_pins.c - see server_gpu_pins.h. An open-addressing table with linear
 * probing and backward-shift deletion, as server_peers.c's, keyed by pid.
 */
#include "server_gpu_pins.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/common.h"
#include "gdrkv.h"

struct mapping {
    uint64_t id, seq, bytes;
};

struct slot {
    pid_t pid;
    uint32_t conns;             /* 0: the slot is free */
    uint32_t nmappings;
    struct mapping mappings[SERVER_GPU_PINS_MAPPINGS];
};

struct server_gpu_pins {
    pthread_mutex_t lock;
    uint64_t pool_bytes;
    uint64_t mask;              /* slots - 1 */
    struct slot *slots;
};

struct server_gpu_pins *server_gpu_pins_new(uint32_t max_conns, uint64_t pool_bytes)
{
    struct server_gpu_pins *t = calloc(1, sizeof *t);
    uint64_t n = 16;
    while (n < 2 * (uint64_t)max_conns)
        n *= 2;
    if (!t || !(t->slots = calloc(n, sizeof *t->slots)) || pthread_mutex_init(&t->lock, NULL)) {
        if (t)
            free(t->slots);
        free(t);
        return NULL;
    }
    t->mask = n - 1;
    t->pool_bytes = pool_bytes;
    return t;
}

void server_gpu_pins_free(struct server_gpu_pins *t)
{
    if (!t)
        return;
    pthread_mutex_destroy(&t->lock);
    free(t->slots);
    free(t);
}

pid_t server_gpu_pins_peer_pid(int fd)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
        return 0;
    return cred.pid;
}

static uint64_t home(const struct server_gpu_pins *t, pid_t pid)
{
    uint32_t key = (uint32_t)pid;
    return gk_hash64(&key, sizeof key, 0x70696e73) & t->mask;
}

/* pid's slot, or the free slot where it would go. Lock held. */
static uint64_t find(const struct server_gpu_pins *t, pid_t pid)
{
    uint64_t i = home(t, pid);
    while (t->slots[i].conns && t->slots[i].pid != pid)
        i = (i + 1) & t->mask;
    return i;
}

void server_gpu_pins_join(struct server_gpu_pins *t, pid_t pid)
{
    pthread_mutex_lock(&t->lock);
    struct slot *s = &t->slots[find(t, pid)];
    if (!s->conns)
        *s = (struct slot){.pid = pid};
    s->conns++;
    pthread_mutex_unlock(&t->lock);
}

/* Knuth's algorithm R (server_peers.c). */
static void remove_at(struct server_gpu_pins *t, uint64_t hole)
{
    for (uint64_t i = (hole + 1) & t->mask; t->slots[i].conns; i = (i + 1) & t->mask) {
        uint64_t h = home(t, t->slots[i].pid);
        int stays = hole < i ? (hole < h && h <= i) : (hole < h || h <= i);
        if (stays)
            continue;
        t->slots[hole] = t->slots[i];
        hole = i;
    }
    t->slots[hole].conns = 0;
}

void server_gpu_pins_leave(struct server_gpu_pins *t, pid_t pid)
{
    pthread_mutex_lock(&t->lock);
    uint64_t i = find(t, pid);
    if (t->slots[i].conns && --t->slots[i].conns == 0)
        remove_at(t, i);
    pthread_mutex_unlock(&t->lock);
}

/* Under the lock: the report goes into s, or says why not. */
static int record(struct slot *s, const struct gk_pins *r, const char **why)
{
    uint32_t i = 0;
    while (i < s->nmappings && s->mappings[i].id != r->mapping)
        i++;
    if (i < s->nmappings) {
        struct mapping *m = &s->mappings[i];
        if (r->seq <= m->seq)
            return 0;           /* overtaken by a later report */
        m->seq = r->seq;
        m->bytes = r->bytes;
        if (r->bytes == 0)      /* the mapping's report ends */
            s->mappings[i] = s->mappings[--s->nmappings];
        return 0;
    }
    if (r->bytes == 0)
        return 0;
    if (s->nmappings == SERVER_GPU_PINS_MAPPINGS) {
        *why = "the process reports more mappings of the pool than the server keeps";
        return GDRKV_E_TOO_LARGE;
    }
    s->mappings[s->nmappings++] = (struct mapping){r->mapping, r->seq, r->bytes};
    return 0;
}

int server_gpu_pins_report(struct server_gpu_pins *t, pid_t pid, const struct gk_pins *r,
                       const char **why)
{
    if (r->bytes > t->pool_bytes) {
        *why = "the report pins more bytes than the pool has";
        return GDRKV_E_INVALID;
    }
    pthread_mutex_lock(&t->lock);
    struct slot *s = &t->slots[find(t, pid)];
    int rc = 0;
    /* The sender's connection joined at accept, so its slot is there;
     * a pid the kernel could not tell is 0, joined like any other. */
    if (!s->conns) {
        *why = "the reporting process has no connection";
        rc = GDRKV_E_INVALID;
    } else {
        rc = record(s, r, why);
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

void server_gpu_pins_totals(struct server_gpu_pins *t, struct server_gpu_pins_totals *out)
{
    *out = (struct server_gpu_pins_totals){0};
    pthread_mutex_lock(&t->lock);
    for (uint64_t i = 0; i <= t->mask; i++) {
        const struct slot *s = &t->slots[i];
        uint64_t bytes = 0;
        for (uint32_t m = 0; s->conns && m < s->nmappings; m++)
            bytes += s->mappings[m].bytes;
        if (!bytes)
            continue;
        out->bytes += bytes;
        out->max_process_bytes = GK_MAX(out->max_process_bytes, bytes);
        out->processes++;
    }
    pthread_mutex_unlock(&t->lock);
}
