/*
 * placement.h - where a key's copies live: weighted rendezvous (highest
 * random weight) hashing over a table's members, with replicas spread over
 * failure domains.
 *
 * Member i scores a key w_i / -log2(u_i), u_i = mix64(hash(key) ^ seed_i)
 * / 2^64 uniform in (0, 1): the highest score wins, and member i wins a
 * share w_i / sum(w) of the keys (the exponential-race argument of weighted
 * rendezvous). A join or leave moves only the keys the member wins or held.
 *
 * The same answer in every process and on every build: no floating point
 * and no libm (log() differs in its last bit between libms, and one bit
 * turns a near tie). -log2(u) is computed in fixed point (32 fraction
 * bits) by integer squaring, and scores are compared as 128-bit products
 * w_i * L_j vs w_j * L_i, so the order depends only on integer arithmetic.
 * The fixed-point log is monotone in u, so with equal weights the order is
 * exactly the order of u, then of the seed: the unweighted rendezvous of
 * route_pick before weights existed. A static list of servers routes every
 * key where it always did.
 */
#ifndef GDRKV_PLACEMENT_H
#define GDRKV_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

/* Most copies of a key (option replicas). */
#define PLACEMENT_MAX_REPLICAS 8

struct placement_member {
    uint64_t seed;          /* route_server_seed of its canonical name */
    uint64_t weight;        /* capacity, > 0 */
    uint32_t domain;        /* members of one failure domain share it */
    int leaving;            /* draining: readable, takes no PUTs */
};

/* -log2(h / 2^64) in units of 2^-32; at least 1. Monotone: a larger h never
 * gives a larger value. */
uint64_t placement_neg_log2(uint64_t h);

/* Writes to out up to `want` indices of members, best first: first the
 * best member of each failure domain not yet used while there are such,
 * then the best members left whatever their domain, so replicas land in
 * distinct domains whenever there are enough. skip_leaving leaves out the
 * members that are leaving (PUT candidates). uniform: every weight is the
 * same (only the hashes are compared). scratch holds n scores. Returns how
 * many were written. */
uint32_t placement_rank(uint64_t key_hash, const struct placement_member *m, uint32_t n,
                        int uniform, uint32_t want, int skip_leaving, uint64_t *scratch,
                        uint32_t *out);

#endif
