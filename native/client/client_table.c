/*
 * client_table.c - see client_table.h; also the public gdrkv_place and
 * gdrkv_client_set_members.
 */
#include "client_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_server.h"
#include "common/common.h"
#include "common/errors.h"
#include "common/log.h"
#include "route.h"

/* The failure domain of a unix: member: this host. */
#define UNIX_HOST "localhost"
#define UNIX_PREFIX "unix:"

/* ------------------------------------------------------------ members */

/* A member's address, parsed: "host[:port]" or "unix:PATH". */
struct member_addr {
    struct gk_addr addr;
    const char *unix_path;      /* into text, or NULL */
    char text[CLIENT_SERVER_NAME_MAX];
    char name[CLIENT_SERVER_NAME_MAX];  /* canonical */
};

static int parse_member(const char *spec, size_t len, struct member_addr *a, char *err,
                        size_t errlen)
{
    while (len && (*spec == ' ' || *spec == '\t'))
        spec++, len--;
    while (len && (spec[len - 1] == ' ' || spec[len - 1] == '\t'))
        len--;
    if (len == 0)
        return gk_error(err, errlen, GDRKV_E_INVALID, "empty entry in the server list");
    if (len >= sizeof a->text)
        return gk_error(err, errlen, GDRKV_E_INVALID,
                           "server address '%.40s...' is too long", spec);
    memcpy(a->text, spec, len);
    a->text[len] = '\0';
    a->unix_path = NULL;
    if (!strncmp(a->text, UNIX_PREFIX, strlen(UNIX_PREFIX))) {
        a->unix_path = a->text + strlen(UNIX_PREFIX);
        if (!*a->unix_path || strlen(a->unix_path) >= GK_UNIX_PATH_MAX)
            return gk_error(err, errlen, GDRKV_E_INVALID,
                               "bad unix socket path in '%s' (1..%d bytes)", a->text,
                               GK_UNIX_PATH_MAX - 1);
    } else if (gk_parse_addr(a->text, CLIENT_DEFAULT_PORT, &a->addr)) {
        return gk_error(err, errlen, GDRKV_E_INVALID,
                           "bad server address '%s' (want host:port or unix:PATH)", a->text);
    }
    client_server_name(&a->addr, a->unix_path, a->name, sizeof a->name);
    return 0;
}

/* Member i's failure domain: its zone, else its host. */
static const char *domain_of(const gdrkv_member *m, const struct member_addr *a)
{
    if (m->zone && *m->zone)
        return m->zone;
    return a->unix_path ? UNIX_HOST : a->addr.host;
}

/* Fills the placement of members m: seeds, weights, domains (members with
 * equal domain texts share the index of the first). addrs[i] is member
 * i's parsed address; the members were checked. */
static void fill_view(struct client_view *v, const gdrkv_member *m,
                      const struct member_addr *addrs, uint32_t n)
{
    v->n = n;
    v->uniform = 1;
    v->nleaving = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct placement_member *p = &v->members[i];
        p->seed = route_server_seed(addrs[i].name);
        p->weight = m[i].capacity;
        p->leaving = m[i].leaving != 0;
        p->domain = i;
        for (uint32_t j = 0; j < i; j++) {
            if (!strcmp(domain_of(&m[j], &addrs[j]), domain_of(&m[i], &addrs[i]))) {
                p->domain = v->members[j].domain;
                break;
            }
        }
        v->uniform &= p->weight == v->members[0].weight;
        v->nleaving += (uint32_t)p->leaving;
    }
}

/* Parses and checks members m into addrs. */
static int check_members(const gdrkv_member *m, uint32_t n, struct member_addr *addrs,
                         char *err, size_t errlen)
{
    if (n > GDRKV_MAX_MEMBERS)
        return gk_error(err, errlen, GDRKV_E_INVALID, "%u members: at most %d", n,
                           GDRKV_MAX_MEMBERS);
    for (uint32_t i = 0; i < n; i++) {
        if (!m[i].addr)
            return gk_error(err, errlen, GDRKV_E_INVALID, "member %u has no address", i);
        int rc = parse_member(m[i].addr, strlen(m[i].addr), &addrs[i], err, errlen);
        if (rc)
            return rc;
        if (m[i].capacity == 0)
            return gk_error(err, errlen, GDRKV_E_INVALID, "member %s has capacity 0",
                               addrs[i].name);
        for (uint32_t j = 0; j < i; j++)
            if (!strcmp(addrs[j].name, addrs[i].name))
                return gk_error(err, errlen, GDRKV_E_INVALID, "server %s is listed twice",
                                   addrs[i].name);
    }
    return 0;
}

