/*
 * rdma_dev.c - see rdma_dev.h.
 */
#include "rdma_dev.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "gdrkv.h"
#include "common/log.h"

char *rdma_sysfs_path(char *buf, size_t len, const char *fmt, ...)
{
    const char *root = getenv("GDRKV_SYSFS_ROOT");
    if (!root || !*root)
        root = "/";
    int n = snprintf(buf, len, "%s%s", root, root[strlen(root) - 1] == '/' ? "" : "/");
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < len)
        vsnprintf(buf + n, len - (size_t)n, fmt, ap);
    va_end(ap);
    return buf;
}

/* ------------------------------------------------------------ GDRKV_IB_HCA */

struct hca_filter {
    int exclude;            /* "^": every device but these */
    int exact;              /* "=": names match whole, not as prefixes */
    char spec[512];         /* the list, comma separated, each "name[:port]" */
};

static void hca_filter_init(struct hca_filter *f)
{
    const char *env = getenv("GDRKV_IB_HCA");
    memset(f, 0, sizeof *f);
    if (!env)
        return;
    if (*env == '^')
        f->exclude = 1, env++;
    if (*env == '=')
        f->exact = 1, env++;
    snprintf(f->spec, sizeof f->spec, "%s", env);
}

/* Whether the filter's list names this device and port. */
static int hca_listed(const struct hca_filter *f, const char *dev, int port)
{
    char spec[sizeof f->spec];
    char *save = NULL;
    memcpy(spec, f->spec, sizeof spec);
    for (char *item = strtok_r(spec, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(item, ':');
        int want_port = colon ? atoi(colon + 1) : 0;
        if (colon)
            *colon = '\0';
        int name_ok = f->exact ? strcmp(item, dev) == 0 : strncmp(item, dev, strlen(item)) == 0;
        if (name_ok && (want_port == 0 || want_port == port))
            return 1;
    }
    return 0;
}

static int hca_allowed(const struct hca_filter *f, const char *dev, int port)
{
    if (!f->spec[0])
        return 1;
    return hca_listed(f, dev, port) != f->exclude;
}

/* ------------------------------------------------------------ PCIe distance */

/* Hops between two PCI devices through their closest common bridge, from
 * their sysfs paths; INT_MAX when either is unknown. */
static int pci_distance(const char *dev_name, const char *near_pci)
{
    char a_link[PATH_MAX], b_link[PATH_MAX], a[PATH_MAX], b[PATH_MAX];
    rdma_sysfs_path(a_link, sizeof a_link, "sys/class/infiniband/%s/device", dev_name);
    rdma_sysfs_path(b_link, sizeof b_link, "sys/bus/pci/devices/%s", near_pci);
    if (!realpath(a_link, a) || !realpath(b_link, b))
        return INT_MAX;
    size_t common = 0;
    for (size_t i = 0; a[i] && a[i] == b[i]; i++)
        if (a[i] == '/')
            common = i;
    int hops = 0;
    for (const char *p = a + common; *p; p++)
        hops += *p == '/';
    for (const char *p = b + common; *p; p++)
        hops += *p == '/';
    return hops;
}

/* ------------------------------------------------------------ GIDs */

static int gid_is_zero(const union ibv_gid *g)
{
    static const uint8_t zero[16];
    return memcmp(g->raw, zero, 16) == 0;
}

static int gid_is_ipv4_mapped(const union ibv_gid *g)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g->raw, prefix, 12) == 0;
}

/* Whether sysfs says the GID at index is RoCE v2 (1), v1 (0), or doesn't
 * say (-1: softverbs, old kernels). */
static int gid_is_roce_v2(const char *dev, int port, int index)
{
    char path[PATH_MAX], type[32] = "";
    rdma_sysfs_path(path, sizeof path, "sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d",
                    dev, port, index);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int ok = fgets(type, sizeof type, f) != NULL;
    fclose(f);
    if (!ok)
        return -1;
    return strncmp(type, "RoCE v2", 7) == 0;
}

/* RoCE v2 with an IPv4-mapped address routes everywhere IPv4 does, so it
 * wins; then any RoCE v2; then any IPv4-mapped; then the first GID. */
