/*
 * device.c - the one device "softverbs0": its list, its context, and what
 * ibv_query_device / ibv_query_port / ibv_query_gid report. Limits come
 * from SOFTVERBS_* environment variables read once per process.
 */
#include "sv.h"

#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <unistd.h>

#define SV_GUID 0x02005356ab000001ull   /* locally administered, "SV" */

static struct sv_config config;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

static long env_long(const char *name, long def, long lo, long hi)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return def;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (errno || *end || v < lo)
        return def;
    return v > hi ? hi : v;
}

/* A port MTU in bytes (256..4096, a power of two) as enum ibv_mtu; any
 * other value leaves the default, 4096. */
static int mtu_enum(long bytes)
{
    for (int m = IBV_MTU_256; m <= IBV_MTU_4096; m++)
        if (bytes == 128L << m)
            return m;
    return IBV_MTU_4096;
}

static void config_load(void)
{
    const char *ll = getenv("SOFTVERBS_LINK_LAYER");
    config.link_ethernet = ll && (!strcasecmp(ll, "ethernet") || !strcasecmp(ll, "roce"));
    config.max_qp_wr = (int)env_long("SOFTVERBS_MAX_QP_WR", 4096, 1, 1 << 20);
    config.max_sge = (int)env_long("SOFTVERBS_MAX_SGE", 16, 1, SV_SGE_LIMIT);
    config.max_qp_rd_atom = (int)env_long("SOFTVERBS_MAX_QP_RD_ATOM", 16, 1, 255);
    config.max_cqe = (int)env_long("SOFTVERBS_MAX_CQE", 65536, 1, 1 << 22);
    config.exec_delay_us = env_long("SOFTVERBS_EXEC_DELAY_US", 0, 0, 1000000);
    config.active_mtu = mtu_enum(env_long("SOFTVERBS_MTU", 4096, 256, 4096));
    const char *mr = getenv("SOFTVERBS_MAX_MR_SIZE");
    char *end;
    unsigned long long v = mr && *mr ? strtoull(mr, &end, 0) : 0;
    config.max_mr_size = v && !*end ? v : 1ull << 40;
}

const struct sv_config *sv_config(void)
{
    pthread_once(&config_once, config_load);
    return &config;
}

/* Each process is its own "port" on IB: a unicast LID in 1..0xbfff. */
uint16_t sv_lid_of(pid_t pid)
{
    return (uint16_t)(1 + (uint32_t)pid % 0xbffe);
}

int sv_gid_count(void)
{
    return sv_config()->link_ethernet ? 2 : 1;
}

void sv_gid(int index, union ibv_gid *gid)
{
    memset(gid, 0, sizeof *gid);
    if (index == 1) {                   /* ::ffff:127.0.0.1, the RoCE v2 IPv4 GID */
        gid->raw[10] = gid->raw[11] = 0xff;
        gid->raw[12] = 127;
        gid->raw[15] = 1;
        return;
    }
    gid->raw[0] = 0xfe;                 /* fe80::/64 + the node GUID */
    gid->raw[1] = 0x80;
    uint64_t guid = SV_GUID;
    for (int i = 0; i < 8; i++)
        gid->raw[8 + i] = (uint8_t)(guid >> (56 - 8 * i));
}

/* ---------------------------------------------------------------- device */

static struct ibv_device device = {
    .node_type = IBV_NODE_CA,
    .transport_type = IBV_TRANSPORT_IB,
    .name = "softverbs0",
    .dev_name = "uverbs_softverbs0",
    .dev_path = "/sys/class/infiniband_verbs/uverbs_softverbs0",
    .ibdev_path = "/sys/class/infiniband/softverbs0",
};

struct ibv_device **ibv_get_device_list(int *num_devices)
{
    struct ibv_device **list = calloc(2, sizeof *list);
    if (!list) {
        errno = ENOMEM;
        return NULL;
    }
    list[0] = &device;
    if (num_devices)
        *num_devices = 1;
    return list;
}

void ibv_free_device_list(struct ibv_device **list)
{
    free(list);
}

const char *ibv_get_device_name(struct ibv_device *dev)
{
    return dev == &device ? device.name : NULL;
}

uint64_t ibv_get_device_guid(struct ibv_device *dev)
{
    return dev == &device ? htobe64(SV_GUID) : 0;
}

