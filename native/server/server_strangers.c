/*
 * server_strangers.c - see server_strangers.h. The table is an array of
 * addresses (each holding at least one slot, so at most max of them) with
 * a list of its strangers each; lookups scan it, which costs a few
 * microseconds at the largest budgets and happens once per connection.
 */
#include "server_strangers.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

struct stranger_address {
    struct server_peer peer;
    uint32_t count;                         /* 0: the entry is free */
    struct server_stranger *oldest, *newest;
};

struct server_strangers {
    pthread_mutex_t lock;
    uint32_t max, per_peer, taken;
    struct stranger_address *addresses;     /* max of them */
};

struct server_strangers *server_strangers_new(uint32_t max, uint32_t per_peer)
{
    struct server_strangers *t = calloc(1, sizeof *t);
    if (!t || !(t->addresses = calloc(max ? max : 1, sizeof *t->addresses)) ||
        pthread_mutex_init(&t->lock, NULL)) {
        if (t)
            free(t->addresses);
        free(t);
        return NULL;
    }
    t->max = max;
    t->per_peer = per_peer;
    return t;
}

void server_strangers_free(struct server_strangers *t)
{
    if (!t)
        return;
    pthread_mutex_destroy(&t->lock);
    free(t->addresses);
    free(t);
}

/* Lock held for all below. */

static void unlist(struct server_strangers *t, struct server_stranger *who)
{
    struct stranger_address *a = &t->addresses[who->at];
    if (who->older)
        who->older->newer = who->newer;
    else
        a->oldest = who->newer;
    if (who->newer)
        who->newer->older = who->older;
    else
        a->newest = who->older;
    who->older = who->newer = NULL;
    who->listed = 0;
    a->count--;
    t->taken--;
}

static void list_at(struct server_strangers *t, uint32_t at, const struct server_peer *peer,
                    struct server_stranger *who, int fd)
{
    struct stranger_address *a = &t->addresses[at];
    if (a->count == 0)
        a->peer = *peer;
    *who = (struct server_stranger){.older = a->newest, .fd = fd, .at = at, .listed = 1};
    if (a->newest)
        a->newest->newer = who;
    else
        a->oldest = who;
    a->newest = who;
    a->count++;
    t->taken++;
}

/* The address a stranger counts under: an IPv4 address, or an IPv6 one's
 * /64 (one host is given a whole /64, so counting its addresses apart
 * would give it 2^64 shares). */
static struct server_peer counted_as(const struct server_peer *peer)
{
    static const uint8_t v4_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    struct server_peer p = *peer;
    if (memcmp(p.addr, v4_mapped, sizeof v4_mapped))
        memset(p.addr + 8, 0, 8);
    return p;
}

enum server_stranger_take server_strangers_take(struct server_strangers *t,
                                                struct server_stranger *who,
                                                const struct server_peer *given, int fd)
{
    enum server_stranger_take got = STRANGER_REFUSED;
    struct server_peer key = counted_as(given);
    const struct server_peer *peer = &key;

    *who = (struct server_stranger){.fd = -1};     /* giving a refused one back is a no-op */
    uint32_t mine = t->max, free_entry = t->max, most = t->max;

    pthread_mutex_lock(&t->lock);
    for (uint32_t i = 0; i < t->max; i++) {
        const struct stranger_address *a = &t->addresses[i];
        if (a->count == 0) {
            free_entry = free_entry < t->max ? free_entry : i;
            continue;
        }
        if (!memcmp(&a->peer, peer, sizeof *peer))
            mine = i;
        if (most == t->max || a->count > t->addresses[most].count)
            most = i;
    }
    uint32_t have = mine < t->max ? t->addresses[mine].count : 0;
    if (have >= t->per_peer)
        goto out;
    if (t->taken >= t->max) {
        /* Full: only an address with at least two more than ours gives one
         * up, so evictions even the addresses out and never swing back. */
        if (most == t->max || t->addresses[most].count < have + 2)
            goto out;
        struct server_stranger *victim = t->addresses[most].oldest;
        shutdown(victim->fd, SHUT_RDWR);
        unlist(t, victim);
        if (t->addresses[most].count == 0)
            free_entry = most;
        got = STRANGER_TAKEN_EVICTING;
    } else {
        got = STRANGER_TAKEN;
    }
    list_at(t, mine < t->max ? mine : free_entry, peer, who, fd);
out:
    pthread_mutex_unlock(&t->lock);
    return got;
}

void server_strangers_give(struct server_strangers *t, struct server_stranger *who)
{
    pthread_mutex_lock(&t->lock);
    if (who->listed)
        unlist(t, who);
    pthread_mutex_unlock(&t->lock);
}

uint32_t server_strangers_count(struct server_strangers *t)
{
    pthread_mutex_lock(&t->lock);
    uint32_t n = t->taken;
    pthread_mutex_unlock(&t->lock);
    return n;
}
