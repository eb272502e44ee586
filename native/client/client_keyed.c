/*
 * client_keyed.c - a keyed call over the server table: where each key's
 * copies go and in what order its reads try them (docs/cluster.md).
 *
 * Every key gets its candidates from the placement (placement.c) of the
 * table the call took at its start:
 *   PUT     the top `replicas` members not leaving, all in one pass; stored
 *           when at least one copy was written;
 *   DELETE  every candidate a read would try, in one pass;
 *   GET and EXISTS, in passes: the first candidate, then on UNAVAILABLE,
 *           TIMEOUT or DENIED the next one (fail-over), within the call's
 *           deadline. A miss at a member not leaving is final, except while
 *           the table is younger than settle_ms and the key's owners under
 *           the previous table were others: then the key is asked of its
 *           other candidates in turn, those owners last (read-through; the
 *           object is not copied to its new owner, whose own PUTs fill it).
 * A read's order: the top `replicas` members leaving or not (a member
 * draining still holds what it was given), then those not leaving, then
 * (while young) the previous table's. A miss at a leaving member goes on.
 */
#include <stdlib.h>
#include <string.h>

#include "client_call.h"
#include "client_table.h"
#include "common/common.h"
#include "placement.h"
#include "route.h"

#define MAX_CANDIDATES (3 * PLACEMENT_MAX_REPLICAS)

/* What a miss at a candidate means. The previous table's owners come
 * last, so a key has some of them when its last candidate is one. */
enum candidate_kind {
    CAND_LEAVING,   /* a member draining: go on to the next */
    CAND_OWNER,     /* final, unless the key has previous owners left */
    CAND_PREVIOUS,  /* an owner under the previous table: go on */
};

/* Every key's candidates, best first: key i's are slot[i * max ..] (in
 * table->all) with their kinds, count[i] of them. */
struct candidates {
    uint32_t max;
    uint32_t *slot;
    uint8_t *kind;
    uint8_t *count;
};

/* Appends view v's top `want` members for key hash h (leaving ones too
 * unless skip_leaving) to key i's candidates, each server once. */
static void add_ranked(struct candidates *cd, uint32_t i, const struct client_view *v,
                       uint64_t h, uint32_t want, int skip_leaving, int previous,
                       uint64_t *scratch)
{
    uint32_t ranked[PLACEMENT_MAX_REPLICAS];
    uint32_t got = placement_rank(h, v->members, v->n, v->uniform, want, skip_leaving, scratch,
                                  ranked);
    uint32_t *slots = cd->slot + (size_t)i * cd->max;
    uint8_t *kinds = cd->kind + (size_t)i * cd->max;
    for (uint32_t j = 0; j < got; j++) {
        uint32_t slot = v->slot[ranked[j]], k = 0, n = cd->count[i];
        while (k < n && slots[k] != slot)
            k++;
        if (k < n)
            continue;
        slots[n] = slot;
        kinds[n] = previous                        ? CAND_PREVIOUS
                   : v->members[ranked[j]].leaving ? CAND_LEAVING
                                                   : CAND_OWNER;
        cd->count[i]++;
    }
}

/* Key i's (of hash h) candidates for op. */
static void find_candidates(struct candidates *cd, uint32_t i, const struct client_table *t,
                            uint64_t h, uint32_t replicas, int young, uint8_t op,
                            uint64_t *scratch)
{
    cd->count[i] = 0;
    if (op == GK_OP_PUT) {
        add_ranked(cd, i, &t->cur, h, replicas, 1, 0, scratch);
        return;
    }
    if (t->cur.nleaving)
        add_ranked(cd, i, &t->cur, h, replicas, 0, 0, scratch);
    add_ranked(cd, i, &t->cur, h, replicas, 1, 0, scratch);
    if (young)
        add_ranked(cd, i, &t->prev, h, replicas, 0, 1, scratch);
}

/* How many candidates a key may have at most for op. */
static uint32_t max_candidates(const struct client_table *t, uint32_t replicas, int young,
                               uint8_t op)
{
    if (op == GK_OP_PUT)
        return replicas;
    return (t->cur.nleaving ? 2 : 1) * replicas + (young ? replicas : 0);
}

/* ------------------------------------------------------------ writes */

/* Rank of a copy's result when merging: a copy written beats a miss, which
 * beats an error. */
static int merit(int64_t r)
{
    return r >= 0 ? 2 : r == GDRKV_E_NOT_FOUND ? 1 : 0;
}

/* PUT and DELETE: every candidate at once; a key's result is its best
 * copy's (PUT: with want_copies, how many were written). */
