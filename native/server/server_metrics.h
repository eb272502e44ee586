/*
 * server_metrics.h - the server's counters in the Prometheus text format
 * (version 0.0.4; server_metrics_text.c), and the HTTP endpoint that
 * serves them (`gdrkv serve --metrics-listen`; server_metrics.c). Names
 * are gdrkv_*, counters end in _total, units are spelled out (bytes,
 * seconds), op latencies are histograms.
 *
 * The endpoint has a thread of its own and serves up to
 * METRICS_SCRAPERS_MAX scrapers at once; each must send its whole request
 * within METRICS_REQUEST_TIMEOUT_MS of connecting and read its whole
 * answer within METRICS_ANSWER_TIMEOUT_MS, so a peer that trickles or
 * stalls holds one slot until then and no other scrape. With a token
 * file, requests without `Authorization: Bearer <token>` get 401. The
 * counters are read as stats calls read them; the namespaces' usage is
 * copied under the store's lock and formatted after it.
 */
#ifndef GDRKV_SERVER_METRICS_H
#define GDRKV_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct gdrkv_server;
struct gk_addr;
struct gk_text;

#define METRICS_SCRAPERS_MAX 16
#define METRICS_REQUEST_TIMEOUT_MS 2000ull
#define METRICS_ANSWER_TIMEOUT_MS 10000ull
/* The text but the namespaces' series, and one namespace label's room
 * (every byte percent-encoded, and the NUL). */
#define METRICS_FIXED_TEXT_MAX (1u << 20)
#define METRICS_LABEL_MAX (3 * 255 + 1)
/* The most namespaces metrics_namespaces may give series of their own. */
#define METRICS_NAMESPACES_MAX 10000u

void server_metrics_text(struct gdrkv_server *s, struct gk_text *t);

/* A namespace's name as a label value, lossless: bytes outside printable
 * ASCII, and the quote, the backslash and the percent sign, as %XX (so
 * the value needs no escaping in the text format). out has room for
 * 3 * len + 1 bytes. */
void metrics_label_value(char *out, const uint8_t *name, uint32_t len);

/* Starts the endpoint on addr, wanting the bearer token in token_file
 * (NULL or "": none; the file must be private, as --auth-token-file's):
 * 0, or a negative gdrkv_error with a message in err.
 * server_metrics_stop (safe when never started) ends it. */
int server_metrics_start(struct gdrkv_server *s, const struct gk_addr *addr,
                         const char *token_file, char *err, size_t errlen);
void server_metrics_stop(struct gdrkv_server *s);

#endif
