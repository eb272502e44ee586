/*
 * server_metrics_http.h - what a /metrics scraper asked for: the one
 * parser of its bytes, kept apart so it can be fuzzed
 * (tests/native/fuzz_metrics.c). It reads an HTTP/1.x request head: the
 * request line and, when the endpoint has a token, an
 * `Authorization: Bearer <token>` header (Prometheus'
 * `authorization: {credentials_file: ...}`), compared in constant time.
 */
#ifndef GDRKV_SERVER_METRICS_HTTP_H
#define GDRKV_SERVER_METRICS_HTTP_H

#include <stddef.h>

struct gk_token;

/* The longest request head read; a longer one is answered 400. */
#define METRICS_REQUEST_MAX 8192

enum metrics_request {
    METRICS_REQ_INCOMPLETE,     /* the head has not all arrived yet */
    METRICS_REQ_METRICS,        /* GET /metrics, with the token when one is wanted */
    METRICS_REQ_NOT_FOUND,      /* another method or path (404) */
    METRICS_REQ_UNAUTHORIZED,   /* a token is wanted and was not given (401) */
    METRICS_REQ_BAD             /* not an HTTP request head, or over METRICS_REQUEST_MAX (400) */
};

/* What the len bytes of buf (any bytes; no NUL needed) ask for. token: the
 * endpoint's bearer token, or NULL or one of length 0 for none. */
enum metrics_request metrics_parse_request(const char *buf, size_t len,
                                           const struct gk_token *token);

#endif
