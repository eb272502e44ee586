/*
 * server_reply.h - the one way a handler answers a frame (Redis's addReply
 * family): a handler says what the answer is, these encode it into the
 * connection's output buffer, and nothing else writes there. The
 * connection (server_conn.c) then sends it, with HELLO's fds, followed for
 * GET by the values straight from their pinned chunks. Each returns 0, or GDRKV_E_INTERNAL
 * when out of memory (the connection is closed then).
 */
#ifndef GDRKV_SERVER_REPLY_H
#define GDRKV_SERVER_REPLY_H

#include <stddef.h>
#include <stdint.h>

#include "common/protocol.h"

struct rdma_endpoint;
struct rdma_region;
struct server_conn;
struct store_obj;

/* A status and nothing else. */
int server_reply_status(struct server_conn *c, int32_t status);
/* No answer at all: the frame ends once handled (an unanswered RELEASE). */
void server_reply_none(struct server_conn *c);
/* A refusal of the whole frame: status code, msg as the body. */
int server_reply_error(struct server_conn *c, int32_t code, const char *msg, size_t len);
/* One result per key (status, size); sizes may be NULL when every size is 0. */
int server_reply_results(struct server_conn *c, uint32_t n, const int32_t *status,
                         const uint64_t *sizes, uint64_t payload_len);
/* LEASE's and RESERVE's answer: the results, then the chunk list of every
 * object held (objs[i] not NULL). GDRKV_E_TOO_LARGE, with nothing
 * written, when the lists would exceed the body limit. */
int server_reply_chunk_lists(struct server_conn *c, uint32_t n, const int32_t *status,
                             const uint64_t *sizes, struct store_obj *const *objs);
/* RDMA_HELLO's answer: the server's endpoint and the pool's regions. */
int server_reply_rdma_hello(struct server_conn *c, const struct rdma_endpoint *mine,
                            const struct rdma_region *regions, uint32_t nregions);
/* The first AUTH's answer: the server's nonce and its proof. */
int server_reply_auth_challenge(struct server_conn *c, const uint8_t nonce[GK_AUTH_NONCE_SIZE],
                                const uint8_t proof[GK_AUTH_PROOF_SIZE]);
/* HELLO's answer: the pool's size as the one result, flags, and the pool's
 * and the staging memfds (staging_fd -1: none) sent with its first byte. */
int server_reply_hello(struct server_conn *c, uint64_t pool_size, uint16_t flags, int pool_fd,
                       int staging_fd);
/* Sets the header flags of the answer just started (PUT_STAGED's stop). */
void server_reply_flags(struct server_conn *c, uint16_t flags);
/* len bytes of text (STATS). */
int server_reply_text(struct server_conn *c, const char *text, size_t len);

#endif
