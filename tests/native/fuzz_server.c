/*
 * fuzz_server.c - byte streams into a real server connection, not just the
 * frame parser: an in-process gdrkv server (started once, with its worker
 * threads) gets each input on a fresh connection, tcp or unix (the first
 * byte picks), written as it comes, then the write side shut. The target
 * reads whatever the server answers until it closes the connection.
 *
 * Invariants, after every input:
 * - the server never crashes (ASan and UBSan watch its threads too) and
 *   never hangs: the connection ends within CONN_DEADLINE_MS;
 * - everything it sends is a sequence of well-formed answers (magic,
 *   version, a response opcode, lengths within the protocol's limits);
 * - once the connection is gone it holds nothing for it: no pinned object
 *   (GET pins, leases), no reservation.
 *
 * Built two ways, like the other targets (fuzz_driver.h): with gcc and the
 * driver in `make check`, and with clang -fsanitize=fuzzer for libFuzzer's
 * coverage-guided search (`make libfuzzer`, which the suite runs briefly;
 * run ./build/libfuzz_server -max_total_time=600 by hand for longer).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FUZZ_NAME "fuzz_server"
#include "fuzz_driver.h"
#include "common/net.h"
#include "common/protocol.h"
#include "gdrkv.h"

#define CONN_DEADLINE_MS 5000
#define FUZZ_NS "fz"

static gdrkv_server *server;
static struct gk_addr tcp_addr;
static char unix_path[GK_UNIX_PATH_MAX];

static void start_server(void)
{
    static char dir[] = "/tmp/gdrkv-fuzz-XXXXXX";
    char err[300], address[64];
    gdrkv_server_opts o;

    check(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(unix_path, sizeof unix_path, "%s/s.sock", dir);
    gdrkv_server_opts_init(&o);
    o.listen = "127.0.0.1:0";
    o.memory_bytes = 16 << 20;
    o.pretouch = 0;
    o.workers = 2;
    o.rdma = 0;
    o.unix_path = unix_path;
    o.stall_timeout_ms = 1000;
    o.lease_timeout_ms = 1000;
    check(gdrkv_server_start(&o, &server, err, sizeof err) == 0, err);
    gdrkv_server_address(server, address, sizeof address);
    check(gk_parse_addr(address, 0, &tcp_addr) == 0, "server address");
}

static uint64_t stat_of(const char *name)
{
    static char text[16 << 10];
    check(gdrkv_server_stats(server, text, sizeof text) > 0, "stats");
    size_t len = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
        if (!strncmp(p, name, len) && p[len] == ' ')
            return strtoull(p + len + 1, NULL, 10);
    check(0, "a counter the server does not report");
    return 0;
}

/* Checks the answers in buf[0, len) are whole, well-formed frames, but for
 * the last one, which may be cut short by the server closing. */
static void check_answers(const uint8_t *buf, size_t len)
{
    size_t off = 0;
    while (len - off >= GK_HDR_SIZE) {
        struct gk_hdr h;
        gk_hdr_decode(buf + off, &h);
        check(h.magic == GK_MAGIC && h.version == GK_VERSION, "answer header");
        check(h.opcode & GK_OP_RESPONSE, "answer opcode");
        check(h.body_len <= GK_MAX_BODY + 64 && h.payload_len <= GK_MAX_PAYLOAD, "answer size");
        check(h.status <= 1, "answer status");
        uint64_t frame = GK_HDR_SIZE + (uint64_t)h.body_len + h.payload_len;
        if (frame > len - off)
            return;
        off += frame;
    }
}

/* Sends what it can without blocking and reads everything the server says,
 * until it closes; returns the bytes read into buf (capped). */
