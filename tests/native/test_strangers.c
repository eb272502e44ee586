/*
 * test_strangers.c - the budget of connections before AUTH
 * (native/server/server_strangers.c): the per-address cap, the total, and
 * when it is full, which stranger gives way to a newcomer: the oldest of
 * the address with most, and only to an address with at least two fewer.
 * Each stranger is one end of a socketpair, so an eviction is seen as the
 * other end reading EOF.
 */
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "server/server_strangers.h"

#define MAX 4

struct end {
    int fds[2];                 /* [0] the server's, [1] the peer's */
    struct server_stranger who;
};

static struct server_peer address(int i)
{
    struct server_peer p = {0};
    p.addr[10] = p.addr[11] = 0xff;
    p.addr[12] = 127;
    p.addr[15] = (uint8_t)i;
    return p;
}

static enum server_stranger_take dial(struct server_strangers *t, struct end *e, int from)
{
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, e->fds) == 0, "socketpair");
    struct server_peer p = address(from);
    return server_strangers_take(t, &e->who, &p, e->fds[0]);
}

/* Whether the server's end was shut down (the peer reads EOF at once). */
static int was_shut(struct end *e)
{
    char c;
    return recv(e->fds[1], &c, 1, MSG_DONTWAIT) == 0;
}

static void hang_up(struct server_strangers *t, struct end *e)
{
    server_strangers_give(t, &e->who);
    close(e->fds[0]);
    close(e->fds[1]);
}

static void test_per_address_cap(void)
{
    struct server_strangers *t = server_strangers_new(16, 2);
    struct end e[3];
    CHECK_EQ(dial(t, &e[0], 1), STRANGER_TAKEN);
    CHECK_EQ(dial(t, &e[1], 1), STRANGER_TAKEN);
    CHECK_EQ(dial(t, &e[2], 1), STRANGER_REFUSED);
    close(e[2].fds[0]);
    close(e[2].fds[1]);
    hang_up(t, &e[0]);
    CHECK_EQ(server_strangers_count(t), 1u);
    CHECK_EQ(dial(t, &e[0], 1), STRANGER_TAKEN);
    hang_up(t, &e[0]);
    hang_up(t, &e[1]);
    CHECK_EQ(server_strangers_count(t), 0u);
    server_strangers_free(t);
}

static void test_full_budget_evens_addresses_out(void)
{
    struct server_strangers *t = server_strangers_new(MAX, MAX);
    struct end a[MAX], b[2], c, d, e;
    for (int i = 0; i < MAX; i++)
        CHECK_EQ(dial(t, &a[i], 1), STRANGER_TAKEN);
    /* Full of address 1: a newcomer from 2 takes 1's oldest. */
    CHECK_EQ(dial(t, &b[0], 2), STRANGER_TAKEN_EVICTING);
    CHECK(was_shut(&a[0]) && !a[0].who.listed, "the oldest of the fullest address ended");
    CHECK(!was_shut(&a[1]), "only the oldest");
    CHECK_EQ(server_strangers_count(t), (uint32_t)MAX);
    /* 3 against 1: address 2 (with 1) takes another, 3 >= 1 + 2. */
    CHECK_EQ(dial(t, &b[1], 2), STRANGER_TAKEN_EVICTING);
    CHECK(was_shut(&a[1]), "the next oldest of address 1");
    /* 2 and 2: nobody has two more than a newcomer from 2 (with 2). */
    CHECK_EQ(dial(t, &c, 2), STRANGER_REFUSED);
    close(c.fds[0]);
    close(c.fds[1]);
    /* A third address (0 of them) still gets in: 2 >= 0 + 2. */
    CHECK_EQ(dial(t, &c, 3), STRANGER_TAKEN_EVICTING);
    CHECK_EQ(dial(t, &d, 4), STRANGER_TAKEN_EVICTING);
    CHECK(was_shut(&b[0]) && !was_shut(&a[3]), "the oldest of the fullest (2 of address 2)");
    /* Now 1, 1, 1, 1: the next address is refused, none is evicted. */
    CHECK_EQ(dial(t, &e, 5), STRANGER_REFUSED);
    close(e.fds[0]);
    close(e.fds[1]);
    CHECK_EQ(server_strangers_count(t), (uint32_t)MAX);
    /* Evicted ones give nothing back twice; the others give theirs. */
    for (int i = 0; i < MAX; i++)
        hang_up(t, &a[i]);
    hang_up(t, &b[0]);
    hang_up(t, &b[1]);
    hang_up(t, &c);
    hang_up(t, &d);
    CHECK_EQ(server_strangers_count(t), 0u);
    server_strangers_free(t);
}

/* IPv6 addresses of one /64 are one address here; another /64 is not. */
static void test_ipv6_counts_by_64(void)
{
    struct server_strangers *t = server_strangers_new(16, 2);
    struct end e[4];
    struct server_peer p = {{0x20, 0x01, 0x0d, 0xb8}};
    for (int i = 0; i < 4; i++) {
        CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, e[i].fds) == 0, "socketpair");
        p.addr[15] = (uint8_t)(i + 1);          /* another host part each time */
        p.addr[7] = i == 3;                     /* the last in another /64 */
        enum server_stranger_take want = i == 2 ? STRANGER_REFUSED : STRANGER_TAKEN;
        CHECK_EQ(server_strangers_take(t, &e[i].who, &p, e[i].fds[0]), want);
    }
    for (int i = 0; i < 4; i++)
        hang_up(t, &e[i]);
    CHECK_EQ(server_strangers_count(t), 0u);
    server_strangers_free(t);
}

int main(void)
{
    RUN(test_per_address_cap);
    RUN(test_full_budget_evens_addresses_out);
    RUN(test_ipv6_counts_by_64);
    return check_done("test_strangers");
}
