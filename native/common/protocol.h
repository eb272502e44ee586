/*
 * protocol.h - the gdrkv wire format (docs/protocol.md is the prose version).
 *
 * Every frame is a 40-byte header, a control body of body_len bytes, then
 * payload_len bytes of object data. All integers are little-endian.
 *
 *   header:  u32 magic "GDKV" | u8 version | u8 opcode | u16 flags |
 *            i32 status | u32 count | u32 body_len | u32 reserved |
 *            u64 payload_len | u64 req_id
 *
 *   request body (keyed ops EXISTS, GET, PUT, DELETE; also CLEAR with count 0):
 *            u8 ns_len | ns bytes | count x entry
 *   entry:   u32 key_len | u64 size | key bytes
 *            size = value length (PUT), destination capacity (GET), 0 otherwise
 *   request payload: PUT only, the values concatenated in entry order.
 *
 *   response header: opcode | GK_OP_RESPONSE, same req_id, status = frame
 *            status (0, or an error for the whole frame, with a UTF-8 message
 *            as the body and count 0).
 *   response body: count x result, result = i32 status | u32 reserved | u64 size
 *            EXISTS: size of the object; GET: size of the object (the payload
 *            carries it when status is 0); PUT/DELETE: 0; CLEAR: one result,
 *            size = objects removed; STATS: body is "name value\n" text;
 *            PING: empty.
 *   response payload: GET only, the values of the entries with status 0,
 *            concatenated in entry order.
 *
 *   shm transport (unix-domain connections only; docs/transports.md):
 *   HELLO:   empty request; one result, size = pool bytes, and the pool's
 *            memfd (read-only, sealed) attached to the response with
 *            SCM_RIGHTS, then the connection's staging memfd (sealed
 *            against shrinking and growing) when the server gives one.
 *            Response flag GK_HELLO_WRITABLE: single-tenant mode, the pool
 *            memfd is writable and PUTs are RESERVE, copy, COMMIT.
 *            Response flag GK_HELLO_LEASE_WORD: the staging memfd's last
 *            GK_LEASE_WORD_BYTES are not for values but hold the lease
 *            word, a u32 the server sets to 1 when it answers a LEASE
 *            with bytes to copy and to 0 before it lets any of its pins
 *            go (RELEASE, expiry, the next frame, the connection's end).
 *            Response flag GK_HELLO_STAGED_WORD (with LEASE_WORD): the
 *            u64 at GK_STAGED_WORD_OFFSET in the lease word's room is the
 *            staged word, which the client writes and the server reads
 *            to follow a PUT_STAGED_FOLLOW.
 *   PUT_STAGED: a PUT whose values the client copied into the
 *            connection's staging memfd, from offset 0 in entry order, as
 *            a PUT payload would be: entry sizes are the value sizes and
 *            their sum at most the staging size; no payload. The server
 *            copies them into the pool; the answer is PUT's.
 *            Request flag GK_PUT_STAGED_FOLLOW: the values are being
 *            copied still. The client set the staged word to 0 before it
 *            sent the request and raises it, as it copies, to the count
 *            of staging bytes in place from offset 0; the server copies
 *            each value once the word covers it. When the word stops
 *            rising, the server stops: nothing of the frame is stored, and
 *            the answer is frame status TIMEOUT with the same flag set,
 *            which asks the client to send the frame again without it
 *            once its values are in place.
 *   LEASE:   a GET that answers with pool offsets instead of bytes: the
 *            results, then for each result with status 0, in entry order,
 *            u32 nchunks | u32 reserved | nchunks x (u64 off | u64 len).
 *            The objects stay pinned (the lease) until RELEASE, the next
 *            frame, the lease timeout, or the connection's end.
 *   RELEASE: empty request; frame status 0 when the lease was still held,
 *            so the bytes copied under it were the objects', or TIMEOUT
 *            when it had expired. Request flag GK_RELEASE_UNANSWERED: no
 *            answer at all (a client that read the lease word as 1 after
 *            its copy, and saw its socket still open, knows already).
 *
 *   rdma transport (tcp or unix connections; docs/transports.md):
 *   RDMA_HELLO: body = the client's QP endpoint (rdma_qp.h); the answer's
 *            body is the server's endpoint and the pool's registered
 *            regions. Once answered, GETs are LEASEs (the client READs the
 *            chunks, then RELEASE) and PUTs are RESERVE + COMMIT.
 *   (RESERVE and COMMIT also serve local connections in single-tenant mode,
 *   the client copying into the writable pool instead of WRITEs.)
 *   RESERVE: a PUT without payload: entry sizes are the value sizes; per
 *            key status 0 (reserved: its chunk list follows the results,
 *            as in LEASE), 1 (already stored: nothing to write) or an
 *            error. The reservations stay until COMMIT, the next other
 *            frame, the lease timeout or the connection's end.
 *   COMMIT:  count = the RESERVE's count, body = count bytes, 1 to commit
 *            the key (its bytes are written), 0 to abort it; the answer
 *            is one result per key, or frame status TIMEOUT when the
 *            reservations had expired.
 *
 *   authentication (a server with a token; docs/protocol.md): until a
 *   connection has done this, the server answers nothing else.
 *   AUTH:    body = the client's 32-byte nonce; the answer's body is the
 *            server's nonce and its proof (32 + 32 bytes). A second AUTH
 *            carries the client's proof (32 bytes); the answer is status 0
 *            or DENIED, and the connection is closed after a DENIED.
 *            A server without a token answers UNSUPPORTED.
 *
 * Limits below are checked before anything is allocated for a frame.
 */
#ifndef GDRKV_PROTOCOL_H
#define GDRKV_PROTOCOL_H

#include <stdint.h>

