/*
 * fuzz_protocol.c - fuzz target for the frame parser and the RDMA_HELLO
 * records (native/common/protocol.c), the code that reads bytes straight off
 * the network.
 *
 * Built two ways: with clang -fsanitize=fuzzer it is a libFuzzer target
 * (LLVMFuzzerTestOneInput); otherwise (gcc, the test suite) a small driver
 * in main() feeds it random frames and mutations of valid frames for a
 * bounded time, under ASan/UBSan. Either way every accepted frame is
 * checked for the invariants the server relies on.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz_protocol"
#include "fuzz_driver.h"
#include "common/common.h"
#include "gdrkv.h"
#include "common/protocol.h"

/* RDMA_HELLO bodies, both the client's endpoint (parsed by the server)
 * and the server's answer (endpoint + regions, parsed by the client). */
static void fuzz_rdma_hello(const uint8_t *data, size_t len)
{
    uint8_t *copy = malloc(len ? len : 1);
    check(copy != NULL, "allocation");
    memcpy(copy, data, len);
    struct rdma_endpoint e;
    size_t used = rdma_endpoint_decode(copy, len, &e);
    if (used) {
        check(used <= len && used == rdma_endpoint_size(&e), "endpoint length");
        check(e.nqps >= 1 && e.nqps <= RDMA_MAX_QPS, "endpoint QP count");
        uint8_t again[RDMA_ENDPOINT_MIN + RDMA_MAX_QPS * RDMA_QP_WIRE_SIZE];
        check(rdma_endpoint_encode(&e, again) == used, "endpoint re-encoded length");
        /* The reserved word is not kept; everything else must round-trip. */
        check(memcmp(again, copy, 36) == 0 && memcmp(again + 40, copy + 40, used - 40) == 0,
              "endpoint re-encoding");
        static struct rdma_region regions[64];
        int n = rdma_regions_decode(copy + used, len - used, regions, 64);
        uint64_t next = 0;
        for (int i = 0; i < n; i++) {
            check(regions[i].pool_off == next && regions[i].len > 0, "regions back to back");
            next += regions[i].len;
        }
    }
    free(copy);
}

/* PINS bodies: accepted only at their size, with a mapping and a seq,
 * and then read back as written. */
static void fuzz_pins(const uint8_t *data, size_t len)
{
    struct gk_pins r;
    if (gk_pins_decode(data, len, &r) != 0)
        return;
    check(len == GK_PINS_BODY_SIZE && r.mapping && r.seq, "pin report accepted");
    uint8_t again[GK_PINS_BODY_SIZE];
    gk_pins_encode(again, &r);
    check(memcmp(again, data, GK_PINS_BODY_SIZE) == 0, "pin report re-encoding");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gk_hdr h;
    if (size < GK_HDR_SIZE)
        return 0;
    fuzz_rdma_hello(data + GK_HDR_SIZE, size - GK_HDR_SIZE);
    fuzz_pins(data + GK_HDR_SIZE, GK_MIN(size - GK_HDR_SIZE, (size_t)GK_PINS_BODY_SIZE + (size % 2)));
    gk_hdr_decode(data, &h);
    if (gk_check_request_hdr(&h) != 0 || !gk_op_is_keyed(h.opcode))
        return 0;
    check(h.count <= GK_MAX_KEYS && h.body_len <= GK_MAX_BODY, "limits checked");

    /* The server reads exactly body_len bytes; give the parser a heap copy of
     * that size so ASan sees any read past it. */
    size_t avail = size - GK_HDR_SIZE;
    if (avail < h.body_len)
        return 0;
    uint8_t *body = malloc(h.body_len ? h.body_len : 1);
    struct gk_entry *entries = malloc(sizeof *entries * (h.count ? h.count : 1));
    check(body && entries, "allocation");
    memcpy(body, data + GK_HDR_SIZE, h.body_len);

    struct gk_ns ns;
    if (gk_parse_request_body(&h, body, &ns, entries) == 0) {
        uint64_t payload = 0;
        check(ns.len <= GK_MAX_NS_LEN, "namespace length");
        check(ns.name >= body && ns.name + ns.len <= body + h.body_len, "namespace inside body");
        for (uint32_t i = 0; i < h.count; i++) {
            check(entries[i].key_len >= 1 && entries[i].key_len <= GK_MAX_KEY_LEN, "key length");
            check(entries[i].key >= body && entries[i].key + entries[i].key_len <= body + h.body_len,
                  "key inside body");
            check(entries[i].size <= GK_MAX_OBJECT, "object size");
            payload += entries[i].size;
        }
        check(h.opcode == GK_OP_PUT ? payload == h.payload_len : h.payload_len == 0, "payload sum");

        /* What parses must re-encode to the same bytes. */
        uint32_t *lens = malloc(sizeof *lens * (h.count ? h.count : 1));
        uint64_t *sizes = malloc(sizeof *sizes * (h.count ? h.count : 1));
        uint8_t *keys = malloc(h.body_len ? h.body_len : 1), *kp = keys;
        check(lens && sizes && keys, "allocation");
        for (uint32_t i = 0; i < h.count; i++) {
            lens[i] = entries[i].key_len;
            sizes[i] = entries[i].size;
            memcpy(kp, entries[i].key, entries[i].key_len);
            kp += entries[i].key_len;
        }
        check(gk_request_body_size(ns.len, h.count, lens) == h.body_len, "body size");
        uint8_t *again = malloc(h.body_len);
        check(again != NULL, "allocation");
        check(gk_encode_request_body(again, &ns, h.count, keys, lens, sizes) == h.body_len,
              "encoded length");
        check(memcmp(again, body, h.body_len) == 0, "re-encoding");
        free(again);
        free(keys);
        free(sizes);
        free(lens);
    }
    free(entries);
    free(body);
    return 0;
}