static int pick_gid(struct rdma_dev *d, int tbl_len)
{
    const char *env = getenv("GDRKV_IB_GID_INDEX");
    if (env && *env) {
        d->gid_index = atoi(env);
        return d->ibv->query_gid(d->ctx, d->port, d->gid_index, &d->gid) ? -1 : 0;
    }
    int best = -1, best_score = -1;
    for (int i = 0; i < tbl_len; i++) {
        union ibv_gid g;
        if (d->ibv->query_gid(d->ctx, d->port, i, &g) || gid_is_zero(&g))
            continue;
        int v2 = gid_is_roce_v2(d->name, d->port, i);
        int score = (v2 > 0 ? 2 : 0) + gid_is_ipv4_mapped(&g);
        if (score > best_score)
            best = i, best_score = score, d->gid = g;
    }
    d->gid_index = best;
    return best < 0 ? -1 : 0;
}

/* ------------------------------------------------------------ choosing */

struct candidate {
    struct ibv_device *dev;
    int port;
    int distance;
};

/* The best allowed active port of one device, or 0. */
static int best_port(const struct gk_ibv *ibv, struct ibv_context *ctx, const char *name,
                     const struct hca_filter *f)
{
    struct ibv_device_attr attr;
    if (ibv->query_device(ctx, &attr))
        return 0;
    for (int p = 1; p <= attr.phys_port_cnt; p++) {
        struct ibv_port_attr pa;
        memset(&pa, 0, sizeof pa);
        if (!hca_allowed(f, name, p) || ibv->query_port(ctx, (uint8_t)p, &pa))
            continue;
        if (pa.state == IBV_PORT_ACTIVE &&
            (pa.link_layer == IBV_LINK_LAYER_INFINIBAND ||
             pa.link_layer == IBV_LINK_LAYER_ETHERNET ||
             pa.link_layer == IBV_LINK_LAYER_UNSPECIFIED))
            return p;
    }
    return 0;
}

static int choose(const struct gk_ibv *ibv, struct ibv_device **list, int n,
                  const char *near_pci, struct candidate *out)
{
    struct hca_filter f;
    hca_filter_init(&f);
    out->dev = NULL;
    out->distance = INT_MAX;
    for (int i = 0; i < n; i++) {
        const char *name = ibv->get_device_name(list[i]);
        struct ibv_context *ctx = ibv->open_device(list[i]);
        if (!ctx)
            continue;
        int port = best_port(ibv, ctx, name, &f);
        ibv->close_device(ctx);
        if (!port)
            continue;
        int distance = near_pci ? pci_distance(name, near_pci) : INT_MAX;
        if (!out->dev || distance < out->distance) {
            out->dev = list[i];
            out->port = port;
            out->distance = distance;
        }
    }
    return out->dev ? 0 : -1;
}

static int fail(char *why, size_t len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *why, size_t len, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return code;
}

int rdma_dev_open(struct rdma_dev *d, const char *near_pci, char *why, size_t whylen)
{
    const char *load_why = "";
    memset(d, 0, sizeof *d);
    d->ibv = gk_ibv_load(&load_why);
    if (!d->ibv)
        return fail(why, whylen, GDRKV_E_UNAVAILABLE, "%s", load_why);

    int n = 0;
    struct ibv_device **list = d->ibv->get_device_list(&n);
    if (!list || n == 0) {
        if (list)
            d->ibv->free_device_list(list);
        return fail(why, whylen, GDRKV_E_UNAVAILABLE, "no RDMA devices (%s)", gk_ibv_library());
    }
    struct candidate c;
    if (choose(d->ibv, list, n, near_pci, &c)) {
        d->ibv->free_device_list(list);
        return fail(why, whylen, GDRKV_E_UNAVAILABLE, "no active RDMA port%s",
                    getenv("GDRKV_IB_HCA") ? " allowed by GDRKV_IB_HCA" : "");
    }
    snprintf(d->name, sizeof d->name, "%s", d->ibv->get_device_name(c.dev));
    d->port = (uint8_t)c.port;
    d->ctx = d->ibv->open_device(c.dev);
    d->ibv->free_device_list(list);
    if (!d->ctx)
        return fail(why, whylen, GDRKV_E_UNAVAILABLE, "cannot open %s: %s", d->name,
                    strerror(errno));

    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof pa);
    if (d->ibv->query_device(d->ctx, &d->attr) || d->ibv->query_port(d->ctx, d->port, &pa)) {
        rdma_dev_close(d);
        return fail(why, whylen, GDRKV_E_UNAVAILABLE, "cannot query %s", d->name);
    }
    d->eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
    d->lid = pa.lid;
    d->mtu = (uint8_t)pa.active_mtu;
    if (d->eth && pick_gid(d, pa.gid_tbl_len)) {
        rdma_dev_close(d);
        return fail(why, whylen, GDRKV_E_UNAVAILABLE, "%s port %u: no usable RoCE GID",
                    d->name, d->port);
    }
    if (!d->eth)
        d->gid_index = -1;
    d->pd = d->ibv->alloc_pd(d->ctx);
    if (!d->pd) {
        rdma_dev_close(d);
        return fail(why, whylen, GDRKV_E_UNAVAILABLE, "cannot allocate a PD on %s", d->name);
    }
    GK_INFO("rdma: %s port %u (%s, mtu %d%s)", d->name, d->port, d->eth ? "RoCE" : "IB",
            128 << d->mtu, near_pci && c.distance != INT_MAX ? ", closest to the GPU" : "");
    return 0;
}

