/*
 * server_staging.h - the staging memfd of a local connection: where a
 * client of the shm transport puts PUT values for the server to copy into
 * the pool (PUT_STAGED), since its own mapping of the pool is read-only.
 *
 * The server makes the memfd and passes it with HELLO's answer. It is
 * sealed against shrinking and growing before the client gets it, so the
 * client can't truncate it under the server's copies (SIGBUS); the server
 * maps it read-only. What the client writes there can only ever become
 * the bytes of its own PUT's objects, which it chose anyway.
 *
 * Its last GK_LEASE_WORD_BYTES hold the lease word (protocol.h), which the
 * server writes and the client reads to see its lease still held without
 * waiting for RELEASE's answer. The client may write it too: that can only
 * make it trust bytes of its own GETs it should not have, never touch the
 * server or another client. The same room holds the staged word, which
 * the client writes as it copies a PUT_STAGED_FOLLOW's values and the
 * server reads to copy behind it; a wrong one can only make the server
 * copy staging bytes, within the frame's values, into the client's own
 * objects too early, or stop and send the frame back (within a bound:
 * server_ops.c, FOLLOW_STALL_NS).
 */
#ifndef GDRKV_SERVER_STAGING_H
#define GDRKV_SERVER_STAGING_H

#include <stdint.h>

struct server_staging {
    const uint8_t *base;    /* the server's mapping, or NULL */
    uint64_t len;           /* bytes for values: the memfd's but the lease word's */
    uint32_t *lease_word;   /* after them */
    const uint64_t *staged_word;    /* in that room: staging bytes in place (PUT_STAGED_FOLLOW) */
    int fd;                 /* until it went with HELLO's answer, else -1 */
};

/* Makes a staging memfd for len bytes of values (rounded up to 64) and the
 * lease word, and maps it. Pages cost nothing until written (values count
 * against the client's memory cgroup, which touches them first). 0, or -1
 * with errno. */
int server_staging_open(struct server_staging *st, uint64_t len);
void server_staging_close(struct server_staging *st);
/* Sets the lease word: GK_LEASE_HELD when a LEASE with bytes to copy is answered, 0
 * before they go. Ordered before everything the server does after it. */
void server_staging_lease(struct server_staging *st, uint32_t held);

#endif