static size_t converse(int fd, const uint8_t *data, size_t size, uint8_t *buf, size_t cap)
{
    size_t sent = 0, got = 0;
    int shut = 0;
    uint64_t deadline = gk_now_ns() + CONN_DEADLINE_MS * 1000000ull;
    for (;;) {
        if (!shut && sent == size) {
            shutdown(fd, SHUT_WR);
            shut = 1;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN | (shut ? 0 : POLLOUT)};
        int n = poll(&p, 1, gk_poll_ms_left(deadline));
        if (n < 0 && errno == EINTR)
            continue;           /* libFuzzer's SIGALRM, once a second */
        if (n <= 0) {
            static char text[16 << 10];
            gdrkv_server_stats(server, text, sizeof text);
            fprintf(stderr, "sent %zu of %zu bytes, read %zu; the server's stats:\n%s", sent,
                    size, got, text);
        }
        check(n > 0, "the server neither answered nor closed in time");
        if (p.revents & POLLOUT) {
            ssize_t w = send(fd, data + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0)
                sent += (size_t)w;
            else if (w < 0 && errno != EAGAIN)
                shut = 1;        /* closed on us: read what it said */
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            uint8_t sink[1 << 16];
            uint8_t *into = got < cap ? buf + got : sink;
            size_t room = got < cap ? cap - got : sizeof sink;
            ssize_t r = recv(fd, into, room, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
                return got;
            if (r > 0 && into != sink)
                got += (size_t)r;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t answers[1 << 20];
    if (!server)
        start_server();
    if (size == 0)
        return 0;
    int fd = data[0] & 1 ? gk_connect_unix(unix_path)
                         : gk_connect_tcp(&tcp_addr, gk_now_ns() + 2000000000ull);
    check(fd >= 0, "connect to the server");
    size_t got = converse(fd, data + 1, size - 1, answers, sizeof answers);
    /* Both sides have said all: a reset instead of a FIN leaves no
     * TIME_WAIT behind, which thousands of connections a second would
     * otherwise pile up. */
    struct linger reset = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    close(fd);
    check_answers(answers, got);
    /* The server closed the connection, or saw it end: closing releases
     * its holds before the socket goes (server_conn_close), but seeing our
     * end takes its worker a moment. */
    uint64_t deadline = gk_now_ns() + CONN_DEADLINE_MS * 1000000ull;
    while (stat_of("pinned_objects") || stat_of("reserved_objects")) {
        check(gk_now_ns() < deadline, "holds left after the connection ended");
        usleep(1000);
    }
    return 0;
}

#ifndef GK_LIBFUZZER

/* One well-formed request of a random op, appended at buf + len. */
static size_t add_frame(uint8_t *buf, size_t len, size_t cap)
{
    static const uint8_t ops[] = {GK_OP_PING, GK_OP_EXISTS, GK_OP_GET, GK_OP_PUT,
                                  GK_OP_DELETE, GK_OP_STATS, GK_OP_CLEAR, GK_OP_HELLO,
                                  GK_OP_LEASE, GK_OP_RELEASE, GK_OP_RESERVE, GK_OP_COMMIT,
                                  GK_OP_AUTH, GK_OP_PINS};
    uint8_t op = ops[rnd() % GK_ARRAY_LEN(ops)];
    uint32_t n = gk_op_is_keyed(op) && op != GK_OP_CLEAR ? 1 + (uint32_t)(rnd() % 4) : 0;
    uint8_t keys[4 * 2];            /* "k0".."k7", concatenated */
    uint32_t kl[4];
    uint64_t sizes[4], payload = 0;
    for (uint32_t i = 0; i < n; i++) {
        keys[2 * i] = 'k';
        keys[2 * i + 1] = (uint8_t)('0' + rnd() % 8);
        kl[i] = 2;
        sizes[i] = 1 + rnd() % 5000;
        payload += op == GK_OP_PUT ? sizes[i] : 0;
    }
    struct gk_ns ns = {(const uint8_t *)FUZZ_NS, sizeof FUZZ_NS - 1};
    uint32_t body = gk_op_is_keyed(op) ? (uint32_t)gk_request_body_size(ns.len, n, kl)
                    : op == GK_OP_COMMIT ? (uint32_t)(rnd() % 4)
                    : op == GK_OP_AUTH   ? GK_AUTH_NONCE_SIZE
                    : op == GK_OP_PINS   ? GK_PINS_BODY_SIZE
                                         : 0;
    if (len + GK_HDR_SIZE + body + payload > cap)
        return len;
    struct gk_hdr h = {.magic = GK_MAGIC, .version = GK_VERSION, .opcode = op,
                       .count = op == GK_OP_COMMIT ? body : n, .body_len = body,
                       .payload_len = payload, .req_id = rnd()};
    gk_hdr_encode(&h, buf + len);
    uint8_t *p = buf + len + GK_HDR_SIZE;
    if (gk_op_is_keyed(op)) {
        gk_encode_request_body(p, &ns, n, keys, kl, sizes);
    } else if (op == GK_OP_PINS) {
        /* A few mappings, seqs and byte counts, some past the pool. */
        struct gk_pins r = {1 + rnd() % 12, rnd() % 4, (rnd() % 3) << (20 + rnd() % 20)};
        gk_pins_encode(p, &r);
    } else {
        for (uint32_t i = 0; i < body; i++)
            p[i] = (uint8_t)(rnd() % 2);
    }
    for (uint64_t i = 0; i < payload; i++)
        p[body + i] = (uint8_t)rnd();
    return len + GK_HDR_SIZE + body + payload;
}

static size_t make_valid(uint8_t *buf, size_t cap)
{
    buf[0] = (uint8_t)(rnd() % 2);          /* tcp or unix */
    size_t len = 1;
    for (int frames = 1 + (int)(rnd() % 6); frames > 0; frames--)
        len = add_frame(buf, len, cap);
    return len;
}

static size_t mutate_once(uint8_t *buf, size_t len, size_t cap)
{
    /* Keep the transport byte; cut or flip anywhere in the stream. */
    if (len < 2)
        return len;
    return 1 + mutate_bytes(buf + 1, len - 1, cap - 1);
}

/* --seeds DIR N: writes N well-formed inputs into DIR, libFuzzer's seed
 * corpus (make libfuzzer). */
static int write_seeds(const char *dir, int n, uint8_t *buf, size_t cap)
{
    rng_state = 0x5eed;
    for (int i = 0; i < n; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/seed-%03d", dir, i);
        FILE *f = fopen(path, "wb");
        check(f != NULL, "a seed file");
        size_t len = make_valid(buf, cap);
        check(fwrite(buf, 1, len, f) == len && fclose(f) == 0, "writing a seed");
    }
    return 0;
}

int main(int argc, char **argv)
{
    static uint8_t buf[1 << 16];
    if (argc == 4 && !strcmp(argv[1], "--seeds"))
        return write_seeds(argv[2], atoi(argv[3]), buf, sizeof buf);
    int rc = fuzz_main(argc, argv, buf, sizeof buf, 4);
    gdrkv_server_stop(server);
    return rc;
}

#endif