void rdma_dev_close(struct rdma_dev *d)
{
    if (d->pd)
        d->ibv->dealloc_pd(d->pd);
    if (d->ctx)
        d->ibv->close_device(d->ctx);
    d->pd = NULL;
    d->ctx = NULL;
}

uint64_t rdma_dev_max_mr(const struct rdma_dev *d, uint64_t align)
{
    uint64_t max = d->attr.max_mr_size ? d->attr.max_mr_size : UINT64_MAX;
    return max < align ? 0 : max - max % align;
}

/* ------------------------------------------------------------ report */

static const char *port_state_name(enum ibv_port_state s)
{
    switch (s) {
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default: return "NOP";
    }
}

static void report_device(const struct gk_ibv *ibv, struct ibv_device *dev, struct gk_text *t)
{
    const char *name = ibv->get_device_name(dev);
    struct ibv_context *ctx = ibv->open_device(dev);
    struct ibv_device_attr a;
    gk_text_printf(t, "device %s\n", name);
    if (!ctx || ibv->query_device(ctx, &a)) {
        gk_text_printf(t, "device.%s.error cannot open or query\n", name);
        if (ctx)
            ibv->close_device(ctx);
        return;
    }
    gk_text_printf(t, "device.%s.max_mr_size %llu\ndevice.%s.max_qp_wr %d\n"
                   "device.%s.max_sge %d\ndevice.%s.max_qp_rd_atom %d\n",
                   name, (unsigned long long)a.max_mr_size, name, a.max_qp_wr, name, a.max_sge,
                   name, a.max_qp_rd_atom);
    for (int p = 1; p <= a.phys_port_cnt; p++) {
        struct ibv_port_attr pa;
        memset(&pa, 0, sizeof pa);
        if (ibv->query_port(ctx, (uint8_t)p, &pa))
            continue;
        int eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
        gk_text_printf(t, "device.%s.port.%d.state %s\ndevice.%s.port.%d.link_layer %s\n"
                       "device.%s.port.%d.active_mtu %d\ndevice.%s.port.%d.lid %u\n",
                       name, p, port_state_name(pa.state), name, p, eth ? "Ethernet" : "IB",
                       name, p, 128 << pa.active_mtu, name, p, pa.lid);
        if (eth) {
            struct rdma_dev d = {.ibv = ibv, .ctx = ctx, .port = (uint8_t)p};
            snprintf(d.name, sizeof d.name, "%s", name);
            gk_text_printf(t, "device.%s.port.%d.gid_index %d\n", name, p,
                           pick_gid(&d, pa.gid_tbl_len) ? -1 : d.gid_index);
        }
    }
    ibv->close_device(ctx);
}

/* Appends the report gdrkv_rdma_report describes (gdrkv.h) to t. */
static void rdma_dev_report(struct gk_text *t)
{
    const char *why = "";
    gk_text_printf(t, "rdma_built 1\nrdma_library %s\n", gk_ibv_library());
    const struct gk_ibv *ibv = gk_ibv_load(&why);
    if (!ibv) {
        gk_text_printf(t, "rdma_available 0\nrdma_why %s\n", why);
        return;
    }
    int n = 0;
    struct ibv_device **list = ibv->get_device_list(&n);
    gk_text_printf(t, "rdma_available %d\n", n > 0);
    if (n <= 0)
        gk_text_printf(t, "rdma_why no RDMA devices\n");
    for (int i = 0; i < n; i++)
        report_device(ibv, list[i], t);
    if (list)
        ibv->free_device_list(list);
}

int gdrkv_rdma_report(char *buf, size_t len)
{
    struct gk_text t;
    if (!buf || len == 0)
        return GDRKV_E_INVALID;
    gk_text_init(&t, buf, len);
    rdma_dev_report(&t);
    return gk_text_finish(&t);
}