#ifndef GK_LIBFUZZER

/* A valid keyed request, so mutations start from frames that get deep
 * into the parser instead of dying at the magic check. */
static size_t make_valid(uint8_t *buf, size_t cap)
{
    static const uint8_t ops[] = {GK_OP_EXISTS, GK_OP_GET, GK_OP_PUT, GK_OP_DELETE, GK_OP_CLEAR,
                                  GK_OP_LEASE};
    uint8_t opcode = ops[rnd() % sizeof ops];
    uint32_t n = opcode == GK_OP_CLEAR ? 0 : (uint32_t)(rnd() % 8);
    uint32_t lens[8];
    uint64_t sizes[8], payload = 0;
    uint8_t keys[8 * 64];
    uint8_t ns_name[16];
    struct gk_ns ns = {ns_name, (uint32_t)(rnd() % sizeof ns_name)};

    for (uint32_t i = 0; i < sizeof ns_name; i++)
        ns_name[i] = (uint8_t)rnd();
    for (uint32_t i = 0; i < n; i++) {
        lens[i] = 1 + (uint32_t)(rnd() % 64);
        sizes[i] = opcode == GK_OP_PUT || opcode == GK_OP_GET || opcode == GK_OP_LEASE
                       ? rnd() % 100000 : 0;
        if (opcode == GK_OP_PUT)
            payload += sizes[i];
    }
    for (size_t i = 0; i < sizeof keys; i++)
        keys[i] = (uint8_t)rnd();

    uint64_t body_len = gk_request_body_size(ns.len, n, lens);
    if (GK_HDR_SIZE + body_len > cap)
        return 0;
    struct gk_hdr h = {.magic = GK_MAGIC, .version = GK_VERSION, .opcode = opcode,
                       .count = n, .body_len = (uint32_t)body_len,
                       .payload_len = payload, .req_id = rnd()};
    gk_hdr_encode(&h, buf);
    gk_encode_request_body(buf + GK_HDR_SIZE, &ns, n, keys, lens, sizes);
    return GK_HDR_SIZE + body_len;
}

static size_t mutate_once(uint8_t *buf, size_t len, size_t cap)
{
    switch (rnd() % 5) {
    case 0: /* overwrite a 32-bit field with an interesting value */
        if (len >= 4) {
            static const uint32_t vals[] = {0, 1, 0xffffffffu, 0x7fffffffu, GK_MAX_KEYS,
                                            GK_MAX_KEYS + 1, GK_MAX_BODY, GK_MAX_KEY_LEN + 1};
            gk_store32(buf + rnd() % (len - 3), vals[rnd() % GK_ARRAY_LEN(vals)]);
        }
        return len;
    case 1: /* keep the header honest about the body so the body parser runs */
        if (len >= GK_HDR_SIZE)
            gk_store32(buf + 16, (uint32_t)(len - GK_HDR_SIZE));
        return len;
    default:
        return mutate_bytes(buf, len, cap);
    }
}

int main(int argc, char **argv)
{
    static uint8_t buf[1 << 16];
    return fuzz_main(argc, argv, buf, sizeof buf, 4);
}

#endif