static int write_all(struct gdrkv_client *c, struct client_table *t, uint8_t op,
                     const struct client_keys *k, const struct candidates *cd,
                     uint64_t deadline)
{
    uint32_t n = k->n, copies = cd->max;
    size_t entries = (size_t)n * copies;
    uint32_t *targets = malloc(entries * sizeof *targets);
    int64_t *results = malloc(entries * sizeof *results);
    int rc = GDRKV_E_INTERNAL;

    if (targets && results) {
        for (size_t e = 0; e < entries; e++)
            results[e] = GDRKV_E_INTERNAL;
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t r = 0; r < copies; r++)
                targets[(size_t)r * n + i] =
                    r < cd->count[i] ? cd->slot[(size_t)i * copies + r] : CLIENT_NO_SERVER;
        struct client_round round = {.table = t, .copies = copies, .targets = targets,
                                     .results = results, .deadline_ns = deadline};
        rc = client_round_run(c, op, k, &round);
    }
    uint64_t short_keys = 0;
    for (uint32_t i = 0; i < n; i++) {
        int64_t best = cd->count[i] ? GDRKV_E_INTERNAL : GDRKV_E_UNAVAILABLE;
        uint32_t written = 0;
        for (uint32_t r = 0; targets && results && r < cd->count[i]; r++) {
            int64_t res = results[(size_t)r * n + i];
            written += res >= 0;
            if (r == 0 || merit(res) > merit(best))
                best = res;
        }
        if (rc && !written)
            best = rc;
        if (op == GK_OP_PUT && written) {
            best = k->want_copies ? written : 0;
            short_keys += written < cd->count[i];
        }
        k->results[i] = best;
    }
    gk_counter_add(&c->counters.put_copies_short, short_keys);
    free(targets);
    free(results);
    return rc;
}

/* ------------------------------------------------------------ reads */

static int fails_over(int64_t r)
{
    return r == GDRKV_E_UNAVAILABLE || r == GDRKV_E_TIMEOUT || r == GDRKV_E_DENIED;
}

/* After a pass: the key's next candidate (pos advanced), or 0 when its
 * result stands. */
static int next_candidate(struct gdrkv_client *c, const struct candidates *cd, uint32_t i,
                          uint8_t *pos, int64_t result)
{
    uint32_t p = *pos, n = cd->count[i];
    const uint8_t *kind = cd->kind + (size_t)i * cd->max;
    if (fails_over(result) && p + 1 < n) {
        *pos = (uint8_t)(p + 1);
        gk_counter_add(&c->counters.failovers, 1);
        return 1;
    }
    if (result != GDRKV_E_NOT_FOUND || p + 1 >= n)
        return 0;
    if (kind[p] == CAND_OWNER) {
        /* Final, unless the key had other owners under the previous table
         * (young tables only list them): then every copy is asked in turn,
         * the new table's replicas first. */
        if (kind[n - 1] != CAND_PREVIOUS)
            return 0;
        gk_counter_add(&c->counters.read_throughs, 1);
    }
    *pos = (uint8_t)(p + 1);
    return 1;
}

/* GET and EXISTS: passes until every key has its answer or the deadline
 * passed. A pass whose keys have candidates left gets half the time left,
 * so a server that swallows requests leaves the other half to the next
 * candidate. */
static int read_in_passes(struct gdrkv_client *c, struct client_table *t, uint8_t op,
                          const struct client_keys *k, const struct candidates *cd,
                          uint64_t deadline)
{
    uint32_t n = k->n;
    uint32_t *targets = malloc(n * sizeof *targets);
    uint8_t *pos = calloc(n, 1);
    uint8_t *missed = calloc(n, 1);     /* a candidate said NOT_FOUND */
    int rc = 0;

    if (!targets || !pos || !missed) {
        rc = GDRKV_E_INTERNAL;
        goto out;
    }
    for (uint32_t i = 0; i < n; i++) {
        targets[i] = cd->count[i] ? cd->slot[(size_t)i * cd->max] : CLIENT_NO_SERVER;
        if (!cd->count[i])
            k->results[i] = GDRKV_E_UNAVAILABLE;
    }
    for (;;) {
        int more = 0, any = 0;
        for (uint32_t i = 0; i < n; i++) {
            any |= targets[i] != CLIENT_NO_SERVER;
            more |= targets[i] != CLIENT_NO_SERVER && pos[i] + 1u < cd->count[i];
        }
        uint64_t now = gk_now_ns();
        if (!any || now >= deadline)
            break;
        struct client_round round = {.table = t, .copies = 1, .targets = targets,
                                     .results = k->results,
                                     .deadline_ns = more ? now + (deadline - now) / 2 : deadline};
        rc = client_round_run(c, op, k, &round);
        if (rc)
            break;
        for (uint32_t i = 0; i < n; i++) {
            if (targets[i] == CLIENT_NO_SERVER)
                continue;
            missed[i] |= k->results[i] == GDRKV_E_NOT_FOUND;
            targets[i] = next_candidate(c, cd, i, &pos[i], k->results[i])
                             ? cd->slot[(size_t)i * cd->max + pos[i]]
                             : CLIENT_NO_SERVER;
        }
    }
    /* A key that missed somewhere and then met only failures (a previous
     * owner gone, the deadline) is a miss, not an error: it was not where
     * it lives now. */
    for (uint32_t i = 0; i < n; i++)
        if (missed[i] && fails_over(k->results[i]))
            k->results[i] = GDRKV_E_NOT_FOUND;
out:
    free(targets);
    free(pos);
    free(missed);
    return rc;
}