#define GK_MAGIC 0x564B4447u   /* bytes "GDKV" */
#define GK_VERSION 1
#define GK_HDR_SIZE 40
#define GK_ENTRY_HDR_SIZE 12   /* u32 key_len + u64 size */
#define GK_RESULT_SIZE 16
#define GK_LEASE_OBJ_SIZE 8     /* u32 nchunks + u32 reserved */
#define GK_LEASE_CHUNK_SIZE 16  /* u64 off + u64 len */

#define GK_MAX_KEY_LEN 4096
#define GK_MAX_NS_LEN 255
#define GK_MAX_KEYS 8192                 /* entries per frame */
#define GK_MAX_BODY (8u << 20)           /* control body bytes per frame */
#define GK_MAX_SEGMENTS 1024             /* segments per object (client side) */
#define GK_MAX_OBJECT (1ull << 30)       /* bytes per object */
#define GK_MAX_PAYLOAD (64ull << 30)     /* payload bytes per frame */
#define GK_MAX_GET_CAPACITY (1ull << 30) /* a GET frame's destination bytes: what one
                                            answer may pin while a socket drains it */
#define GK_MAX_RDMA_HELLO 4096           /* RDMA_HELLO request body */
#define GK_RESERVE_PRESENT 1             /* RESERVE key status: already stored */
#define GK_AUTH_NONCE_SIZE 32
#define GK_AUTH_PROOF_SIZE 32
#define GK_HELLO_WRITABLE 1             /* HELLO response flag: single-tenant pool */
#define GK_HELLO_LEASE_WORD 2           /* HELLO response flag: staging ends in the lease word */
#define GK_LEASE_WORD_BYTES 64          /* the lease word's room at the end of staging */
#define GK_LEASE_HELD 1                 /* the lease word while a LEASE of bytes holds */
#define GK_HELLO_STAGED_WORD 4          /* HELLO response flag: staging has the staged word */
#define GK_STAGED_WORD_OFFSET 8         /* the staged word's place in the lease word's room */
#define GK_PUT_STAGED_FOLLOW 1          /* PUT_STAGED flag: follow the staged word (request);
                                           stopped, send it again without (response) */
#define GK_RELEASE_UNANSWERED 1         /* RELEASE request flag: send no answer */

enum gk_opcode {
    GK_OP_PING = 1,
    GK_OP_EXISTS = 2,
    GK_OP_GET = 3,
    GK_OP_PUT = 4,
    GK_OP_DELETE = 5,
    GK_OP_STATS = 6,
    GK_OP_CLEAR = 7,
    GK_OP_HELLO = 8,
    GK_OP_LEASE = 9,
    GK_OP_RELEASE = 10,
    GK_OP_RDMA_HELLO = 11,
    GK_OP_RESERVE = 12,
    GK_OP_COMMIT = 13,
    GK_OP_AUTH = 14,
    GK_OP_PUT_STAGED = 15,
    GK_OP_MAX = 15,
    GK_OP_RESPONSE = 0x80
};

struct gk_hdr {
    uint32_t magic;
    uint8_t version;
    uint8_t opcode;
    uint16_t flags;
    int32_t status;
    uint32_t count;
    uint32_t body_len;
    uint32_t reserved;
    uint64_t payload_len;
    uint64_t req_id;
};

struct gk_ns {
    const uint8_t *name;
    uint32_t len;                        /* 0..GK_MAX_NS_LEN */
};

struct gk_entry {
    const uint8_t *key;                  /* points into the body buffer */
    uint32_t key_len;
    uint64_t size;
};

struct gk_result {
    int32_t status;
    uint64_t size;
};

void gk_hdr_encode(const struct gk_hdr *h, uint8_t out[GK_HDR_SIZE]);
void gk_hdr_decode(const uint8_t in[GK_HDR_SIZE], struct gk_hdr *h);

/* Whether opcode takes a namespace + entries body. */
int gk_op_is_keyed(uint8_t opcode);
/* Whether opcode is a transport's own frame, never an API call of its own. */
int gk_op_is_transport(uint8_t opcode);
const char *gk_op_name(uint8_t opcode);

/* Checks a request header against the limits: magic, version, body_len,
 * count, payload_len, and whether the opcode may carry a payload. Returns 0,
 * GDRKV_E_PROTOCOL (bad magic: the stream is not ours), GDRKV_E_UNSUPPORTED
 * (version or unknown opcode: body and payload can be skipped) or
 * GDRKV_E_TOO_LARGE. */
int gk_check_request_hdr(const struct gk_hdr *h);

/* Parses and validates a keyed request body: namespace, exactly h->count
 * entries, key lengths 1..GK_MAX_KEY_LEN, sizes <= GK_MAX_OBJECT, body fully
 * consumed, and for PUT the sizes summing to h->payload_len. entries must
 * hold h->count elements. Returns 0, GDRKV_E_PROTOCOL or GDRKV_E_TOO_LARGE. */
int gk_parse_request_body(const struct gk_hdr *h, const uint8_t *body,
                          struct gk_ns *ns, struct gk_entry *entries);

/* Size of a keyed request body and its encoder (client side). */
uint64_t gk_request_body_size(uint32_t ns_len, uint32_t n, const uint32_t *key_lens);
/* Encodes the body; keys are concatenated, key_lens[i] each. sizes may be
 * NULL (all zero). Returns the number of bytes written. */
uint64_t gk_encode_request_body(uint8_t *out, const struct gk_ns *ns, uint32_t n,
                                const uint8_t *keys, const uint32_t *key_lens,
                                const uint64_t *sizes);

void gk_result_encode(uint8_t out[GK_RESULT_SIZE], int32_t status, uint64_t size);
void gk_result_decode(const uint8_t in[GK_RESULT_SIZE], struct gk_result *r);

#endif
