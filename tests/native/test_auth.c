/*
 * test_auth.c - SHA-256 against FIPS 180-4's examples, HMAC-SHA256 against
 * RFC 4231's test cases, and the token file rules of common/auth.h.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "common/auth.h"
#include "common/sha256.h"
#include "gdrkv.h"

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

static void check_sha(const void *data, size_t len, size_t piece, const char *want)
{
    struct gk_sha256 s;
    uint8_t d[GK_SHA256_SIZE];
    char got[2 * GK_SHA256_SIZE + 1];
    gk_sha256_init(&s);
    /* Fed in pieces: block boundaries must not matter. */
    for (size_t off = 0; off < len; off += piece)
        gk_sha256_update(&s, (const uint8_t *)data + off, len - off < piece ? len - off : piece);
    gk_sha256_final(&s, d);
    hex(d, sizeof d, got);
    CHECK(strcmp(got, want) == 0, "sha256 of %zu bytes: %s, want %s", len, got, want);
}

static void test_sha256(void)
{
    check_sha("", 0, 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check_sha("abc", 3, 1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    for (size_t piece = 1; piece <= 64; piece *= 2)
        check_sha(two, strlen(two), piece,
                  "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    size_t million = 1000000;
    char *a = malloc(million);
    CHECK(a, "malloc");
    memset(a, 'a', million);
    check_sha(a, million, 4093, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
}

static void check_hmac(const uint8_t *key, size_t key_len, const char *msg, size_t msg_len,
                       const char *want)
{
    uint8_t d[GK_SHA256_SIZE];
    char got[2 * GK_SHA256_SIZE + 1];
    /* The message in two parts, as the handshake passes label and nonces. */
    size_t half = msg_len / 2;
    const void *parts[] = {msg, msg + half};
    const size_t lens[] = {half, msg_len - half};
    gk_hmac_sha256(key, key_len, parts, lens, 2, d);
    hex(d, sizeof d, got);
    CHECK(strcmp(got, want) == 0, "hmac: %s, want %s", got, want);
}

static void test_hmac_rfc4231(void)
{
    uint8_t k[131];
    memset(k, 0x0b, 20);
    check_hmac(k, 20, "Hi There", 8,
               "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    check_hmac((const uint8_t *)"Jefe", 4, "what do ya want for nothing?", 28,
               "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    char msg[50];
    memset(k, 0xaa, 20);
    memset(msg, 0xdd, sizeof msg);
    check_hmac(k, 20, msg, sizeof msg,
               "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
    /* Case 6: a key longer than a block is hashed first. */
    memset(k, 0xaa, sizeof k);
    const char *big = "Test Using Larger Than Block-Size Key - Hash Key First";
    check_hmac(k, sizeof k, big, strlen(big),
               "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

static void test_equal_ct(void)
{
    uint8_t a[32] = {0}, b[32] = {0};
    CHECK(gk_equal_ct(a, b, 32), "equal");
    b[31] = 1;
    CHECK(!gk_equal_ct(a, b, 32), "last byte differs");
    b[31] = 0, b[0] = 0x80;
    CHECK(!gk_equal_ct(a, b, 32), "first byte differs");
}

static void write_file(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0, "open %s", path);
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text), "write");
    CHECK(fchmod(fd, mode) == 0, "chmod");
    close(fd);
}

static void test_token_file(void)
{
    char dir[] = "/tmp/gdrkv-auth-XXXXXX", path[64], err[300];
    CHECK(mkdtemp(dir), "mkdtemp");
    snprintf(path, sizeof path, "%s/token", dir);
    static struct gk_token t;

    write_file(path, "0123456789abcdef0123\n\n", 0600);
    CHECK_EQ(gk_token_load(path, &t, err, sizeof err), 0);
    CHECK_EQ(t.len, 20u);                   /* trailing newlines are not the secret */
    CHECK(memcmp(t.bytes, "0123456789abcdef0123", 20) == 0, "token bytes");

    write_file(path, "0123456789abcdef0123", 0640);
    CHECK_EQ(gk_token_load(path, &t, err, sizeof err), GDRKV_E_INVALID);
    CHECK(strstr(err, "chmod 600") && strstr(err, path), "%s", err);
    CHECK_EQ(t.len, 0u);
    write_file(path, "0123456789abcdef0123", 0604);     /* others only: refused too */
    CHECK_EQ(gk_token_load(path, &t, err, sizeof err), GDRKV_E_INVALID);

    write_file(path, "short\n", 0600);
    CHECK_EQ(gk_token_load(path, &t, err, sizeof err), GDRKV_E_INVALID);
    CHECK(strstr(err, "shorter than 16"), "%s", err);

    unlink(path);
    CHECK_EQ(gk_token_load(path, &t, err, sizeof err), GDRKV_E_INVALID);
    CHECK(strstr(err, "No such file"), "%s", err);
    CHECK_EQ(gk_token_load(dir, &t, err, sizeof err), GDRKV_E_INVALID);
    CHECK(strstr(err, "not a regular file"), "%s", err);
    rmdir(dir);
}

static void test_proofs(void)
{
    static struct gk_token t = {.len = 16, .bytes = "0123456789abcdef"};
    static struct gk_token other = {.len = 16, .bytes = "0123456789abcdeF"};
    uint8_t cn[GK_AUTH_NONCE_SIZE], sn[GK_AUTH_NONCE_SIZE], p[GK_AUTH_PROOF_SIZE];
    CHECK_EQ(gk_auth_nonce(cn), 0);
    CHECK_EQ(gk_auth_nonce(sn), 0);
    CHECK(memcmp(cn, sn, sizeof cn) != 0, "two nonces are different");
    gk_auth_proof(&t, GK_AUTH_CLIENT, cn, sn, p);
    CHECK(gk_auth_check(&t, GK_AUTH_CLIENT, cn, sn, p), "the client's own proof");
    CHECK(!gk_auth_check(&t, GK_AUTH_SERVER, cn, sn, p), "a client proof is no server proof");
    CHECK(!gk_auth_check(&other, GK_AUTH_CLIENT, cn, sn, p), "another token");
    CHECK(!gk_auth_check(&t, GK_AUTH_CLIENT, sn, cn, p), "nonces swapped");
}

int main(void)
{
    RUN(test_sha256);
    RUN(test_hmac_rfc4231);
    RUN(test_equal_ct);
    RUN(test_token_file);
    RUN(test_proofs);
    return check_done("test_auth");
}
