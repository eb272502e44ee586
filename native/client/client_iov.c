/*
 * client_iov.c - see client_iov.h.
 *
 * The window is refilled only when it runs low, so each entry is built
 * once however many syscalls it takes to move: a partial send or read
 * just trims the entry it stopped in.
 */
#include "client_iov.h"

#include <string.h>

#include "common/common.h"

void client_iov_init(struct client_iov *v, const uint8_t *head, size_t head_len,
                     const struct client_batch *b, const uint64_t *seg_ptrs, uint32_t first,
                     uint32_t count, const uint64_t *lens)
{
    v->head = head;
    v->head_len = head_len;
    v->batch = b;
    v->seg_ptrs = seg_ptrs;
    v->lens = lens;
    v->pos = first;
    v->end = first + count;
    v->seg = 0;
    v->key_left = 0;
    v->win_first = 0;
    v->win_count = 0;
    v->win_bytes = 0;
    v->left = head_len;
    for (uint32_t p = first; p < v->end; p++)
        v->left += lens[p];
}

/* The next piece of the stream, or 0 when everything is in the window. */
static size_t next_piece(struct client_iov *v, void **base)
{
    const struct client_batch *b = v->batch;

    if (v->head_len) {
        size_t len = v->head_len;
        *base = (void *)v->head;
        v->head_len = 0;
        return len;
    }
    for (;;) {
        while (v->key_left == 0) {
            if (v->pos == v->end)
                return 0;
            v->key_left = v->lens[v->pos];
            v->seg = b->first_seg[v->pos];
            v->pos++;
        }
        /* key_left never exceeds what the key's remaining segments hold
         * (checked against the capacity before the stream was set up). */
        uint64_t len = GK_MIN(b->seg_lens[v->seg], v->key_left);
        *base = (void *)(uintptr_t)v->seg_ptrs[v->seg];
        v->seg++;
        v->key_left -= len;
        if (len)
            return (size_t)len;
    }
}

static void refill(struct client_iov *v)
{
    if (!v->head_len && !v->key_left && v->pos == v->end)
        return;
    if (v->win_first) {
        memmove(v->win, v->win + v->win_first, v->win_count * sizeof v->win[0]);
        v->win_first = 0;
    }
    while (v->win_count < CLIENT_IOV_WINDOW) {
        struct iovec *e = &v->win[v->win_count];
        e->iov_len = next_piece(v, &e->iov_base);
        if (!e->iov_len)
            return;
        v->win_bytes += e->iov_len;
        v->win_count++;
    }
}

const struct iovec *client_iov_window(struct client_iov *v, int *count, size_t *bytes)
{
    if (v->win_count < CLIENT_IOV_WINDOW / 2)
        refill(v);
    *count = (int)v->win_count;
    *bytes = v->win_bytes;
    return v->win + v->win_first;
}

void client_iov_advance(struct client_iov *v, size_t n)
{
    v->left -= n;
    v->win_bytes -= n;
    while (n) {
        struct iovec *e = &v->win[v->win_first];
        if (n < e->iov_len) {
            e->iov_base = (uint8_t *)e->iov_base + n;
            e->iov_len -= n;
            return;
        }
        n -= e->iov_len;
        v->win_first++;
        v->win_count--;
    }
}