/* ------------------------------------------------------------ calls */

static int all_unavailable(const struct client_keys *k)
{
    for (uint32_t i = 0; i < k->n; i++)
        k->results[i] = GDRKV_E_UNAVAILABLE;
    return 0;
}

static int keyed(struct gdrkv_client *c, struct client_table *t, uint8_t op,
                 const struct client_keys *k, uint64_t start)
{
    uint64_t deadline = start + (uint64_t)c->opts.timeout_ms * 1000000u;
    uint32_t replicas = c->opts.replicas;
    int young = t->prev.n && start - t->born_ns < (uint64_t)c->opts.settle_ms * 1000000u;

    if (t->cur.n == 0)
        return all_unavailable(k);
    if (t->nall == 1 && !young && !t->cur.nleaving) {
        /* One server: every key goes there (client_call.c's fast path). */
        struct client_round round = {.table = t, .copies = 1, .results = k->results,
                                     .deadline_ns = deadline};
        int rc = client_round_run(c, op, k, &round);
        for (uint32_t i = 0; op == GK_OP_PUT && k->want_copies && i < k->n; i++)
            k->results[i] += k->results[i] == 0;
        return rc;
    }
    uint32_t max = max_candidates(t, replicas, young, op);
    struct candidates cd = {.max = max,
                            .slot = malloc((size_t)k->n * max * sizeof *cd.slot),
                            .kind = malloc((size_t)k->n * max),
                            .count = malloc(k->n)};
    uint64_t *scratch = malloc(2 * (size_t)t->nall * sizeof *scratch);
    int rc = GDRKV_E_INTERNAL;
    if (cd.slot && cd.kind && cd.count && scratch) {
        uint64_t key_off = 0;
        for (uint32_t i = 0; i < k->n; i++) {
            find_candidates(&cd, i, t, route_key_hash(k->keys + key_off, k->key_lens[i]),
                            replicas, young, op, scratch);
            key_off += k->key_lens[i];
        }
        if (op == GK_OP_PUT || op == GK_OP_DELETE)
            rc = write_all(c, t, op, k, &cd, deadline);
        else
            rc = read_in_passes(c, t, op, k, &cd, deadline);
    } else {
        for (uint32_t i = 0; i < k->n; i++)
            k->results[i] = rc;
    }
    free(cd.slot);
    free(cd.kind);
    free(cd.count);
    free(scratch);
    return rc;
}

/* A GET's or EXISTS' keys found and not found (docs/operations.md, "What
 * the read counters count"): a key that got another error (its servers
 * down, a destination too small) is neither. Counted once per key, after
 * its fail-over and read-through. */
static void count_lookups(struct gdrkv_client *c, uint8_t op, const struct client_keys *k)
{
    uint64_t found = 0, missing = 0;

    if (op != GK_OP_GET && op != GK_OP_EXISTS)
        return;
    for (uint32_t i = 0; i < k->n; i++) {
        found += k->results[i] >= 0;
        missing += k->results[i] == GDRKV_E_NOT_FOUND;
    }
    struct client_counters *n = &c->counters;
    gk_counter_add(op == GK_OP_GET ? &n->hits : &n->exists_hits, found);
    gk_counter_add(op == GK_OP_GET ? &n->misses : &n->exists_misses, missing);
}

int client_keyed_call(struct gdrkv_client *c, uint8_t op, const struct client_keys *k)
{
    int has_values = op == GK_OP_GET || op == GK_OP_PUT;

    if (!c)
        return GDRKV_E_CLOSED;
    if (k->n && (!k->keys || !k->key_lens || !k->results ||
                 (has_values && (!k->seg_ptrs || !k->seg_lens || !k->seg_counts))))
        return GDRKV_E_INVALID;
    uint64_t start = gk_now_ns();
    int rc = 0;
    if (k->n) {
        struct client_table *t = client_table_get(c);
        rc = keyed(c, t, op, k, start);
        client_table_put(t);
    }
    if (rc == 0)
        count_lookups(c, op, k);
    client_record_call(c, op, k->n, start);
    return rc;
}