int gdrkv_place(const void *key, size_t key_len, const gdrkv_member *members, uint32_t n,
                uint32_t replicas, uint32_t *out)
{
    if ((!key && key_len) || (!members && n) || (!out && replicas))
        return GDRKV_E_INVALID;
    struct member_addr *addrs = calloc(n ? n : 1, sizeof *addrs);
    struct placement_member *pm = calloc(n ? n : 1, sizeof *pm);
    uint64_t *scratch = calloc(2 * (size_t)n + 1, sizeof *scratch);
    int rc = addrs && pm && scratch ? check_members(members, n, addrs, NULL, 0)
                                    : GDRKV_E_INTERNAL;
    if (rc == 0) {
        struct client_view v = {.members = pm};
        fill_view(&v, members, addrs, n);
        uint32_t want = GK_MIN(replicas, PLACEMENT_MAX_REPLICAS);
        rc = (int)placement_rank(route_key_hash(key, key_len), pm, n, v.uniform, want, 1,
                                 scratch, out);
    }
    free(addrs);
    free(pm);
    free(scratch);
    return rc;
}

/* ------------------------------------------------------------ tables */

static void view_free(struct client_view *v)
{
    free(v->members);
    free(v->slot);
}

void client_table_put(struct client_table *t)
{
    if (!t || __atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    for (uint32_t i = 0; i < t->nall; i++)
        client_server_put(t->all[i]);
    free(t->all);
    view_free(&t->cur);
    view_free(&t->prev);
    free(t);
}

struct client_table *client_table_get(struct gdrkv_client *c)
{
    pthread_mutex_lock(&c->table_lock);
    struct client_table *t = c->table;
    __atomic_add_fetch(&t->refs, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->table_lock);
    return t;
}

uint32_t client_table_members(struct gdrkv_client *c)
{
    struct client_table *t = client_table_get(c);
    uint32_t n = t->cur.n;
    client_table_put(t);
    return n;
}

static int view_alloc(struct client_view *v, uint32_t n)
{
    v->members = calloc(n ? n : 1, sizeof *v->members);
    v->slot = calloc(n ? n : 1, sizeof *v->slot);
    return v->members && v->slot ? 0 : GDRKV_E_INTERNAL;
}

/* old's server of that name (from any of its views), or NULL. */
static struct client_server *find_server(const struct client_table *old, const char *name)
{
    for (uint32_t i = 0; old && i < old->nall; i++)
        if (!strcmp(old->all[i]->ep.name, name))
            return old->all[i];
    return NULL;
}

/* The server for member a: old's, kept, or a new one. */
static int take_server(struct gdrkv_client *c, const struct client_table *old,
                       const struct member_addr *a, struct client_server **out, char *err,
                       size_t errlen)
{
    struct client_server *s = find_server(old, a->name);
    if (s) {
        client_server_hold(s);
        *out = s;
        return 0;
    }
    if (!(s = malloc(sizeof *s)))
        return gk_error(err, errlen, GDRKV_E_INTERNAL, "out of memory");
    int rc = client_server_init(s, a->unix_path ? NULL : &a->addr, a->unix_path, &c->opts,
                                c->rdma, c->token.len ? &c->token : NULL);
    if (rc) {
        free(s);
        if (rc == GDRKV_E_INVALID && a->unix_path)
            return gk_error(err, errlen, rc, "server %s is a unix socket: transport %s "
                               "can't reach it (shm and auto can)", a->text,
                               c->opts.transport == GDRKV_TRANSPORT_TCP ? "tcp" : "rdma");
        if (rc == GDRKV_E_INVALID)
            return gk_error(err, errlen, rc, "server %s can't use transport shm: shm needs "
                               "a local server (a loopback address or unix:PATH)", a->text);
        return gk_error(err, errlen, GDRKV_E_INTERNAL, "out of memory");
    }
    s->ep.gpu_pins = &c->gpu_pins;
    *out = s;
    return 0;
}

/* prev: old's current members, their servers appended to t->all where t's
 * own members don't have them. */
static void keep_previous(struct client_table *t, const struct client_table *old)
{
    const struct client_view *o = &old->cur;
    memcpy(t->prev.members, o->members, o->n * sizeof *o->members);
    t->prev.n = o->n;
    t->prev.uniform = o->uniform;
    t->prev.nleaving = o->nleaving;
    for (uint32_t j = 0; j < o->n; j++) {
        struct client_server *s = old->all[o->slot[j]];
        uint32_t k = 0;
        while (k < t->nall && t->all[k] != s)
            k++;
        if (k == t->nall) {
            client_server_hold(s);
            t->all[t->nall++] = s;
        }
        t->prev.slot[j] = k;
    }
}

/* A new table of members m, keeping old's servers where they are listed
 * again, and old's placement as prev. */
static struct client_table *table_build(struct gdrkv_client *c, const struct client_table *old,
                                        const gdrkv_member *m, uint32_t n, int *rc, char *err,
                                        size_t errlen)
{
    uint32_t nold = old ? old->cur.n : 0;
    struct client_table *t = calloc(1, sizeof *t);
    struct member_addr *addrs = calloc(n ? n : 1, sizeof *addrs);
    *rc = GDRKV_E_INTERNAL;
    if (!t || !addrs)
        goto fail;
    t->refs = 1;
    t->born_ns = gk_now_ns();
    t->all = calloc((size_t)n + nold + 1, sizeof *t->all);
    if (!t->all || view_alloc(&t->cur, n) || view_alloc(&t->prev, nold))
        goto fail;
    if ((*rc = check_members(m, n, addrs, err, errlen)))
        goto fail;
    for (uint32_t i = 0; i < n; i++) {
        if ((*rc = take_server(c, old, &addrs[i], &t->all[i], err, errlen)))
            goto fail;
        t->cur.slot[i] = i;
        t->nall++;
    }
    fill_view(&t->cur, m, addrs, n);
    if (nold)
        keep_previous(t, old);
    free(addrs);
    *rc = 0;
    return t;
fail:
    if (*rc == GDRKV_E_INTERNAL)
        gk_error(err, errlen, GDRKV_E_INTERNAL, "out of memory");
    free(addrs);
    if (t) {
        t->refs = 1;
        client_table_put(t);
    }
    return NULL;
}

/* Installs t as c's table; returns the one it replaces (the client's
 * reference to it, for the caller to drop). */
static struct client_table *install(struct gdrkv_client *c, struct client_table *t)
{
    pthread_mutex_lock(&c->table_lock);
    struct client_table *old = c->table;
    c->table = t;
    pthread_mutex_unlock(&c->table_lock);
    return old;
}

int gdrkv_client_set_members(gdrkv_client *c, const gdrkv_member *m, uint32_t n, char *err,
                             size_t errlen)
{
    int rc;
    if (!c)
        return gk_error(err, errlen, GDRKV_E_CLOSED, "client closed");
    if (n && !m)
        return gk_error(err, errlen, GDRKV_E_INVALID, "no members array");
    /* Swaps are serialised, so each builds on the table it replaces. */
    pthread_mutex_lock(&c->swap_lock);
    struct client_table *old = client_table_get(c);
    struct client_table *t = table_build(c, old, m, n, &rc, err, errlen);
    if (t) {
        client_table_put(install(c, t));
        gk_counter_add(&c->counters.membership_changes, 1);
        GK_INFO("client: %u members (was %u)", n, old->cur.n);
    }
    client_table_put(old);
    pthread_mutex_unlock(&c->swap_lock);
    return rc;
}

int client_table_open(struct gdrkv_client *c, const char *servers, char *err, size_t errlen)
{
    uint32_t n = 0;
    gdrkv_member *m = NULL;
    char *copy = NULL;
    int rc = GDRKV_E_INTERNAL;

    if (servers && *servers) {
        n = 1;
        for (const char *p = servers; *p; p++)
            n += *p == ',';
        copy = strdup(servers);
        m = calloc(n, sizeof *m);
        if (!copy || !m)
            goto out;
        /* Equal weights: a static list routes as it always did. */
        char *p = copy;
        for (uint32_t i = 0; i < n; i++)
            m[i] = (gdrkv_member){.addr = strsep(&p, ","), .capacity = 1};
    }
    struct client_table *t = table_build(c, NULL, m, n, &rc, err, errlen);
    if (t)
        c->table = t;
out:
    if (rc == GDRKV_E_INTERNAL && !m)
        gk_error(err, errlen, rc, "out of memory");
    free(m);
    free(copy);
    return rc;
}

void client_table_close(struct gdrkv_client *c)
{
    client_table_put(c->table);
    c->table = NULL;
}
