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
 */
#ifndef GDRKV_SERVER_STAGING_H
#define GDRKV_SERVER_STAGING_H

#include <stdint.h>

struct server_staging {
    const uint8_t *base;    /* the server's read-only mapping, or NULL */
    uint64_t len;
    int fd;                 /* until it went with HELLO's answer, else -1 */
};

/* Makes a staging memfd of len bytes and maps it. Pages cost nothing until
 * the client writes them (and then count against the client's memory
 * cgroup, which touched them first). 0, or -1 with errno. */
int server_staging_open(struct server_staging *st, uint64_t len);
void server_staging_close(struct server_staging *st);

#endif
