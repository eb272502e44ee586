/*
 * test_server.c - the server (native/server*.c over the real store), driven
 * through plain blocking sockets byte by byte as a client would, including
 * clients that misbehave: bad frames, dying mid-payload, stalling, never
 * reading their response. Every socket has a receive/send timeout, so a
 * server bug fails a check instead of hanging the run.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "check.h"
#include "common/common.h"
#include "gdrkv.h"
#include "common/net.h"
#include "common/protocol.h"

#define POOL_BYTES (64ull << 20)
#define STALL_MS 800
#define CONCURRENT 200
#define BIG (3u << 20)      /* spans several slab pages: a multi-chunk object */
#define MAX_KEYS 8

/* ------------------------------------------------------------ server side */

static gdrkv_server *srv;

static gdrkv_server *start_server_leasing(uint32_t max_connections, uint32_t lease_timeout_ms)
{
    gdrkv_server_opts o;
    gdrkv_server *s = NULL;
    char err[256] = "";

    gdrkv_server_opts_init(&o);
    o.listen = "127.0.0.1:0";
    o.memory_bytes = POOL_BYTES;
    o.workers = 2;
    o.pretouch = 0;
    o.hugepages = 0;
    o.stall_timeout_ms = STALL_MS;
    o.max_connections = max_connections;
    o.lease_timeout_ms = lease_timeout_ms;
    CHECK(gdrkv_server_start(&o, &s, err, sizeof err) == 0, "server start: %s", err);
    return s;
}

static gdrkv_server *start_server(uint32_t max_connections)
{
    return start_server_leasing(max_connections, 5000);
}

/* One counter from the server's stats text; -1 when absent. */
static int64_t stat_of(gdrkv_server *s, const char *name)
{
    char text[16384], *line, *save;
    size_t name_len = strlen(name);

    CHECK(gdrkv_server_stats(s, text, sizeof text) > 0, "stats");
    for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        if (!strncmp(line, name, name_len) && line[name_len] == ' ')
            return strtoll(line + name_len + 1, NULL, 10);
    return -1;
}

/* Waits up to 3 s for a counter to reach value: the server works on its
 * own threads, so what a client did shows up there a little later. */
static void wait_stat(gdrkv_server *s, const char *name, int64_t value)
{
    for (int i = 0; i < 300 && stat_of(s, name) != value; i++)
        usleep(10000);
    CHECK_EQ(stat_of(s, name), value);
}

/* ------------------------------------------------------------ client side */

static int connect_to(gdrkv_server *s)
{
    char addr[64];
    struct gk_addr a;
    struct sockaddr_in sin = {.sin_family = AF_INET};
    struct timeval tv = {.tv_sec = 10};

    CHECK(gdrkv_server_address(s, addr, sizeof addr) == 0, "address");
    CHECK(gk_parse_addr(addr, 0, &a) == 0, "address %s", addr);
    sin.sin_port = htons(a.port);
    inet_pton(AF_INET, a.host, &sin.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&sin, sizeof sin) == 0, "connect: %s",
          strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    return fd;
}

