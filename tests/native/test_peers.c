/*
 * test_peers.c - the per-peer connection table against a plain model:
 * random takes and gives over many peers whose homes collide (a small
 * table), so backward-shift deletion is exercised at every position.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "server/server_peers.h"

#define PEERS 300
#define CAP 3

static struct server_peer peer(int i)
{
    struct server_peer p = {0};
    p.addr[10] = p.addr[11] = 0xff;
    p.addr[12] = 10;
    p.addr[14] = (uint8_t)(i >> 8);
    p.addr[15] = (uint8_t)i;
    return p;
}

static void test_model(void)
{
    /* Room for PEERS * CAP connections: the table has 2x that in slots. */
    struct server_peers *t = server_peers_new(PEERS * CAP, CAP);
    CHECK(t, "new");
    uint32_t model[PEERS] = {0};
    srand(7);
    for (int step = 0; step < 200000; step++) {
        int i = rand() % PEERS;
        struct server_peer p = peer(i);
        if (rand() % 2) {
            int rc = server_peers_take(t, &p);
            CHECK_EQ(rc, model[i] < CAP ? 0 : -1);
            model[i] += rc == 0;
        } else if (model[i]) {
            server_peers_give(t, &p);
            model[i]--;
        }
        if (step % 997 == 0)
            for (int j = 0; j < PEERS; j++) {
                struct server_peer q = peer(j);
                CHECK_EQ(server_peers_count(t, &q), model[j]);
            }
    }
    /* Everyone leaves: nothing is left behind. */
    for (int i = 0; i < PEERS; i++) {
        struct server_peer p = peer(i);
        while (model[i]--)
            server_peers_give(t, &p);
        CHECK_EQ(server_peers_count(t, &p), 0u);
    }
    server_peers_free(t);
}

static void test_cap_per_peer(void)
{
    struct server_peers *t = server_peers_new(16, 2);
    struct server_peer a = peer(1), b = peer(2);
    CHECK_EQ(server_peers_take(t, &a), 0);
    CHECK_EQ(server_peers_take(t, &a), 0);
    CHECK_EQ(server_peers_take(t, &a), -1);
    CHECK_EQ(server_peers_take(t, &b), 0);
    server_peers_give(t, &a);
    CHECK_EQ(server_peers_take(t, &a), 0);
    CHECK_EQ(server_peers_count(t, &a), 2u);
    server_peers_free(t);
}

int main(void)
{
    RUN(test_model);
    RUN(test_cap_per_peer);
    return check_done("test_peers");
}
