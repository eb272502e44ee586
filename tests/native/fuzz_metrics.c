/*
 * fuzz_metrics.c - fuzz target for the /metrics request parser
 * (native/server/server_metrics_http.c), the code that reads a scraper's
 * bytes. Each input is parsed as it is, at every length a byte at a time
 * would reach, and with and without a token, in a buffer of exactly its
 * size (ASan sees any read past it). Invariants: an answer once given
 * does not change as more bytes come; without a token nothing is
 * UNAUTHORIZED; with one, METRICS only when the input holds the token;
 * INCOMPLETE only below METRICS_REQUEST_MAX.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_NAME "fuzz_metrics"
#include "fuzz_driver.h"
#include "common/auth.h"
#include "server/server_metrics_http.h"

static const char TOKEN[] = "fuzz-metrics-token-0123456789";

static const struct gk_token *token(void)
{
    static struct gk_token t;
    if (!t.len) {
        t.len = sizeof TOKEN - 1;
        memcpy(t.bytes, TOKEN, t.len);
    }
    return &t;
}

static void check_one(const char *data, size_t size, const struct gk_token *t)
{
    enum metrics_request last = METRICS_REQ_INCOMPLETE;
    /* Every prefix a trickling peer could have sent, then the whole. */
    for (size_t len = size > 16 ? size - 16 : 0; len <= size; len++) {
        char *copy = malloc(len ? len : 1);
        check(copy != NULL, "allocation");
        memcpy(copy, data, len);
        enum metrics_request got = metrics_parse_request(copy, len, t);
        free(copy);
        check(got >= METRICS_REQ_INCOMPLETE && got <= METRICS_REQ_BAD, "answer in range");
        check(last == METRICS_REQ_INCOMPLETE || got == last, "answer stable as bytes come");
        check(got != METRICS_REQ_INCOMPLETE || len < METRICS_REQUEST_MAX,
              "incomplete past the limit");
        check(t || got != METRICS_REQ_UNAUTHORIZED, "unauthorized without a token");
        check(!t || got != METRICS_REQ_METRICS || memmem(data, len, TOKEN, sizeof TOKEN - 1),
              "metrics without the token");
        last = got;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_one((const char *)data, size, NULL);
    check_one((const char *)data, size, token());
    return 0;
}

#ifndef GK_LIBFUZZER

static size_t make_valid(uint8_t *buf, size_t cap)
{
    static const char *const lines[] = {
        "GET /metrics HTTP/1.1", "GET /metrics?x=1 HTTP/1.0", "GET / HTTP/1.1",
        "POST /metrics HTTP/1.1", "GET /metricsX HTTP/1.1", "GET /metrics HTTP/2",
    };
    static const char *const headers[] = {
        "Host: 127.0.0.1:9480", "Accept: text/plain", "Authorization: Bearer ",
        "authorization:bearer ", "Authorization: Basic ", "X-Prometheus-Scrape-Timeout-Seconds: 10",
    };
    size_t len = 0;
    len += (size_t)snprintf((char *)buf + len, cap - len, "%s\r\n", lines[rnd() % 6]);
    for (int n = (int)(rnd() % 4); n > 0 && len < cap; n--) {
        const char *h = headers[rnd() % 6];
        int with_token = strstr(h, "Bearer") || strstr(h, "bearer");
        len += (size_t)snprintf((char *)buf + len, cap - len, "%s%s\r\n", h,
                                with_token && rnd() % 4 ? TOKEN : "");
    }
    if (len < cap)
        len += (size_t)snprintf((char *)buf + len, cap - len, rnd() % 2 ? "\r\n" : "\n");
    return len < cap ? len : cap;
}

static size_t mutate_once(uint8_t *buf, size_t len, size_t cap)
{
    switch (rnd() % 4) {
    case 0: /* a line ending dropped or doubled */
        if (len) {
            size_t at = rnd() % len;
            buf[at] = rnd() % 2 ? '\n' : '\r';
        }
        return len;
    case 1: /* a long header, up to and past the head's limit */
        while (len < cap && len < METRICS_REQUEST_MAX + 16 && rnd() % 512)
            buf[len++] = 'a';
        return len;
    default:
        return mutate_bytes(buf, len, cap);
    }
}

int main(int argc, char **argv)
{
    static uint8_t buf[METRICS_REQUEST_MAX * 2];
    return fuzz_main(argc, argv, buf, sizeof buf, 4);
}

#endif
