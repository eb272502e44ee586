/*
 * sha256.h - SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the
 * authentication handshake (auth.h). Small and dependency-free: the build
 * needs no crypto library. Not for bulk data: it runs a few times per
 * connection.
 */
#ifndef GDRKV_SHA256_H
#define GDRKV_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define GK_SHA256_SIZE 32
#define GK_SHA256_BLOCK 64

struct gk_sha256 {
    uint32_t h[8];
    uint64_t total;                 /* bytes hashed so far */
    uint8_t block[GK_SHA256_BLOCK];
    size_t used;                    /* bytes waiting in block */
};

void gk_sha256_init(struct gk_sha256 *s);
void gk_sha256_update(struct gk_sha256 *s, const void *data, size_t len);
void gk_sha256_final(struct gk_sha256 *s, uint8_t out[GK_SHA256_SIZE]);

/* HMAC-SHA256 of the concatenation of the n parts under key. */
void gk_hmac_sha256(const uint8_t *key, size_t key_len, const void *const *parts,
                    const size_t *lens, int n, uint8_t out[GK_SHA256_SIZE]);

/* 1 when the len bytes at a and b are equal, in time independent of where
 * they differ (proof checks must not leak how much of a guess was right). */
int gk_equal_ct(const uint8_t *a, const uint8_t *b, size_t len);

#endif
