/*
 * server_metrics_http.c - see server_metrics_http.h. Only what a scraper
 * sends is understood: the request line `GET /metrics[?...] HTTP/1.x`
 * and header lines `Name: value`; a head ends at an empty line (CRLF or
 * LF). The token is checked before the path, so a caller without it
 * learns nothing of what is served.
 */
#include "server_metrics_http.h"

#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "common/auth.h"
#include "common/sha256.h"

/* The length of the head through its empty line, or 0 while it is not in. */
static size_t head_length(const char *buf, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != '\n')
            continue;
        if (i + 1 < len && buf[i + 1] == '\n')
            return i + 2;
        if (i + 2 < len && buf[i + 1] == '\r' && buf[i + 2] == '\n')
            return i + 3;
    }
    return 0;
}

/* The line at *pos (its \r\n or \n left out); advances *pos past it. */
static size_t next_line(const char *head, size_t len, size_t *pos, const char **line)
{
    const char *start = head + *pos;
    const char *nl = memchr(start, '\n', len - *pos);
    size_t n = nl ? (size_t)(nl - start) : len - *pos;
    *pos += n + (nl != NULL);
    *line = start;
    return n && start[n - 1] == '\r' ? n - 1 : n;
}

static int starts_with(const char *s, size_t n, const char *prefix)
{
    size_t p = strlen(prefix);
    return n >= p && !memcmp(s, prefix, p);
}

/* The request line: 1 for GET /metrics, 0 for another method or path,
 * -1 when it is not a request line at all. */
static int wants_metrics(const char *line, size_t n)
{
    const char *sp = memchr(line, ' ', n);
    if (!sp || sp == line)
        return -1;
    size_t rest = n - (size_t)(sp + 1 - line);
    const char *target = sp + 1, *sp2 = memchr(target, ' ', rest);
    if (!sp2 || !starts_with(sp2 + 1, rest - (size_t)(sp2 + 1 - target), "HTTP/1."))
        return -1;
    size_t tlen = (size_t)(sp2 - target);
    int get = sp - line == 3 && !memcmp(line, "GET", 3);
    int path = (tlen == 8 || (tlen > 8 && target[8] == '?')) && starts_with(target, tlen, "/metrics");
    return get && path;
}

static int is_blank(char c)
{
    return c == ' ' || c == '\t';
}

/* Whether the header line is `Authorization: Bearer <token>` (the name
 * and the scheme in any case, blanks around the value). */
static int carries_token(const char *line, size_t n, const struct gk_token *token)
{
    static const char name[] = "authorization:", scheme[] = "bearer";
    size_t i = sizeof name - 1;

    if (n < i || strncasecmp(line, name, i))
        return 0;
    while (i < n && is_blank(line[i]))
        i++;
    if (n - i < sizeof scheme || strncasecmp(line + i, scheme, sizeof scheme - 1) ||
        !is_blank(line[i + sizeof scheme - 1]))
        return 0;
    i += sizeof scheme - 1;
    while (i < n && is_blank(line[i]))
        i++;
    while (n > i && is_blank(line[n - 1]))
        n--;
    /* Constant time in the token: every byte of it is compared whatever
     * was given, and the given length only decides the answer. */
    uint8_t given[GK_TOKEN_MAX];
    size_t given_len = n - i;
    memset(given, 0, sizeof given);
    memcpy(given, line + i, given_len < sizeof given ? given_len : sizeof given);
    int same = gk_equal_ct(given, token->bytes, token->len);
    return same & (given_len == token->len);
}

enum metrics_request metrics_parse_request(const char *buf, size_t len,
                                           const struct gk_token *token)
{
    size_t head = head_length(buf, len < METRICS_REQUEST_MAX ? len : METRICS_REQUEST_MAX);
    if (!head)
        return len >= METRICS_REQUEST_MAX ? METRICS_REQ_BAD : METRICS_REQ_INCOMPLETE;

    size_t pos = 0;
    const char *line;
    size_t n = next_line(buf, head, &pos, &line);
    int metrics = wants_metrics(line, n);
    if (metrics < 0)
        return METRICS_REQ_BAD;
    int authorized = !token || token->len == 0;
    while ((n = next_line(buf, head, &pos, &line)) > 0)
        if (!authorized)
            authorized = carries_token(line, n, token);
    if (!authorized)
        return METRICS_REQ_UNAUTHORIZED;
    return metrics ? METRICS_REQ_METRICS : METRICS_REQ_NOT_FOUND;
}