static void send_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        CHECK(n > 0, "send: %s", strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

static void recv_all(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        CHECK(n > 0, "recv: %s", n == 0 ? "closed" : strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

/* Drops whatever is still unread and checks the server then closed the
 * connection (EOF or reset) rather than the read timing out. */
static void expect_closed(int fd)
{
    char buf[65536];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0)
        ;
    CHECK(n == 0 || errno == ECONNRESET, "connection still open: %s", strerror(errno));
    close(fd);
}

struct request {
    uint8_t opcode;
    const char *ns;
    uint32_t n;
    const char *keys[MAX_KEYS];
    uint64_t sizes[MAX_KEYS];           /* PUT value lengths, GET capacities */
    const uint8_t *values[MAX_KEYS];    /* PUT only */
};

static uint8_t *encode_request(const struct request *r, uint64_t req_id, size_t *len)
{
    struct gk_ns ns = {.name = (const uint8_t *)r->ns, .len = (uint32_t)strlen(r->ns)};
    uint32_t key_lens[MAX_KEYS];
    char keys[MAX_KEYS * 64];
    size_t keys_len = 0;
    uint64_t payload = 0;

    for (uint32_t i = 0; i < r->n; i++) {
        key_lens[i] = (uint32_t)strlen(r->keys[i]);
        memcpy(keys + keys_len, r->keys[i], key_lens[i]);
        keys_len += key_lens[i];
        if (r->opcode == GK_OP_PUT)
            payload += r->sizes[i];
    }
    uint64_t body_len =
        gk_op_is_keyed(r->opcode) ? gk_request_body_size(ns.len, r->n, key_lens) : 0;
    uint8_t *frame = malloc(GK_HDR_SIZE + body_len + payload);
    struct gk_hdr h = {.magic = GK_MAGIC, .version = GK_VERSION, .opcode = r->opcode,
                       .count = r->n, .body_len = (uint32_t)body_len, .payload_len = payload,
                       .req_id = req_id};
    CHECK(frame, "malloc");
    gk_hdr_encode(&h, frame);
    if (body_len)
        gk_encode_request_body(frame + GK_HDR_SIZE, &ns, r->n, (const uint8_t *)keys, key_lens,
                               r->sizes);
    uint8_t *p = frame + GK_HDR_SIZE + body_len;
    for (uint32_t i = 0; r->opcode == GK_OP_PUT && i < r->n; i++) {
        memcpy(p, r->values[i], r->sizes[i]);
        p += r->sizes[i];
    }
    *len = GK_HDR_SIZE + body_len + payload;
    return frame;
}

static void send_request(int fd, const struct request *r, uint64_t req_id)
{
    size_t len;
    uint8_t *frame = encode_request(r, req_id, &len);
    send_all(fd, frame, len);
    free(frame);
}

struct response {
    struct gk_hdr h;
    uint8_t *body;                  /* NUL-terminated, for text bodies */
    uint8_t *payload;
    struct gk_result results[MAX_KEYS];
};

static void read_response(int fd, struct response *r)
{
    uint8_t raw[GK_HDR_SIZE];

    recv_all(fd, raw, sizeof raw);
    gk_hdr_decode(raw, &r->h);
    CHECK(r->h.magic == GK_MAGIC && r->h.body_len <= GK_MAX_BODY && r->h.count <= MAX_KEYS &&
          r->h.payload_len <= 64ull * BIG, "sane response header");
    r->body = calloc(1, r->h.body_len + 1);
    r->payload = malloc(r->h.payload_len + 1);
    CHECK(r->body && r->payload, "malloc");
    recv_all(fd, r->body, r->h.body_len);
    recv_all(fd, r->payload, r->h.payload_len);
    if (r->h.status == 0 && r->h.opcode != (GK_OP_STATS | GK_OP_RESPONSE)) {
        CHECK_EQ(r->h.body_len, r->h.count * GK_RESULT_SIZE);
        for (uint32_t i = 0; i < r->h.count; i++)
            gk_result_decode(r->body + i * GK_RESULT_SIZE, &r->results[i]);
    }
}

static void free_response(struct response *r)
{
    free(r->body);
    free(r->payload);
}

/* Sends r and reads the response, which must answer it. */
static void call(int fd, const struct request *r, struct response *resp)
{
    static uint64_t next_id = 1;
    uint64_t id = next_id++;
    send_request(fd, r, id);
    read_response(fd, resp);
    CHECK_EQ(resp->h.req_id, id);
    CHECK_EQ(resp->h.opcode, r->opcode | GK_OP_RESPONSE);
}

/* Calls r on a fresh connection and checks each key's status. */
static void expect_statuses(const struct request *r, const int32_t *status)
{
    int fd = connect_to(srv);
    struct response resp;
    call(fd, r, &resp);
    CHECK_EQ(resp.h.status, 0);
    CHECK_EQ(resp.h.count, r->n);
    for (uint32_t i = 0; i < r->n; i++)
        CHECK(resp.results[i].status == status[i], "key %s: status %d, expected %d", r->keys[i],
              resp.results[i].status, status[i]);
    free_response(&resp);
    close(fd);
}

/* A raw 40-byte header, for frames no well-behaved client would send. */
static void raw_header(uint8_t out[GK_HDR_SIZE], uint32_t magic, uint8_t opcode, uint32_t count,
                       uint32_t body_len, uint64_t payload_len)
{
    struct gk_hdr h = {.magic = magic, .version = GK_VERSION, .opcode = opcode, .count = count,
                       .body_len = body_len, .payload_len = payload_len, .req_id = 77};
    gk_hdr_encode(&h, out);
}

static void fill_random(uint8_t *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)check_rand(&seed);
}

static uint8_t val_small[100], val_mid[5000], *val_big;

static void put_big(int fd, const char *ns, const char *key)
{
    struct request put = {.opcode = GK_OP_PUT, .ns = ns, .n = 1, .keys = {key}, .sizes = {BIG},
                          .values = {val_big}};
    struct response r;
    call(fd, &put, &r);
    CHECK_EQ(r.results[0].status, 0);
    free_response(&r);
}

/* Asks for a big object several times over and never reads the answer:
 * more than the socket buffers hold, so the server stays mid-write. */
static void request_unread_gets(int fd, const char *ns, const char *key)
{
    struct request get = {.opcode = GK_OP_GET, .ns = ns, .n = MAX_KEYS};
    for (int i = 0; i < MAX_KEYS; i++)
        get.keys[i] = key, get.sizes[i] = BIG;
    send_request(fd, &get, 1);
}

/* Sends a PUT of a 1 MiB value, but only half of the value. */
static int start_half_put(gdrkv_server *s, const char *key)
{
    struct request put = {.opcode = GK_OP_PUT, .ns = "h", .n = 1, .keys = {key},
                          .sizes = {1u << 20}, .values = {val_big}};
    size_t len;
    uint8_t *frame = encode_request(&put, 9, &len);
    int fd = connect_to(s);
    send_all(fd, frame, len - (512u << 10));
    free(frame);
    return fd;
}

/* ------------------------------------------------------------ tests */

static void test_options(void)
{
    gdrkv_server_opts o;
    gdrkv_server *s = NULL;
    char err[128] = "";

    gdrkv_server_opts_init(&o);
    CHECK(!strcmp(o.listen, "127.0.0.1:7480"), "default listen %s", o.listen);
    CHECK_EQ(o.memory_bytes, 1ull << 30);
    CHECK_EQ(o.workers, 0);
    CHECK_EQ(o.hugepages, -1);
    CHECK_EQ(o.pretouch, 1);
    CHECK(o.high_watermark == 0.95 && o.low_watermark == 0.90, "default watermarks");
    CHECK_EQ(o.stall_timeout_ms, 30000);
    CHECK_EQ(o.max_connections, 4096);
    CHECK(o.unix_path == NULL, "shm on the default path");
    CHECK_EQ(o.lease_timeout_ms, 5000);
    CHECK_EQ(o.max_connections_per_peer, 512);
    CHECK_EQ(o.idle_timeout_ms, 300000);
    CHECK_EQ(o.auth_timeout_ms, 1000);
    CHECK_EQ(o.max_unauthenticated, 512);
    CHECK_EQ(o.max_unauthenticated_per_peer, 64);
    CHECK_EQ(o.drain_timeout_ms, 5000);
    CHECK(o.metrics_listen == NULL, "no metrics endpoint by default");
    CHECK_EQ(o.max_buffered_bytes, 256ull << 20);
    CHECK(o.auth_token_file == NULL && o.insecure_no_auth == 0, "no token by default");

    o.lease_timeout_ms = 0;
    CHECK_EQ(gdrkv_server_start(&o, &s, err, sizeof err), GDRKV_E_INVALID);
    gdrkv_server_opts_init(&o);
    o.max_buffered_bytes = 1 << 20;             /* less than one largest body */
    CHECK_EQ(gdrkv_server_start(&o, &s, err, sizeof err), GDRKV_E_INVALID);
    /* A socket in a directory others may write is refused. */
    gdrkv_server_opts_init(&o);
    o.listen = "127.0.0.1:0";
    o.memory_bytes = 8 << 20;
    o.pretouch = 0;
    o.unix_path = "/tmp/gdrkv-test-refused.sock";
    CHECK_EQ(gdrkv_server_start(&o, &s, err, sizeof err), GDRKV_E_DENIED);
    CHECK(s == NULL && strstr(err, "/tmp"), "refused: %s", err);
    gdrkv_server_opts_init(&o);

    o.listen = "nonsense:port";
    CHECK_EQ(gdrkv_server_start(&o, &s, err, sizeof err), GDRKV_E_INVALID);
    CHECK(s == NULL && err[0], "no server, and a message");
    gdrkv_server_opts_init(&o);
    o.low_watermark = 0.99;
    CHECK_EQ(gdrkv_server_start(&o, &s, err, sizeof err), GDRKV_E_INVALID);
}

static void test_ping(void)
{
    int fd = connect_to(srv);
    struct request ping = {.opcode = GK_OP_PING, .ns = ""};
    struct response r;
    call(fd, &ping, &r);
    CHECK(r.h.status == 0 && r.h.count == 0 && r.h.body_len == 0 && r.h.payload_len == 0,
          "empty OK response");
    free_response(&r);
    close(fd);
}

static void test_put_get(void)
{
    int fd = connect_to(srv);
    struct response r;
    struct request put = {.opcode = GK_OP_PUT, .ns = "t", .n = 4,
                          .keys = {"small", "mid", "empty", "big"},
                          .sizes = {sizeof val_small, sizeof val_mid, 0, BIG},
                          .values = {val_small, val_mid, val_small, val_big}};
    call(fd, &put, &r);
    CHECK(r.h.status == 0 && r.h.count == 4 && r.h.payload_len == 0, "put response");
    for (int i = 0; i < 4; i++)
        CHECK_EQ(r.results[i].status, 0);
    free_response(&r);

    /* A miss and an object too big for its destination in the middle. */
    struct request get = {.opcode = GK_OP_GET, .ns = "t", .n = 5,
                          .keys = {"big", "nope", "mid", "empty", "small"},
                          .sizes = {BIG, 10, sizeof val_mid - 1, 0, 1000}};
    call(fd, &get, &r);
    CHECK(r.h.status == 0 && r.h.count == 5, "get response");
    CHECK(r.results[0].status == 0 && r.results[0].size == BIG, "big found");
    CHECK_EQ(r.results[1].status, GDRKV_E_NOT_FOUND);
    CHECK_EQ(r.results[2].status, GDRKV_E_TOO_SMALL);
    CHECK_EQ(r.results[2].size, sizeof val_mid);
    CHECK(r.results[3].status == 0 && r.results[3].size == 0, "empty found");
    CHECK(r.results[4].status == 0 && r.results[4].size == sizeof val_small, "small found");
    CHECK_EQ(r.h.payload_len, BIG + sizeof val_small);
    CHECK(memcmp(r.payload, val_big, BIG) == 0, "big value byte-exact");
    CHECK(memcmp(r.payload + BIG, val_small, sizeof val_small) == 0, "small value byte-exact");
    free_response(&r);
    close(fd);

    /* The same key in another namespace is another object. */
    struct request other = {.opcode = GK_OP_GET, .ns = "u", .n = 1, .keys = {"big"},
                            .sizes = {BIG}};
    expect_statuses(&other, (int32_t[]){GDRKV_E_NOT_FOUND});
    wait_stat(srv, "pinned_objects", 0);
}

static void test_put_if_absent(void)
{
    int fd = connect_to(srv);
    struct response r;
    uint8_t other[sizeof val_small];
    memset(other, 0xab, sizeof other);
    struct request put = {.opcode = GK_OP_PUT, .ns = "t", .n = 1, .keys = {"small"},
                          .sizes = {sizeof other}, .values = {other}};
    call(fd, &put, &r);
    CHECK(r.h.status == 0 && r.results[0].status == 0, "second put of a key succeeds");
    free_response(&r);

    struct request get = {.opcode = GK_OP_GET, .ns = "t", .n = 1, .keys = {"small"},
                          .sizes = {sizeof other}};
    call(fd, &get, &r);
    CHECK_EQ(r.h.payload_len, sizeof val_small);
    CHECK(memcmp(r.payload, val_small, sizeof val_small) == 0, "first value kept");
    free_response(&r);
    close(fd);
}

static void test_exists_delete_clear(void)
{
    int fd = connect_to(srv);
    struct response r;
    struct request exists = {.opcode = GK_OP_EXISTS, .ns = "t", .n = 2, .keys = {"mid", "nope"}};
    call(fd, &exists, &r);
    CHECK(r.results[0].status == 0 && r.results[0].size == sizeof val_mid, "exists with size");
    CHECK_EQ(r.results[1].status, GDRKV_E_NOT_FOUND);
    free_response(&r);
    close(fd);

    struct request del = {.opcode = GK_OP_DELETE, .ns = "t", .n = 2, .keys = {"mid", "nope"}};
    expect_statuses(&del, (int32_t[]){0, GDRKV_E_NOT_FOUND});
    expect_statuses(&del, (int32_t[]){GDRKV_E_NOT_FOUND, GDRKV_E_NOT_FOUND});

    /* "small", "empty" and "big" are left in "t"; "keep" in "u" must survive the clear. */
    struct request put = {.opcode = GK_OP_PUT, .ns = "u", .n = 1, .keys = {"keep"},
                          .sizes = {sizeof val_small}, .values = {val_small}};
    expect_statuses(&put, (int32_t[]){0});
    fd = connect_to(srv);
    struct request clear = {.opcode = GK_OP_CLEAR, .ns = "t"};
    call(fd, &clear, &r);
    CHECK(r.h.status == 0 && r.h.count == 1 && r.results[0].status == 0, "one clear result");
    CHECK_EQ(r.results[0].size, 3);
    free_response(&r);
    close(fd);
    struct request kept = {.opcode = GK_OP_EXISTS, .ns = "u", .n = 1, .keys = {"keep"}};
    expect_statuses(&kept, (int32_t[]){0});
}

static void test_stats(void)
{
    int fd = connect_to(srv);
    struct request stats = {.opcode = GK_OP_STATS, .ns = ""};
    struct response r;
    call(fd, &stats, &r);
    CHECK(r.h.status == 0 && r.h.count == 0 && r.h.body_len > 0, "stats response");

    /* Every line is "name value": a lowercase name and a number. */
    int lines = 0, saw_pool = 0, saw_put = 0, saw_latency = 0;
    char *save, *line;
    for (line = strtok_r((char *)r.body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[64];
        unsigned long long value;
        CHECK(sscanf(line, "%63[a-z0-9_] %llu", name, &value) == 2, "stats line '%s'", line);
        saw_pool |= !strcmp(name, "pool_bytes") && value == POOL_BYTES;
        saw_put |= !strcmp(name, "ops_put") && value >= 3;
        saw_latency |= !strcmp(name, "latency_get_us_p99");
        lines++;
    }
    CHECK(lines > 40 && saw_pool && saw_put && saw_latency, "%d lines", lines);
    free_response(&r);
    close(fd);
    CHECK_EQ(stat_of(srv, "workers"), 2);
    CHECK(stat_of(srv, "bytes_in") >= BIG, "bytes_in");
    CHECK(stat_of(srv, "bytes_out") >= BIG, "bytes_out");
    CHECK(stat_of(srv, "keys_get") >= 5, "keys_get");
    CHECK(stat_of(srv, "latency_put_us_max") > 0, "put latency");
}

static void test_pipelined(void)
{
    int fd = connect_to(srv);
    struct request put = {.opcode = GK_OP_PUT, .ns = "p", .n = 1, .keys = {"pipe"},
                          .sizes = {sizeof val_mid}, .values = {val_mid}};
    struct request get = {.opcode = GK_OP_GET, .ns = "p", .n = 1, .keys = {"pipe"},
                          .sizes = {sizeof val_mid}};
    size_t len1, len2;
    uint8_t *f1 = encode_request(&put, 101, &len1), *f2 = encode_request(&get, 102, &len2);
    uint8_t *both = malloc(len1 + len2);
    CHECK(both, "malloc");
    memcpy(both, f1, len1);
    memcpy(both + len1, f2, len2);
    send_all(fd, both, len1 + len2);
    free(f1), free(f2), free(both);

    struct response r;
    read_response(fd, &r);
    CHECK(r.h.req_id == 101 && r.results[0].status == 0, "pipelined put answered first");
    free_response(&r);
    read_response(fd, &r);
    CHECK(r.h.req_id == 102 && r.results[0].status == 0, "then the get");
    CHECK(r.h.payload_len == sizeof val_mid && memcmp(r.payload, val_mid, sizeof val_mid) == 0,
          "get sees the pipelined put");
    free_response(&r);
    close(fd);
}

static void test_bad_magic(void)
{
    int fd = connect_to(srv);
    uint8_t hdr[GK_HDR_SIZE];
    raw_header(hdr, 0x20544547 /* "GET " */, GK_OP_PING, 0, 0, 0);
    send_all(fd, hdr, sizeof hdr);
    expect_closed(fd);
    test_ping();    /* everyone else is still served */
}

static void test_oversized_body(void)
{
    int fd = connect_to(srv);
    uint8_t hdr[GK_HDR_SIZE];
    struct response r;
    raw_header(hdr, GK_MAGIC, GK_OP_GET, 1, GK_MAX_BODY + 1, 0);
    send_all(fd, hdr, sizeof hdr);
    read_response(fd, &r);
    CHECK_EQ(r.h.status, GDRKV_E_TOO_LARGE);
    CHECK(r.h.count == 0 && r.h.body_len > 0 && r.h.req_id == 77, "error frame: %s", r.body);
    free_response(&r);
    expect_closed(fd);
}

static void test_unknown_opcode(void)
{
    int fd = connect_to(srv);
    uint8_t frame[GK_HDR_SIZE + 10] = {0};
    struct response r;
    raw_header(frame, GK_MAGIC, 42, 0, 10, 0);
    send_all(fd, frame, sizeof frame);
    read_response(fd, &r);
    CHECK_EQ(r.h.status, GDRKV_E_UNSUPPORTED);
    CHECK(r.h.count == 0 && r.h.body_len > 0, "error frame: %s", r.body);
    free_response(&r);
    struct request ping = {.opcode = GK_OP_PING, .ns = ""};
    call(fd, &ping, &r);    /* same connection, still in step */
    CHECK_EQ(r.h.status, 0);
    free_response(&r);
    close(fd);
}

static void test_malformed_body(void)
{
    int fd = connect_to(srv);
    uint8_t frame[GK_HDR_SIZE + 14] = {0};
    struct response r;
    raw_header(frame, GK_MAGIC, GK_OP_EXISTS, 1, 14, 0);
    gk_store32(frame + GK_HDR_SIZE + 1, 1000);     /* a key running past the body */
    send_all(fd, frame, sizeof frame);
    read_response(fd, &r);
    CHECK(r.h.status == GDRKV_E_PROTOCOL && r.h.count == 0, "error frame: %s", r.body);
    free_response(&r);
    expect_closed(fd);
}

/* Frames with our magic and random everything else, cut off at a random
 * point: each gets an answer or a close, never a crash, and the server
 * keeps serving. */
static void test_random_frames(void)
{
    uint64_t seed = 42;
    uint8_t frame[GK_HDR_SIZE + 512];

    for (int i = 0; i < 300; i++) {
        uint64_t r = check_rand(&seed);
        uint32_t body_len = (uint32_t)(r % 256);
        raw_header(frame, GK_MAGIC, (uint8_t)(r >> 8) % 10, (uint32_t)(r >> 16) % 20, body_len,
                   (r >> 24) % 4 ? 0 : (r >> 32) % 300);
        if ((r >> 40) % 8 == 0)
            frame[4] = (uint8_t)(r >> 48);     /* version */
        fill_random(frame + GK_HDR_SIZE, sizeof frame - GK_HDR_SIZE, r);
        frame[GK_HDR_SIZE] = (uint8_t)((r >> 56) % 4);     /* mostly a namespace that fits */
        int fd = connect_to(srv);
        send_all(fd, frame, GK_HDR_SIZE + (check_rand(&seed) % (body_len + 256)));
        shutdown(fd, SHUT_WR);
        expect_closed(fd);
    }
    test_ping();
    wait_stat(srv, "reserved_objects", 0);
    wait_stat(srv, "pinned_objects", 0);
}

static void test_disconnect_mid_payload(void)
{
    int fd = start_half_put(srv, "half");
    wait_stat(srv, "reserved_objects", 1);
    close(fd);
    wait_stat(srv, "reserved_objects", 0);
    struct request exists = {.opcode = GK_OP_EXISTS, .ns = "h", .n = 1, .keys = {"half"}};
    expect_statuses(&exists, (int32_t[]){GDRKV_E_NOT_FOUND});
}

static void test_stalled_clients(void)
{
    int fd = start_half_put(srv, "stalled");
    wait_stat(srv, "reserved_objects", 1);
    uint64_t t0 = gk_now_ns();
    expect_closed(fd);      /* blocks until the stall timeout closes it */
    uint64_t waited_ms = (gk_now_ns() - t0) / 1000000;
    CHECK(waited_ms >= STALL_MS / 2 && waited_ms < STALL_MS * 4, "closed after %llu ms",
          (unsigned long long)waited_ms);
    wait_stat(srv, "reserved_objects", 0);
    struct request exists = {.opcode = GK_OP_EXISTS, .ns = "h", .n = 1, .keys = {"stalled"}};
    expect_statuses(&exists, (int32_t[]){GDRKV_E_NOT_FOUND});

    /* A reader that stops reading holds pins only until it stalls out. */
    fd = connect_to(srv);
    put_big(fd, "h", "held");
    request_unread_gets(fd, "h", "held");
    wait_stat(srv, "pinned_objects", 1);
    wait_stat(srv, "pinned_objects", 0);
    expect_closed(fd);
}

static void test_concurrent_connections(void)
{
    static int fds[CONCURRENT];
    static uint8_t vals[CONCURRENT][64];
    static char names[CONCURRENT][24];
    struct response r;

    for (int i = 0; i < CONCURRENT; i++) {
        fds[i] = connect_to(srv);
        snprintf(names[i], sizeof names[i], "conn-%d", i);
        fill_random(vals[i], sizeof vals[i], (uint64_t)i + 1);
    }
    wait_stat(srv, "connections_current", CONCURRENT);
    /* Every connection has a request in flight at once, then all are answered. */
    for (int i = 0; i < CONCURRENT; i++) {
        struct request put = {.opcode = GK_OP_PUT, .ns = "c", .n = 1, .keys = {names[i]},
                              .sizes = {sizeof vals[i]}, .values = {vals[i]}};
        send_request(fds[i], &put, (uint64_t)i);
    }
    for (int i = 0; i < CONCURRENT; i++) {
        read_response(fds[i], &r);
        CHECK(r.h.req_id == (uint64_t)i && r.results[0].status == 0, "put on connection %d", i);
        free_response(&r);
    }
    /* Each reads what another connection wrote. */
    for (int i = 0; i < CONCURRENT; i++) {
        struct request get = {.opcode = GK_OP_GET, .ns = "c", .n = 1,
                              .keys = {names[(i + 1) % CONCURRENT]}, .sizes = {64}};
        send_request(fds[i], &get, (uint64_t)i);
    }
    for (int i = 0; i < CONCURRENT; i++) {
        read_response(fds[i], &r);
        CHECK(r.results[0].status == 0 && r.h.payload_len == 64, "get on connection %d", i);
        CHECK(memcmp(r.payload, vals[(i + 1) % CONCURRENT], 64) == 0, "value on connection %d", i);
        free_response(&r);
    }
    for (int i = 0; i < CONCURRENT; i++)
        close(fds[i]);
    wait_stat(srv, "connections_current", 0);
}

static void test_max_connections(void)
{
    gdrkv_server *small = start_server(2);
    /* One at a time: two workers accept, so the order must be made certain. */
    int a = connect_to(small);
    wait_stat(small, "connections_current", 1);
    int b = connect_to(small);
    wait_stat(small, "connections_current", 2);
    expect_closed(connect_to(small));
    CHECK_EQ(stat_of(small, "connections_rejected"), 1);
    CHECK_EQ(stat_of(small, "connections_current"), 2);
    close(a);
    close(b);
    gdrkv_server_stop(small);
}

/* ------------------------------------------------------------ shm */

static int connect_unix(gdrkv_server *s)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    struct timeval tv = {.tv_sec = 10};

    CHECK(gdrkv_server_unix_path(s, sun.sun_path, sizeof sun.sun_path) == 0 && sun.sun_path[0],
          "the server has a unix socket");
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&sun, sizeof sun) == 0, "connect: %s",
          strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* HELLO: maps the pool the server passes; *len gets the mapping's size. */
static const uint8_t *hello(int fd, size_t *len)
{
    struct request r = {.opcode = GK_OP_HELLO, .ns = ""};
    uint8_t raw[GK_HDR_SIZE + GK_RESULT_SIZE];
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    struct iovec iov = {.iov_base = raw, .iov_len = GK_HDR_SIZE};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    struct gk_hdr h;
    struct gk_result res;
    int pool_fd;

    send_request(fd, &r, 1);
    CHECK_EQ(recvmsg(fd, &msg, MSG_WAITALL), GK_HDR_SIZE);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    CHECK(cm && cm->cmsg_type == SCM_RIGHTS, "the pool's fd came with the answer");
    memcpy(&pool_fd, CMSG_DATA(cm), sizeof pool_fd);
    gk_hdr_decode(raw, &h);
    CHECK(h.status == 0 && h.count == 1 && h.body_len == GK_RESULT_SIZE, "HELLO answered");
    recv_all(fd, raw + GK_HDR_SIZE, GK_RESULT_SIZE);
    gk_result_decode(raw + GK_HDR_SIZE, &res);
    CHECK_EQ(res.size, POOL_BYTES);
    CHECK(mmap(NULL, res.size, PROT_READ | PROT_WRITE, MAP_SHARED, pool_fd, 0) == MAP_FAILED,
          "the pool can't be mapped writable");
    const uint8_t *pool = mmap(NULL, res.size, PROT_READ, MAP_SHARED, pool_fd, 0);
    CHECK(pool != MAP_FAILED, "mmap: %s", strerror(errno));
    close(pool_fd);
    *len = res.size;
    return pool;
}

/* LEASE of one key: checks the object's chunks hold want (len bytes). */
static void lease_and_check(int fd, const uint8_t *pool, const char *ns, const char *key,
                            const uint8_t *want, uint64_t len)
{
    struct request r = {.opcode = GK_OP_LEASE, .ns = ns, .n = 1, .keys = {key}, .sizes = {len}};
    uint8_t raw[GK_HDR_SIZE];
    struct gk_hdr h;
    struct gk_result res;

    send_request(fd, &r, 2);
    recv_all(fd, raw, sizeof raw);
    gk_hdr_decode(raw, &h);
    CHECK(h.status == 0 && h.count == 1 && h.payload_len == 0 && h.body_len <= 1 << 20,
          "LEASE answered");
    uint8_t *body = malloc(h.body_len);
    CHECK(body, "malloc");
    recv_all(fd, body, h.body_len);
    gk_result_decode(body, &res);
    CHECK(res.status == 0 && res.size == len, "leased");
    uint32_t nchunks = gk_load32(body + GK_RESULT_SIZE);
    CHECK_EQ(h.body_len, GK_RESULT_SIZE + GK_LEASE_OBJ_SIZE + nchunks * GK_LEASE_CHUNK_SIZE);
    uint64_t at = 0;
    for (uint32_t k = 0; k < nchunks; k++) {
        const uint8_t *c = body + GK_RESULT_SIZE + GK_LEASE_OBJ_SIZE + k * GK_LEASE_CHUNK_SIZE;
        uint64_t off = gk_load64(c), clen = gk_load64(c + 8);
        CHECK(off + clen <= POOL_BYTES && at + clen <= len, "chunk in bounds");
        CHECK(!memcmp(pool + off, want + at, clen), "chunk %u holds the object's bytes", k);
        at += clen;
    }
    CHECK_EQ(at, len);
    free(body);
}

static int32_t release(int fd)
{
    struct request r = {.opcode = GK_OP_RELEASE, .ns = ""};
    struct response resp;
    call(fd, &r, &resp);
    free_response(&resp);
    return resp.h.status;
}

static void test_shm_lease(void)
{
    size_t len;
    int tcp = connect_to(srv), fd = connect_unix(srv);
    const uint8_t *pool = hello(fd, &len);

    put_big(tcp, "shm", "leased");
    lease_and_check(fd, pool, "shm", "leased", val_big, BIG);
    CHECK_EQ(stat_of(srv, "pinned_objects"), 1);
    CHECK_EQ(release(fd), 0);
    CHECK_EQ(stat_of(srv, "pinned_objects"), 0);
    CHECK_EQ(release(fd), GDRKV_E_INVALID);
    /* The shm ops are refused over tcp, and the connection stays. */
    struct request r = {.opcode = GK_OP_HELLO, .ns = ""};
    struct response resp;
    call(tcp, &r, &resp);
    CHECK_EQ(resp.h.status, GDRKV_E_UNSUPPORTED);
    free_response(&resp);
    test_ping();
    munmap((void *)pool, len);
    close(fd);
    close(tcp);
}

static void test_shm_lease_expiry(void)
{
    size_t len;
    gdrkv_server *s = start_server_leasing(64, 200);
    int tcp = connect_to(s), fd = connect_unix(s), held = connect_unix(s);
    const uint8_t *pool = hello(fd, &len);

    put_big(tcp, "shm", "expiring");
    lease_and_check(fd, pool, "shm", "expiring", val_big, BIG);
    wait_stat(s, "pinned_objects", 0);
    CHECK_EQ(stat_of(s, "shm_leases_expired"), 1);
    CHECK_EQ(release(fd), GDRKV_E_TIMEOUT);
    /* A lease held at stop is dropped with its connection (ASan checks). */
    lease_and_check(held, pool, "shm", "expiring", val_big, BIG);
    gdrkv_server_stop(s);
    munmap((void *)pool, len);
    close(held);
    close(fd);
    close(tcp);
}

/* Stop releases the pins and reservations of clients caught mid-transfer
 * (ASan's leak check and the store's own accounting would catch it not). */
static void test_stop_mid_transfer(void)
{
    gdrkv_server *s = start_server(64);
    int fd = connect_to(s);
    put_big(fd, "s", "big");
    request_unread_gets(fd, "s", "big");
    int half = start_half_put(s, "cut");
    wait_stat(s, "pinned_objects", 1);
    wait_stat(s, "reserved_objects", 1);
    gdrkv_server_stop(s);
    close(fd);
    close(half);
}

int main(void)
{
    val_big = malloc(BIG);
    CHECK(val_big, "malloc");
    fill_random(val_small, sizeof val_small, 1);
    fill_random(val_mid, sizeof val_mid, 2);
    fill_random(val_big, BIG, 3);
    srv = start_server(4096);

    RUN(test_options);
    RUN(test_ping);
    RUN(test_put_get);
    RUN(test_put_if_absent);
    RUN(test_exists_delete_clear);
    RUN(test_stats);
    RUN(test_pipelined);
    RUN(test_bad_magic);
    RUN(test_oversized_body);
    RUN(test_unknown_opcode);
    RUN(test_malformed_body);
    RUN(test_random_frames);
    RUN(test_disconnect_mid_payload);
    RUN(test_stalled_clients);
    RUN(test_concurrent_connections);
    RUN(test_max_connections);
    RUN(test_stop_mid_transfer);
    RUN(test_shm_lease);
    RUN(test_shm_lease_expiry);

    gdrkv_server_stop(srv);
    free(val_big);
    return check_done("test_server");
}
