/*
 * server_payload.h - a cursor over the payload of one frame: which pool
 * bytes the next payload byte comes from (GET) or lands in (PUT).
 *
 * Objects are chains of pool chunks, so the payload is a list of pieces:
 * each chunk of each entry's object, in entry order. An entry without an
 * object carries no bytes in a GET response (a miss, or too small), but
 * its value still arrives in a PUT request (already present, or refused):
 * those bytes are read into a scratch buffer and dropped.
 */
#ifndef GDRKV_SERVER_PAYLOAD_H
#define GDRKV_SERVER_PAYLOAD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "common/protocol.h"
#include "store/store.h"

struct server_payload {
    uint8_t *base;                  /* store_base(): chunk offsets are relative to it */
    const struct gk_entry *entries;
    struct store_obj *const *objs;
    uint32_t count;
    int discard_missing;            /* PUT: entries without an object still carry bytes */
    uint32_t entry;                 /* piece under the cursor: entry... */
    uint32_t chunk;                 /* ...chunk of its object (0 when it has none)... */
    uint64_t off;                   /* ...and bytes of that piece already moved */
    uint64_t left;                  /* bytes until the end of the payload */
};

void server_payload_start(struct server_payload *p, uint8_t *base,
                          const struct gk_entry *entries, struct store_obj *const *objs,
                          uint32_t count, int discard_missing, uint64_t total);
/* Describes up to max of the next pieces as iovecs; discarded bytes all
 * point at scratch, at most scratch_len at a time. Returns the count. */
int server_payload_iov(const struct server_payload *p, uint8_t *scratch, size_t scratch_len,
                       struct iovec *iov, int max);
/* Moves the cursor past n bytes that were sent or received. */
void server_payload_advance(struct server_payload *p, uint64_t n);

#endif
