/*
 * auth.c - see auth.h.
 */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gdrkv.h"
#include "sha256.h"

int gk_token_load(const char *path, struct gk_token *t, char *err, size_t errlen)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        snprintf(err, errlen, "token file %s: %s", path, strerror(errno));
        return GDRKV_E_INVALID;
    }
    const char *why = NULL;
    ssize_t n = -1;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        why = "not a regular file";
    else if (st.st_mode & 077)
        why = "group or others may access it (chmod 600 it)";
    else if (st.st_size > GK_TOKEN_MAX)
        why = "longer than 4096 bytes";
    else if ((n = read(fd, t->bytes, sizeof t->bytes)) < 0)
        why = strerror(errno);
    close(fd);
    while (n > 0 && strchr(" \t\r\n", t->bytes[n - 1]))
        n--;
    if (!why && n < GK_TOKEN_MIN)
        why = "shorter than 16 bytes (make one with: openssl rand -hex 32)";
    if (why) {
        memset(t, 0, sizeof *t);
        snprintf(err, errlen, "token file %s: %s", path, why);
        return GDRKV_E_INVALID;
    }
    t->len = (size_t)n;
    return 0;
}

int gk_auth_nonce(uint8_t nonce[GK_AUTH_NONCE_SIZE])
{
    size_t got = 0;
    while (got < GK_AUTH_NONCE_SIZE) {
        ssize_t n = getrandom(nonce + got, GK_AUTH_NONCE_SIZE - got, 0);
        if (n < 0 && errno != EINTR)
            return GDRKV_E_INTERNAL;
        got += n > 0 ? (size_t)n : 0;
    }
    return 0;
}

void gk_auth_proof(const struct gk_token *t, enum gk_auth_role who,
                   const uint8_t client_nonce[GK_AUTH_NONCE_SIZE],
                   const uint8_t server_nonce[GK_AUTH_NONCE_SIZE],
                   uint8_t proof[GK_AUTH_PROOF_SIZE])
{
    static const char server_label[] = "gdrkv-auth-1 server";
    static const char client_label[] = "gdrkv-auth-1 client";
    const void *parts[] = {who == GK_AUTH_SERVER ? server_label : client_label, client_nonce,
                           server_nonce};
    const size_t lens[] = {sizeof server_label - 1, GK_AUTH_NONCE_SIZE, GK_AUTH_NONCE_SIZE};
    gk_hmac_sha256(t->bytes, t->len, parts, lens, 3, proof);
}

int gk_auth_check(const struct gk_token *t, enum gk_auth_role who,
                  const uint8_t client_nonce[GK_AUTH_NONCE_SIZE],
                  const uint8_t server_nonce[GK_AUTH_NONCE_SIZE],
                  const uint8_t proof[GK_AUTH_PROOF_SIZE])
{
    uint8_t want[GK_AUTH_PROOF_SIZE];
    gk_auth_proof(t, who, client_nonce, server_nonce, want);
    return gk_equal_ct(want, proof, GK_AUTH_PROOF_SIZE);
}