struct ibv_context *ibv_open_device(struct ibv_device *dev)
{
    if (dev != &device) {
        errno = ENODEV;
        return NULL;
    }
    int rc = sv_registry_open();
    if (rc) {
        errno = rc;
        return NULL;
    }
    /* Under Yama ptrace_scope 1 only ancestors could read our memory:
     * initiators in other processes must be allowed to. */
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);

    struct sv_context *c = calloc(1, sizeof *c);
    if (!c) {
        errno = ENOMEM;
        return NULL;
    }
    c->ibv.device = dev;
    c->ibv.ops.post_send = sv_post_send;
    c->ibv.ops.post_recv = sv_post_recv;
    c->ibv.ops.poll_cq = sv_poll_cq;
    c->ibv.ops.req_notify_cq = sv_req_notify_cq;
    c->ibv.cmd_fd = -1;
    c->ibv.async_fd = -1;
    c->ibv.num_comp_vectors = 1;
    /* abi_compat stays NULL: verbs_get_ctx() then says "not an extended
     * context" and the inline helpers use ops and the exported symbols. */
    c->ibv.abi_compat = NULL;
    pthread_mutex_init(&c->ibv.mutex, NULL);
    return &c->ibv;
}

int ibv_close_device(struct ibv_context *ctx)
{
    if (!ctx)
        return EINVAL;
    pthread_mutex_destroy(&ctx->mutex);
    free((struct sv_context *)ctx);
    return 0;
}

int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a)
{
    if (!ctx || !a)
        return EINVAL;
    const struct sv_config *cf = sv_config();
    memset(a, 0, sizeof *a);
    strcpy(a->fw_ver, "softverbs-1");
    a->node_guid = htobe64(SV_GUID);
    a->sys_image_guid = htobe64(SV_GUID);
    a->max_mr_size = cf->max_mr_size;
    a->page_size_cap = ~4095ull;
    a->vendor_id = 0x5356;
    a->vendor_part_id = 1;
    a->hw_ver = 1;
    a->max_qp = SV_MAX_QP;
    a->max_qp_wr = cf->max_qp_wr;
    a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN;
    a->max_sge = cf->max_sge;
    a->max_sge_rd = cf->max_sge;
    a->max_cq = 1 << 16;
    a->max_cqe = cf->max_cqe;
    a->max_mr = SV_MAX_MR - 1;
    a->max_pd = 1 << 16;
    a->max_qp_rd_atom = cf->max_qp_rd_atom;
    a->max_res_rd_atom = cf->max_qp_rd_atom * SV_MAX_QP;
    a->max_qp_init_rd_atom = cf->max_qp_rd_atom;
    a->atomic_cap = IBV_ATOMIC_NONE;
    a->max_pkeys = 1;
    a->local_ca_ack_delay = 16;
    a->phys_port_cnt = 1;
    return 0;
}

/* The exported form, which rdma-core's inline ibv_query_port calls with a
 * cleared struct ibv_port_attr (its prototype names the older, shorter
 * layout; the caller's struct is the full one either way). */
int ibv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a)
{
    if (!ctx || !a)
        return EINVAL;
    if (port != SV_PORT)
        return EINVAL;
    int eth = sv_config()->link_ethernet;
    memset(a, 0, sizeof *a);
    a->state = IBV_PORT_ACTIVE;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = (enum ibv_mtu)sv_config()->active_mtu;
    a->gid_tbl_len = sv_gid_count();
    a->port_cap_flags = eth ? IBV_PORT_IP_BASED_GIDS : 0;
    a->max_msg_sz = SV_MAX_MSG;
    a->pkey_tbl_len = 1;
    a->lid = eth ? 0 : sv_lid_of(sv_self());
    a->sm_lid = eth ? 0 : 1;
    a->max_vl_num = 1;
    a->active_width = 2;                /* 4x */
    a->active_speed = 32;               /* 25 Gb/s lanes (EDR) */
    a->phys_state = 5;                  /* LinkUp */
    a->link_layer = eth ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
    return 0;
}

int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
    if (!ctx || !gid || port != SV_PORT || index < 0 || index >= sv_gid_count()) {
        errno = EINVAL;
        return -1;
    }
    sv_gid(index, gid);
    return 0;
}

const char *ibv_wc_status_str(enum ibv_wc_status status)
{
    static const char *const names[] = {
        [IBV_WC_SUCCESS] = "success",
        [IBV_WC_LOC_LEN_ERR] = "local length error",
        [IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
        [IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
        [IBV_WC_LOC_PROT_ERR] = "local protection error",
        [IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
        [IBV_WC_MW_BIND_ERR] = "memory management operation error",
        [IBV_WC_BAD_RESP_ERR] = "bad response error",
        [IBV_WC_LOC_ACCESS_ERR] = "local access error",
        [IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
        [IBV_WC_REM_ACCESS_ERR] = "remote access error",
        [IBV_WC_REM_OP_ERR] = "remote operation error",
        [IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
        [IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
        [IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
        [IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
        [IBV_WC_REM_ABORT_ERR] = "aborted error",
        [IBV_WC_INV_EECN_ERR] = "invalid EE context number",
        [IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
        [IBV_WC_FATAL_ERR] = "fatal error",
        [IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
        [IBV_WC_GENERAL_ERR] = "general error",
        [IBV_WC_TM_ERR] = "TM error",
        [IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
    };
    if ((unsigned)status < sizeof names / sizeof names[0] && names[status])
        return names[status];
    return "unknown";
}
