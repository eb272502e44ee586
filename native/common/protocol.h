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
 *   RDMA_HELLO: body = the client's QP endpoint (below); the answer's
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
 *   PINS:    body = u64 mapping | u64 seq | u64 bytes: what the sending
 *            process pins now (registered with CUDA) of its mapping
 *            `mapping` (nonzero, the client's name for one mapping of the
 *            pool) of this server's pool; seq (nonzero) rises with each
 *            report of that mapping, so a report overtaken by a later one
 *            changes nothing. bytes at most the pool's; 0 ends the
 *            mapping's report. Empty answer. The server keeps the reports
 *            per client process (its unix peer's pid) for its stats, and
 *            trusts them for nothing else (docs/gpu.md).
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

#include <stddef.h>
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
#define GK_PINS_BODY_SIZE 24            /* PINS: u64 mapping | u64 seq | u64 bytes */

/* Every op, one line each: the only place an op's properties are stated
 * (Redis's commands.def; LAYOUT.md example 11). The enum, the names, the
 * header checks, the server's dispatch table (op_<name> in server_ops.c)
 * and the client's frame checks are all read off this list.
 *
 *   body     the request's control body (GK_BODY_*)
 *   results  what a success answer carries per frame (GK_RESULTS_*)
 *   trans    a transport's own frame, never an API call of its own
 *   in       the request carries the values (payload)
 *   out      the answer carries the values (payload)
 *   after    the answer's body goes on past its results
 *   reads    pins the objects to read them: disk-tier keys come back first
 *   reach    which connections may send it (GK_REACH_*); on any other the
 *            server skips it, answered UNSUPPORTED
 */
#define GK_OPS(X)                                                                         \
    /* NAME       code name        body      results  trans in out after reads reach */   \
    X(PING,        1, ping,        NONE,     NONE,    0,    0, 0,  0,    0,    ANY)       \
    X(EXISTS,      2, exists,      KEYS,     PER_KEY, 0,    0, 0,  0,    0,    ANY)       \
    X(GET,         3, get,         KEYS,     PER_KEY, 0,    0, 1,  0,    1,    ANY)       \
    X(PUT,         4, put,         KEYS,     PER_KEY, 0,    1, 0,  0,    0,    ANY)       \
    X(DELETE,      5, delete,      KEYS,     PER_KEY, 0,    0, 0,  0,    0,    ANY)       \
    X(STATS,       6, stats,       NONE,     NONE,    0,    0, 0,  1,    0,    ANY)       \
    X(CLEAR,       7, clear,       NS,       ONE,     0,    0, 0,  0,    0,    ANY)       \
    X(HELLO,       8, hello,       NONE,     ONE,     1,    0, 0,  0,    0,    LOCAL)     \
    X(LEASE,       9, lease,       KEYS,     PER_KEY, 1,    0, 0,  1,    1,    READER)    \
    X(RELEASE,    10, release,     NONE,     NONE,    1,    0, 0,  0,    0,    READER)    \
    X(RDMA_HELLO, 11, rdma_hello,  ENDPOINT, NONE,    1,    0, 0,  1,    0,    ANY)       \
    X(RESERVE,    12, reserve,     KEYS,     PER_KEY, 1,    0, 0,  1,    0,    WRITER)    \
    X(COMMIT,     13, commit,      VERDICTS, PER_KEY, 1,    0, 0,  0,    0,    COMMITTER) \
    X(AUTH,       14, auth,        NONCE,    NONE,    1,    0, 0,  1,    0,    ANY)       \
    X(PUT_STAGED, 15, put_staged,  KEYS,     PER_KEY, 1,    0, 0,  0,    0,    LOCAL)     \
    X(PINS,       16, pins,        PINS,     NONE,    1,    0, 0,  0,    0,    LOCAL)

/* A request's control body. */
enum gk_body {
    GK_BODY_NONE,           /* empty, count 0 */
    GK_BODY_KEYS,           /* namespace + count entries (gk_parse_request_body) */
    GK_BODY_NS,             /* namespace + no entries, count 0 */
    GK_BODY_ENDPOINT,       /* the client's rdma endpoint, count 0 */
    GK_BODY_VERDICTS,       /* count bytes, 1 to commit a key, 0 to abort it */
    GK_BODY_NONCE,          /* a 32-byte nonce or proof, count 0 */
    GK_BODY_PINS            /* a pin report (struct gk_pins), count 0 */
};

/* The results of a success answer. */
enum gk_results {
    GK_RESULTS_NONE,
    GK_RESULTS_PER_KEY,     /* one per entry of the request (COMMIT: per verdict) */
    GK_RESULTS_ONE
};

/* Which connections may send an op. */
enum gk_reach {
    GK_REACH_ANY,
    GK_REACH_LOCAL,         /* unix-socket peers (shm) */
    GK_REACH_READER,        /* peers that read the pool in place: local, or with live QPs */
    GK_REACH_WRITER,        /* peers that write it: live QPs, or local to a single-tenant pool */
    GK_REACH_COMMITTER      /* a writer, or one whose QPs were killed (COMMIT learns it) */
};

enum gk_opcode {
#define GK_OP_CODE(NAME, code, name, body, results, trans, in, out, after, reads, reach)     \
    GK_OP_##NAME = code,
    GK_OPS(GK_OP_CODE)
#undef GK_OP_CODE
    GK_OP_RESPONSE = 0x80
};

/* Opcodes run 1..GK_OP_MAX without a gap (protocol.c checks it). */
enum {
#define GK_OP_ONE(NAME, code, name, body, results, trans, in, out, after, reads, reach) +1
    GK_OP_MAX = 0 GK_OPS(GK_OP_ONE)
#undef GK_OP_ONE
};

/* One line of GK_OPS. */
struct gk_op_info {
    const char *name;
    enum gk_body body;
    enum gk_results results;
    unsigned transport : 1;
    unsigned payload_in : 1;
    unsigned payload_out : 1;
    unsigned body_after_results : 1;
    unsigned reads : 1;
    enum gk_reach reach;
};

extern const struct gk_op_info gk_op_table[GK_OP_MAX + 1];

/* The line of opcode (response bit ignored); an unknown opcode gets line 0,
 * named "unknown", whose request no check lets through. */
static inline const struct gk_op_info *gk_op(uint8_t opcode)
{
    opcode &= (uint8_t)~GK_OP_RESPONSE;
    return &gk_op_table[opcode <= GK_OP_MAX ? opcode : 0];
}

static inline const char *gk_op_name(uint8_t opcode)
{
    return gk_op(opcode)->name;
}

/* Whether opcode's request body is a namespace and entries (CLEAR's too,
 * with none). */
static inline int gk_op_is_keyed(uint8_t opcode)
{
    enum gk_body b = gk_op(opcode)->body;
    return b == GK_BODY_KEYS || b == GK_BODY_NS;
}

/* Whether opcode's answer carries a result per entry. */
static inline int gk_op_has_keys(uint8_t opcode)
{
    return gk_op(opcode)->results == GK_RESULTS_PER_KEY;
}

/* Results a success answer to a request of count entries carries. */
static inline uint32_t gk_op_result_count(uint8_t opcode, uint32_t count)
{
    enum gk_results r = gk_op(opcode)->results;
    return r == GK_RESULTS_PER_KEY ? count : r == GK_RESULTS_ONE ? 1 : 0;
}

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

/* PINS's body (protocol.h, top). */
struct gk_pins {
    uint64_t mapping;       /* nonzero */
    uint64_t seq;           /* nonzero, rising per mapping */
    uint64_t bytes;
};

void gk_pins_encode(uint8_t out[GK_PINS_BODY_SIZE], const struct gk_pins *p);
/* Reads a PINS body of len bytes: 0, or GDRKV_E_PROTOCOL when its length
 * is not GK_PINS_BODY_SIZE or mapping or seq is 0. (Whether bytes fits the
 * pool is the server's to check: it alone knows the pool.) */
int gk_pins_decode(const uint8_t *in, size_t len, struct gk_pins *p);

/* ------------------------------------------------------------ chunk lists
 *
 * LEASE's and RESERVE's answers go on past the results with one chunk
 * list per object held, in entry order:
 *   u32 nchunks | u32 reserved | nchunks x (u64 off | u64 len)
 */

/* Bytes one object's list of nchunks takes. */
static inline uint64_t gk_chunk_list_size(uint32_t nchunks)
{
    return GK_LEASE_OBJ_SIZE + (uint64_t)nchunks * GK_LEASE_CHUNK_SIZE;
}
/* Encodes a list's head, then each chunk; each returns where the next
 * bytes go. */
uint8_t *gk_chunk_list_encode(uint8_t *out, uint32_t nchunks);
uint8_t *gk_chunk_encode(uint8_t *out, uint64_t off, uint64_t len);

/* Reads the lists of an answer, object by object. */
struct gk_chunk_reader {
    const uint8_t *at;
    size_t left;            /* bytes of the lists not read yet */
};

void gk_chunk_reader_init(struct gk_chunk_reader *r, const uint8_t *lists, size_t len);
/* Takes the next object's list head: *nchunks chunks follow, all within
 * the bytes left. Returns 0 or GDRKV_E_PROTOCOL. */
int gk_chunk_reader_list(struct gk_chunk_reader *r, uint32_t *nchunks);
/* Takes the next chunk of the list just taken (the caller counts them). */
void gk_chunk_reader_chunk(struct gk_chunk_reader *r, uint64_t *off, uint64_t *len);
/* Whether every byte of the lists was read. */
static inline int gk_chunk_reader_done(const struct gk_chunk_reader *r)
{
    return r->left == 0;
}

/* ------------------------------------------------------------ rdma records
 *
 * RDMA_HELLO's bodies (docs/transports.md):
 *   endpoint: u8 eth | u8 mtu | u16 lid | u8 gid[16] | u32 rd_atomic |
 *             u32 sq_depth | u32 max_sge | u32 nqps | u32 reserved |
 *             nqps x (u32 qpn | u32 psn)
 *   server answer: its endpoint | u32 nregions | u32 reserved |
 *             nregions x (u64 pool_off | u64 len | u64 addr | u32 rkey | u32 reserved)
 *
 * In the request rd_atomic, sq_depth and max_sge are what the client asks
 * for; in the answer, what the server granted (never more).
 */
#define RDMA_MAX_QPS 16
#define RDMA_MAX_REGIONS 4096
#define RDMA_ENDPOINT_MIN 40        /* the fixed part */
#define RDMA_QP_WIRE_SIZE 8
#define RDMA_REGION_WIRE_SIZE 32

struct rdma_endpoint {
    uint8_t eth;
    uint8_t mtu;
    uint16_t lid;
    uint8_t gid[16];
    uint32_t rd_atomic;
    uint32_t sq_depth;
    uint32_t max_sge;
    uint32_t nqps;
    uint32_t qpn[RDMA_MAX_QPS];
    uint32_t psn[RDMA_MAX_QPS];
};

/* A registered piece of the server's pool: offsets [pool_off, pool_off +
 * len) are at addr under rkey. */
struct rdma_region {
    uint64_t pool_off, len, addr;
    uint32_t rkey;
};

size_t rdma_endpoint_size(const struct rdma_endpoint *e);
size_t rdma_endpoint_encode(const struct rdma_endpoint *e, uint8_t *out);
/* Returns the bytes consumed, or 0 when malformed. */
size_t rdma_endpoint_decode(const uint8_t *in, size_t len, struct rdma_endpoint *e);
/* The answer's tail after the server's endpoint: the pool's regions. */
size_t rdma_regions_size(uint32_t n);
size_t rdma_regions_encode(const struct rdma_region *regions, uint32_t n, uint8_t *out);
/* Fills regions from the answer's tail; returns the count or -1 when
 * malformed (counts, lengths, overlaps, regions out of pool order). */
int rdma_regions_decode(const uint8_t *in, size_t len, struct rdma_region *out, uint32_t max);


#endif
