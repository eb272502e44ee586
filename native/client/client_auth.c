/*
 * client_auth.c - see client_auth.h.
 */
#include "client_auth.h"

#include <string.h>

#include "common/common.h"
#include "common/log.h"
#include "common/net.h"
#include "common/protocol.h"
#include "gdrkv.h"

/* Of an error answer's message, what the log shows. */
#define AUTH_MESSAGE_MAX 200

static int send_auth(int fd, const uint8_t body[GK_AUTH_NONCE_SIZE], uint64_t req_id,
                     uint64_t deadline_ns)
{
    uint8_t frame[GK_HDR_SIZE + GK_AUTH_NONCE_SIZE];
    struct gk_hdr h = {.magic = GK_MAGIC, .version = GK_VERSION, .opcode = GK_OP_AUTH,
                       .body_len = GK_AUTH_NONCE_SIZE, .req_id = req_id};
    gk_hdr_encode(&h, frame);
    memcpy(frame + GK_HDR_SIZE, body, GK_AUTH_NONCE_SIZE);
    return gk_send_all(fd, frame, sizeof frame, deadline_ns);
}

/* Reads the answer to AUTH req_id into body (exactly want bytes on
 * success). A refusal is logged with the server's message and returned as
 * DENIED: a server without a token can't vouch for itself either. */
static int recv_answer(int fd, uint64_t req_id, uint8_t *body, uint32_t want, const char *name,
                       uint64_t deadline_ns)
{
    uint8_t raw[GK_HDR_SIZE];
    struct gk_hdr h;
    int rc = gk_recv_all(fd, raw, sizeof raw, deadline_ns);
    if (rc)
        return rc;
    gk_hdr_decode(raw, &h);
    if (h.magic != GK_MAGIC || h.opcode != (GK_OP_AUTH | GK_OP_RESPONSE) || h.req_id != req_id ||
        h.payload_len != 0 || h.count != 0)
        return GDRKV_E_PROTOCOL;
    if (h.status == 0)
        return h.body_len == want ? gk_recv_all(fd, body, want, deadline_ns) : GDRKV_E_PROTOCOL;
    char msg[AUTH_MESSAGE_MAX + 1] = "";
    if (h.status > 0 || h.body_len > AUTH_MESSAGE_MAX ||
        gk_recv_all(fd, msg, h.body_len, deadline_ns))
        return GDRKV_E_PROTOCOL;
    GK_WARN("server %s refused to authenticate: %s (%s)", name, msg, gdrkv_strerror(h.status));
    return GDRKV_E_DENIED;
}

int client_auth(int fd, const struct gk_token *t, const char *name, uint64_t deadline_ns)
{
    uint8_t client_nonce[GK_AUTH_NONCE_SIZE], proof[GK_AUTH_PROOF_SIZE];
    uint8_t challenge[GK_AUTH_NONCE_SIZE + GK_AUTH_PROOF_SIZE];

    if (gk_auth_nonce(client_nonce))
        return GDRKV_E_INTERNAL;
    int rc = send_auth(fd, client_nonce, 1, deadline_ns);
    if (rc == 0)
        rc = recv_answer(fd, 1, challenge, sizeof challenge, name, deadline_ns);
    if (rc)
        return rc;
    const uint8_t *server_nonce = challenge, *server_proof = challenge + GK_AUTH_NONCE_SIZE;
    if (!gk_auth_check(t, GK_AUTH_SERVER, client_nonce, server_nonce, server_proof)) {
        GK_WARN("server %s's proof does not match our token (another token, or another "
                "server): not trusting it", name);
        return GDRKV_E_DENIED;
    }
    gk_auth_proof(t, GK_AUTH_CLIENT, client_nonce, server_nonce, proof);
    rc = send_auth(fd, proof, 2, deadline_ns);
    return rc ? rc : recv_answer(fd, 2, NULL, 0, name, deadline_ns);
}
