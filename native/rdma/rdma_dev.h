/*
 * rdma_dev.h - choosing and opening the RDMA device, port and GID that a
 * client or server uses (docs/transports.md):
 *
 *   GDRKV_IB_HCA        which devices/ports may be used, NCCL_IB_HCA style:
 *                       "mlx5_0:1,mlx5_1" (prefix match), "=mlx5_0" (exact),
 *                       "^mlx5_2" (everything but)
 *   GDRKV_IB_GID_INDEX  the GID to use on RoCE instead of the automatic choice
 *   GDRKV_SYSFS_ROOT    prefix of /sys paths (tests point it at a fake tree)
 *
 * Without GDRKV_IB_HCA the port closest to the given GPU on the PCIe tree
 * wins, else the first active port. On RoCE the GID is the RoCE v2 one
 * with an IPv4-mapped address where there is one; InfiniBand uses LIDs.
 */
#ifndef GDRKV_RDMA_DEV_H
#define GDRKV_RDMA_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "ibv.h"
#include "common/stats.h"

struct rdma_dev {
    const struct gk_ibv *ibv;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    char name[64];
    uint8_t port;
    int eth;                        /* RoCE: addresses are GIDs */
    int gid_index;
    union ibv_gid gid;
    uint16_t lid;
    uint8_t mtu;                    /* enum ibv_mtu, the port's active MTU */
    struct ibv_device_attr attr;
};

/* Opens the chosen device and port and allocates a PD. near_pci is the
 * PCI address ("0000:17:00.0") of the GPU the memory lives on, or NULL.
 * Returns 0, or a negative gdrkv_error with the reason in why. */
int rdma_dev_open(struct rdma_dev *d, const char *near_pci, char *why, size_t whylen);
void rdma_dev_close(struct rdma_dev *d);

/* The largest MR the device registers, rounded down to `align`. */
uint64_t rdma_dev_max_mr(const struct rdma_dev *d, uint64_t align);


/* A /sys path under $GDRKV_SYSFS_ROOT (tests point it at a fake tree);
 * returns buf. */
char *rdma_sysfs_path(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Visits every RDMA port's traffic and hardware counters in sysfs
 * (ports/N/counters and ports/N/hw_counters), as gdrkv stat --nic shows
 * them: fn(arg, device, port, group ("counters" or "hw_counters"), name,
 * value). The data counters, port_xmit_data and port_rcv_data, count
 * 4-byte words, as the InfiniBand spec has them. */
typedef void rdma_counter_fn(void *arg, const char *device, int port, const char *group,
                             const char *name, uint64_t value);
void rdma_port_counters(rdma_counter_fn *fn, void *arg);

#endif
