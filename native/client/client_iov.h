/*
 * client_iov.h - the bytes of one frame direction as a stream of iovec
 * windows for sendmsg/readv: an optional head (the request header and
 * body), then the values of a run of keys, each laid over its caller's
 * segments in order. This is what makes transfers zero-copy: PUT values go
 * out of, and GET values land in, the caller's memory directly.
 */
#ifndef GDRKV_CLIENT_IOV_H
#define GDRKV_CLIENT_IOV_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "client_state.h"

/* Entries handed to one syscall: well under IOV_MAX, and enough to move a
 * megabyte of 4 KiB values per call. */
#define CLIENT_IOV_WINDOW 256

struct client_iov {
    /* What is not yet in the window. */
    const uint8_t *head;
    size_t head_len;
    const struct client_batch *batch;
    const uint64_t *seg_ptrs;   /* where each segment's bytes are, by segment index */
    const uint64_t *lens;       /* bytes each key contributes, by position */
    uint32_t pos, end;          /* keys left: positions [pos, end) */
    uint64_t seg;               /* current key's next segment */
    uint64_t key_left;          /* current key's bytes not yet in the window */

    /* Built but not yet moved. */
    struct iovec win[CLIENT_IOV_WINDOW];
    uint32_t win_first, win_count;
    size_t win_bytes;

    uint64_t left;              /* bytes not yet moved, window included */
};

/* head may be NULL; keys [first, first + count) contribute lens[p] bytes
 * each, which must not exceed the capacity of their segments; segment s
 * of b is at seg_ptrs[s] (b->seg_ptrs, or a GPU call's per-frame table
 * that places GPU segments in staging). */
void client_iov_init(struct client_iov *v, const uint8_t *head, size_t head_len,
                     const struct client_batch *b, const uint64_t *seg_ptrs, uint32_t first,
                     uint32_t count, const uint64_t *lens);
/* The next entries to move (*count of them, *bytes in total). */
const struct iovec *client_iov_window(struct client_iov *v, int *count, size_t *bytes);
/* Marks the first n bytes of the window as moved. */
void client_iov_advance(struct client_iov *v, size_t n);

static inline uint64_t client_iov_left(const struct client_iov *v)
{
    return v->left;
}

#endif
