/*
 * fuzz_members.c - fuzz target for a client's members as they arrive from
 * the cluster (etcd entries, through the watcher): gdrkv_place and
 * gdrkv_client_set_members on arbitrary addresses, capacities, zones and
 * flags. Either the table is refused (INVALID, the old one kept), or the
 * placement holds: as many candidates as asked and there are members not
 * leaving, distinct, in range, none leaving, the same on every call; and
 * set_members agrees with gdrkv_place on what is valid.
 *
 * The input is lines of "addr\tcapacity\tzone\tleaving"; the first byte
 * is the replica count. Built like fuzz_protocol.c: libFuzzer with clang,
 * else the driver of fuzz_driver.h for a bounded time under ASan/UBSan.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz_members"
#include "fuzz_driver.h"
#include "gdrkv.h"

#define MAX_MEMBERS 16
#define MAX_TEXT 4096

static gdrkv_client *client;

static void open_client(void)
{
    gdrkv_client_opts o;
    char err[256];
    gdrkv_client_opts_init(&o);
    o.servers = "";
    o.members_later = 1;
    o.transport = GDRKV_TRANSPORT_TCP;
    check(gdrkv_client_open(&o, &client, err, sizeof err) == 0, "client opens");
}

/* Splits text (NUL-terminated, modified) into members; returns how many. */
static uint32_t parse(char *text, gdrkv_member *m)
{
    uint32_t n = 0;
    char *line, *rest = text;
    while (n < MAX_MEMBERS && (line = strsep(&rest, "\n"))) {
        char *addr = strsep(&line, "\t"), *cap = strsep(&line, "\t");
        char *zone = strsep(&line, "\t"), *leaving = line;
        m[n++] = (gdrkv_member){.addr = addr,
                                .capacity = cap ? strtoull(cap, NULL, 10) : 1,
                                .zone = zone,
                                .leaving = leaving && *leaving == '1'};
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char text[MAX_TEXT + 1];
    gdrkv_member m[MAX_MEMBERS];
    uint32_t out[8], again[8];
    char err[256];

    if (!client)
        open_client();
    if (size < 1 || size > MAX_TEXT)
        return 0;
    uint32_t replicas = 1 + data[0] % 8;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    uint32_t n = parse(text, m);

    int got = gdrkv_place("key", 3, m, n, replicas, out);
    int rc = gdrkv_client_set_members(client, m, n, err, sizeof err);
    check((got >= 0) == (rc == 0), "set_members and gdrkv_place agree on what is valid");
    if (got < 0) {
        check(got == GDRKV_E_INVALID && rc == GDRKV_E_INVALID, "a bad table is INVALID");
        return 0;
    }
    uint32_t writable = 0;
    for (uint32_t i = 0; i < n; i++)
        writable += !m[i].leaving;
    check((uint32_t)got == (replicas < writable ? replicas : writable), "as many as asked");
    check(gdrkv_place("key", 3, m, n, replicas, again) == got, "the same count again");
    for (int i = 0; i < got; i++) {
        check(out[i] < n && !m[out[i]].leaving, "a member not leaving");
        check(again[i] == out[i], "the same order again");
        for (int j = 0; j < i; j++)
            check(out[i] != out[j], "distinct members");
    }
    check(gdrkv_client_nservers(client) == n, "the table installed");
    return 0;
}

#ifndef GK_LIBFUZZER
static size_t make_valid(uint8_t *buf, size_t cap)
{
    static const char *zones[] = {"", "a", "b", "rack-1"};
    uint32_t n = (uint32_t)(rnd() % MAX_MEMBERS);
    size_t len = 0;
    buf[len++] = (uint8_t)rnd();
    for (uint32_t i = 0; i < n && len + 80 < cap; i++) {
        len += (size_t)snprintf((char *)buf + len, cap - len, "%s10.0.%u.%u:%u\t%llu\t%s\t%u",
                                i ? "\n" : "", (unsigned)(rnd() % 3), (unsigned)(rnd() % 5),
                                (unsigned)(7000 + rnd() % 4),
                                (unsigned long long)(1 + rnd() % (1ull << 40)),
                                zones[rnd() % 4], (unsigned)(rnd() % 4 == 0));
    }
    return len;
}

static size_t mutate_once(uint8_t *buf, size_t len, size_t cap)
{
    return mutate_bytes(buf, len, cap);
}

int main(int argc, char **argv)
{
    static uint8_t buf[MAX_TEXT];
    int rc = fuzz_main(argc, argv, buf, sizeof buf, 4);
    gdrkv_client_close(client);
    return rc;
}
#endif
