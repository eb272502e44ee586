/*
 * server_peers.c - see server_peers.h. An open-addressing table with
 * linear probing, sized at twice the most peers there can be (each holds
 * at least one connection), so it never fills; a peer whose last
 * connection closes leaves by backward-shift deletion, so no tombstones
 * pile up however peers come and go.
 */
#include "server_peers.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/common.h"

struct slot {
    struct server_peer peer;
    uint32_t conns;             /* 0: the slot is free */
};

struct server_peers {
    pthread_mutex_t lock;
    uint32_t per_peer;
    uint64_t mask;              /* slots - 1, a power of two minus one */
    struct slot *slots;
};

struct server_peers *server_peers_new(uint32_t max_conns, uint32_t per_peer)
{
    struct server_peers *p = calloc(1, sizeof *p);
    uint64_t n = 16;
    while (n < 2 * (uint64_t)max_conns)
        n *= 2;
    if (!p || !(p->slots = calloc(n, sizeof *p->slots)) || pthread_mutex_init(&p->lock, NULL)) {
        if (p)
            free(p->slots);
        free(p);
        return NULL;
    }
    p->mask = n - 1;
    p->per_peer = per_peer;
    return p;
}

void server_peers_free(struct server_peers *p)
{
    if (!p)
        return;
    pthread_mutex_destroy(&p->lock);
    free(p->slots);
    free(p);
}

int server_peer_of(int fd, struct server_peer *out)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    memset(out, 0, sizeof *out);
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0)
        return -1;
    if (ss.ss_family == AF_INET6) {
        memcpy(out->addr, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
    } else if (ss.ss_family == AF_INET) {
        out->addr[10] = out->addr[11] = 0xff;
        memcpy(out->addr + 12, &((struct sockaddr_in *)&ss)->sin_addr, 4);
    } else {
        return -1;
    }
    return 0;
}

static uint64_t home(const struct server_peers *p, const struct server_peer *peer)
{
    return gk_hash64(peer->addr, sizeof peer->addr, 0x70656572) & p->mask;
}

/* The peer's slot, or the free slot where it would go. Lock held. */
static uint64_t find(const struct server_peers *p, const struct server_peer *peer)
{
    uint64_t i = home(p, peer);
    while (p->slots[i].conns && memcmp(&p->slots[i].peer, peer, sizeof *peer))
        i = (i + 1) & p->mask;
    return i;
}

int server_peers_take(struct server_peers *p, const struct server_peer *peer)
{
    pthread_mutex_lock(&p->lock);
    struct slot *s = &p->slots[find(p, peer)];
    int ok = s->conns < p->per_peer;
    if (ok) {
        s->peer = *peer;
        s->conns++;
    }
    pthread_mutex_unlock(&p->lock);
    return ok ? 0 : -1;
}

/* Knuth's algorithm R: the slots after a freed one that would no longer be
 * found (their home lies cyclically at or before the hole) move into it. */
static void remove_at(struct server_peers *p, uint64_t hole)
{
    for (uint64_t i = (hole + 1) & p->mask; p->slots[i].conns; i = (i + 1) & p->mask) {
        uint64_t h = home(p, &p->slots[i].peer);
        int stays = hole < i ? (hole < h && h <= i) : (hole < h || h <= i);
        if (stays)
            continue;
        p->slots[hole] = p->slots[i];
        hole = i;
    }
    p->slots[hole].conns = 0;
}

void server_peers_give(struct server_peers *p, const struct server_peer *peer)
{
    pthread_mutex_lock(&p->lock);
    uint64_t i = find(p, peer);
    if (p->slots[i].conns && --p->slots[i].conns == 0)
        remove_at(p, i);
    pthread_mutex_unlock(&p->lock);
}

uint32_t server_peers_count(struct server_peers *p, const struct server_peer *peer)
{
    pthread_mutex_lock(&p->lock);
    uint32_t n = p->slots[find(p, peer)].conns;
    pthread_mutex_unlock(&p->lock);
    return n;
}
