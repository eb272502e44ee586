/*
 * server_pins.c - see server_pins.h. Accounts live in a chained hash table
 * under one mutex, each allocated on its own so a connection may keep a
 * pointer to it; bytes are charged with a compare-and-swap against the
 * cap, so two connections of one peer on two workers can never pass it
 * together.
 */
#include "server_pins.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/common.h"

#define PINS_BUCKETS 1024u

struct server_pin_account {
    struct server_pin_account *next;    /* in its bucket */
    struct server_pin_peer peer;
    uint32_t conns;                     /* under the table's lock */
    uint64_t bytes;                     /* atomic: pinned now */
};

struct server_pins {
    pthread_mutex_t lock;
    uint64_t cap;
    struct server_pin_account *buckets[PINS_BUCKETS];
};

struct server_pins *server_pins_new(uint64_t cap)
{
    struct server_pins *p = calloc(1, sizeof *p);
    if (!p || pthread_mutex_init(&p->lock, NULL)) {
        free(p);
        return NULL;
    }
    p->cap = cap;
    return p;
}

void server_pins_free(struct server_pins *p)
{
    if (!p)
        return;
    for (uint32_t b = 0; b < PINS_BUCKETS; b++) {
        while (p->buckets[b]) {
            struct server_pin_account *a = p->buckets[b];
            p->buckets[b] = a->next;
            free(a);
        }
    }
    pthread_mutex_destroy(&p->lock);
    free(p);
}

void server_pin_peer_of(int fd, int local, const struct server_peer *ip,
                        struct server_pin_peer *out)
{
    memset(out, 0, sizeof *out);
    if (!local) {
        out->ip = *ip;
        return;
    }
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
        out->pid = (uint32_t)cred.pid;
}

static struct server_pin_account **bucket_of(struct server_pins *p,
                                             const struct server_pin_peer *peer)
{
    uint64_t h = gk_hash64(peer->ip.addr, sizeof peer->ip.addr, peer->pid);
    return &p->buckets[h % PINS_BUCKETS];
}

struct server_pin_account *server_pins_join(struct server_pins *p,
                                            const struct server_pin_peer *peer)
{
    pthread_mutex_lock(&p->lock);
    struct server_pin_account **head = bucket_of(p, peer), *a = *head;
    while (a && memcmp(&a->peer, peer, sizeof *peer))
        a = a->next;
    if (!a && (a = calloc(1, sizeof *a))) {
        a->peer = *peer;
        a->next = *head;
        *head = a;
    }
    if (a)
        a->conns++;
    pthread_mutex_unlock(&p->lock);
    return a;
}

void server_pins_leave(struct server_pins *p, struct server_pin_account *a)
{
    if (!a)
        return;
    pthread_mutex_lock(&p->lock);
    if (--a->conns == 0) {
        struct server_pin_account **at = bucket_of(p, &a->peer);
        while (*at != a)
            at = &(*at)->next;
        *at = a->next;
        free(a);
    }
    pthread_mutex_unlock(&p->lock);
}

/* What of the held objects fits in room, in order (into fits, when given).
 * A key repeated in a run pins the same object again, not more memory: it
 * is charged once. (Repeats apart are charged each time: over-counting
 * only errs towards the writers.) */
static uint64_t fitting(const uint64_t *sizes, const void *const *held, uint32_t n,
                        uint64_t room, uint8_t *fits)
{
    uint64_t total = 0;
    int fit = 0;
    for (uint32_t i = 0; i < n; i++) {
        int again = i > 0 && held[i] && held[i] == held[i - 1];
        if (!again) {
            fit = held[i] && sizes[i] <= room - total;
            total += fit ? sizes[i] : 0;
        }
        if (fits)
            fits[i] = (uint8_t)fit;
    }
    return total;
}

uint64_t server_pins_charge(struct server_pins *p, struct server_pin_account *a,
                            const uint64_t *sizes, const void *const *held, uint32_t n,
                            uint8_t *fits)
{
    uint64_t have = __atomic_load_n(&a->bytes, __ATOMIC_RELAXED), room, take;
    /* Retried only when another connection of the peer charged meanwhile. */
    do {
        room = have < p->cap ? p->cap - have : 0;
        take = fitting(sizes, held, n, room, NULL);
    } while (!__atomic_compare_exchange_n(&a->bytes, &have, have + take, 0, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    fitting(sizes, held, n, room, fits);
    return take;
}

void server_pins_credit(struct server_pin_account *a, uint64_t bytes)
{
    if (a && bytes)
        __atomic_fetch_sub(&a->bytes, bytes, __ATOMIC_RELAXED);
}
