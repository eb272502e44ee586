/*
 * auth.h - the shared secret of an authenticated deployment and the
 * handshake's arithmetic (docs/protocol.md, "Authentication").
 *
 * Challenge-response, mutual: the client sends a nonce, the server answers
 * with its own nonce and a proof, the client checks it and sends its proof.
 *
 *   server proof = HMAC-SHA256(token, "gdrkv-auth-1 server" | client nonce | server nonce)
 *   client proof = HMAC-SHA256(token, "gdrkv-auth-1 client" | client nonce | server nonce)
 *
 * The token never crosses the wire; fresh nonces on both sides make every
 * proof good for one connection only, and the two labels keep a proof of
 * one side from being replayed as the other's.
 */
#ifndef GDRKV_AUTH_H
#define GDRKV_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "protocol.h"

#define GK_TOKEN_MIN 16             /* bytes: a shorter secret is refused */
#define GK_TOKEN_MAX 4096

struct gk_token {
    size_t len;                     /* 0: no token */
    uint8_t bytes[GK_TOKEN_MAX];
};

/* Reads the token from path: the file's bytes without trailing whitespace.
 * The file must be a regular file that neither group nor others may read
 * or write, for the client as for the server: a secret others can read is
 * no secret, whichever side holds it. Returns 0, or GDRKV_E_INVALID with a
 * message in err naming the file and what is wrong. */
int gk_token_load(const char *path, struct gk_token *t, char *err, size_t errlen);

/* Fills a nonce from the kernel's random source; 0 or GDRKV_E_INTERNAL. */
int gk_auth_nonce(uint8_t nonce[GK_AUTH_NONCE_SIZE]);

enum gk_auth_role { GK_AUTH_SERVER, GK_AUTH_CLIENT };

void gk_auth_proof(const struct gk_token *t, enum gk_auth_role who,
                   const uint8_t client_nonce[GK_AUTH_NONCE_SIZE],
                   const uint8_t server_nonce[GK_AUTH_NONCE_SIZE],
                   uint8_t proof[GK_AUTH_PROOF_SIZE]);

/* Whether proof is who's proof for these nonces (constant time). */
int gk_auth_check(const struct gk_token *t, enum gk_auth_role who,
                  const uint8_t client_nonce[GK_AUTH_NONCE_SIZE],
                  const uint8_t server_nonce[GK_AUTH_NONCE_SIZE],
                  const uint8_t proof[GK_AUTH_PROOF_SIZE]);

#endif
