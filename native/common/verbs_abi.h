/*
 * verbs_abi.h - the libibverbs ABI that gdrkv's rdma transport and softverbs
 * use, declared here (as NCCL declares it) so the library builds on hosts
 * without rdma-core's headers and loads libibverbs at run time
 * (native/rdma/ibv.c). Only what the code uses is here, laid out exactly as
 * rdma-core's <infiniband/verbs.h>, from which these declarations are
 * taken (its licence follows); tests/native/verbs_abi_layout.c checks every
 * size and offset against that header wherever it is installed.
 *
 * Copyright (c) 2004, 2005 Topspin Communications.  All rights reserved.
 * Copyright (c) 2004, 2011-2012 Intel Corporation.  All rights reserved.
 * Copyright (c) 2005, 2006, 2007 Cisco Systems, Inc.  All rights reserved.
 * Copyright (c) 2005 PathScale, Inc.  All rights reserved.
 * Copyright (c) 2020 Intel Corporation.  All rights reserved.
 *
 * This software is available to you under a choice of one of two
 * licenses.  You may choose to be licensed under the terms of the GNU
 * General Public License (GPL) Version 2, available from the file
 * COPYING in the main directory of this source tree, or the
 * OpenIB.org BSD license below:
 *
 *     Redistribution and use in source and binary forms, with or
 *     without modification, are permitted provided that the following
 *     conditions are met:
 *
 *      - Redistributions of source code must retain the above
 *        copyright notice, this list of conditions and the following
 *        disclaimer.
 *
 *      - Redistributions in binary form must reproduce the above
 *        copyright notice, this list of conditions and the following
 *        disclaimer in the documentation and/or other materials
 *        provided with the distribution.
 *
 * THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND,
 * EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF
 * MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
 * NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS
 * BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN
 * ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN
 * CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
 * SOFTWARE.
 */
#ifndef GDRKV_VERBS_ABI_H
#define GDRKV_VERBS_ABI_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct ibv_ah;
struct ibv_device;
struct ibv_srq;
struct _compat_ibv_port_attr;
struct ibv_context;

union ibv_gid {
    uint8_t            raw[16];
    struct {
        uint64_t    subnet_prefix;
        uint64_t    interface_id;
    } global;
};

enum ibv_node_type {
    IBV_NODE_UNKNOWN    = -1,
    IBV_NODE_CA         = 1,
    IBV_NODE_SWITCH,
    IBV_NODE_ROUTER,
    IBV_NODE_RNIC,
    IBV_NODE_USNIC,
    IBV_NODE_USNIC_UDP,
    IBV_NODE_UNSPECIFIED,
};

enum ibv_transport_type {
    IBV_TRANSPORT_UNKNOWN    = -1,
    IBV_TRANSPORT_IB    = 0,
    IBV_TRANSPORT_IWARP,
    IBV_TRANSPORT_USNIC,
    IBV_TRANSPORT_USNIC_UDP,
    IBV_TRANSPORT_UNSPECIFIED,
};

enum ibv_device_cap_flags {
    IBV_DEVICE_RESIZE_MAX_WR    = 1,
    IBV_DEVICE_BAD_PKEY_CNTR    = 1 <<  1,
    IBV_DEVICE_BAD_QKEY_CNTR    = 1 <<  2,
    IBV_DEVICE_RAW_MULTI        = 1 <<  3,
    IBV_DEVICE_AUTO_PATH_MIG    = 1 <<  4,
    IBV_DEVICE_CHANGE_PHY_PORT    = 1 <<  5,
    IBV_DEVICE_UD_AV_PORT_ENFORCE    = 1 <<  6,
    IBV_DEVICE_CURR_QP_STATE_MOD    = 1 <<  7,
    IBV_DEVICE_SHUTDOWN_PORT    = 1 <<  8,
    IBV_DEVICE_INIT_TYPE        = 1 <<  9,
    IBV_DEVICE_PORT_ACTIVE_EVENT    = 1 << 10,
    IBV_DEVICE_SYS_IMAGE_GUID    = 1 << 11,
    IBV_DEVICE_RC_RNR_NAK_GEN    = 1 << 12,
    IBV_DEVICE_SRQ_RESIZE        = 1 << 13,
    IBV_DEVICE_N_NOTIFY_CQ        = 1 << 14,
    IBV_DEVICE_MEM_WINDOW           = 1 << 17,
    IBV_DEVICE_UD_IP_CSUM        = 1 << 18,
    IBV_DEVICE_XRC            = 1 << 20,
    IBV_DEVICE_MEM_MGT_EXTENSIONS    = 1 << 21,
    IBV_DEVICE_MEM_WINDOW_TYPE_2A    = 1 << 23,
    IBV_DEVICE_MEM_WINDOW_TYPE_2B    = 1 << 24,
    IBV_DEVICE_RC_IP_CSUM        = 1 << 25,
    IBV_DEVICE_RAW_IP_CSUM        = 1 << 26,
    IBV_DEVICE_MANAGED_FLOW_STEERING = 1 << 29
};

enum ibv_atomic_cap {
    IBV_ATOMIC_NONE,
    IBV_ATOMIC_HCA,
    IBV_ATOMIC_GLOB
};

struct ibv_device_attr {
    char            fw_ver[64];
    uint64_t            node_guid;
    uint64_t            sys_image_guid;
    uint64_t        max_mr_size;
    uint64_t        page_size_cap;
    uint32_t        vendor_id;
    uint32_t        vendor_part_id;
    uint32_t        hw_ver;
    int            max_qp;
    int            max_qp_wr;
    unsigned int        device_cap_flags;
    int            max_sge;
    int            max_sge_rd;
    int            max_cq;
    int            max_cqe;
    int            max_mr;
    int            max_pd;
    int            max_qp_rd_atom;
    int            max_ee_rd_atom;
    int            max_res_rd_atom;
    int            max_qp_init_rd_atom;
    int            max_ee_init_rd_atom;
    enum ibv_atomic_cap    atomic_cap;
    int            max_ee;
    int            max_rdd;
    int            max_mw;
    int            max_raw_ipv6_qp;
    int            max_raw_ethy_qp;
    int            max_mcast_grp;
    int            max_mcast_qp_attach;
    int            max_total_mcast_qp_attach;
    int            max_ah;
    int            max_fmr;
    int            max_map_per_fmr;
    int            max_srq;
    int            max_srq_wr;
    int            max_srq_sge;
    uint16_t        max_pkeys;
    uint8_t            local_ca_ack_delay;
    uint8_t            phys_port_cnt;
};

enum ibv_mtu {
    IBV_MTU_256  = 1,
    IBV_MTU_512  = 2,
    IBV_MTU_1024 = 3,
    IBV_MTU_2048 = 4,
    IBV_MTU_4096 = 5
};

enum ibv_port_state {
    IBV_PORT_NOP        = 0,
    IBV_PORT_DOWN        = 1,
    IBV_PORT_INIT        = 2,
    IBV_PORT_ARMED        = 3,
    IBV_PORT_ACTIVE        = 4,
    IBV_PORT_ACTIVE_DEFER    = 5
};

enum {
    IBV_LINK_LAYER_UNSPECIFIED,
    IBV_LINK_LAYER_INFINIBAND,
    IBV_LINK_LAYER_ETHERNET,
};

enum ibv_port_cap_flags {
    IBV_PORT_SM                = 1 <<  1,
    IBV_PORT_NOTICE_SUP            = 1 <<  2,
    IBV_PORT_TRAP_SUP            = 1 <<  3,
    IBV_PORT_OPT_IPD_SUP            = 1 <<  4,
    IBV_PORT_AUTO_MIGR_SUP            = 1 <<  5,
    IBV_PORT_SL_MAP_SUP            = 1 <<  6,
    IBV_PORT_MKEY_NVRAM            = 1 <<  7,
    IBV_PORT_PKEY_NVRAM            = 1 <<  8,
    IBV_PORT_LED_INFO_SUP            = 1 <<  9,
    IBV_PORT_SYS_IMAGE_GUID_SUP        = 1 << 11,
    IBV_PORT_PKEY_SW_EXT_PORT_TRAP_SUP    = 1 << 12,
    IBV_PORT_EXTENDED_SPEEDS_SUP        = 1 << 14,
    IBV_PORT_CAP_MASK2_SUP            = 1 << 15,
    IBV_PORT_CM_SUP                = 1 << 16,
    IBV_PORT_SNMP_TUNNEL_SUP        = 1 << 17,
    IBV_PORT_REINIT_SUP            = 1 << 18,
    IBV_PORT_DEVICE_MGMT_SUP        = 1 << 19,
    IBV_PORT_VENDOR_CLASS_SUP        = 1 << 20,
    IBV_PORT_DR_NOTICE_SUP            = 1 << 21,
    IBV_PORT_CAP_MASK_NOTICE_SUP        = 1 << 22,
    IBV_PORT_BOOT_MGMT_SUP            = 1 << 23,
    IBV_PORT_LINK_LATENCY_SUP        = 1 << 24,
    IBV_PORT_CLIENT_REG_SUP            = 1 << 25,
    IBV_PORT_IP_BASED_GIDS            = 1 << 26
};

struct ibv_port_attr {
    enum ibv_port_state    state;
    enum ibv_mtu        max_mtu;
    enum ibv_mtu        active_mtu;
    int            gid_tbl_len;
    uint32_t        port_cap_flags;
    uint32_t        max_msg_sz;
    uint32_t        bad_pkey_cntr;
    uint32_t        qkey_viol_cntr;
    uint16_t        pkey_tbl_len;
    uint16_t        lid;
    uint16_t        sm_lid;
    uint8_t            lmc;
    uint8_t            max_vl_num;
    uint8_t            sm_sl;
    uint8_t            subnet_timeout;
    uint8_t            init_type_reply;
    uint8_t            active_width;
    uint8_t            active_speed;
    uint8_t            phys_state;
    uint8_t            link_layer;
    uint8_t            flags;
    uint16_t        port_cap_flags2;
};

enum ibv_wc_status {
    IBV_WC_SUCCESS,
    IBV_WC_LOC_LEN_ERR,
    IBV_WC_LOC_QP_OP_ERR,
    IBV_WC_LOC_EEC_OP_ERR,
    IBV_WC_LOC_PROT_ERR,
    IBV_WC_WR_FLUSH_ERR,
    IBV_WC_MW_BIND_ERR,
    IBV_WC_BAD_RESP_ERR,
    IBV_WC_LOC_ACCESS_ERR,
    IBV_WC_REM_INV_REQ_ERR,
    IBV_WC_REM_ACCESS_ERR,
    IBV_WC_REM_OP_ERR,
    IBV_WC_RETRY_EXC_ERR,
    IBV_WC_RNR_RETRY_EXC_ERR,
    IBV_WC_LOC_RDD_VIOL_ERR,
    IBV_WC_REM_INV_RD_REQ_ERR,
    IBV_WC_REM_ABORT_ERR,
    IBV_WC_INV_EECN_ERR,
    IBV_WC_INV_EEC_STATE_ERR,
    IBV_WC_FATAL_ERR,
    IBV_WC_RESP_TIMEOUT_ERR,
    IBV_WC_GENERAL_ERR,
    IBV_WC_TM_ERR,
    IBV_WC_TM_RNDV_INCOMPLETE,
};

enum ibv_wc_opcode {
    IBV_WC_SEND,
    IBV_WC_RDMA_WRITE,
    IBV_WC_RDMA_READ,
    IBV_WC_COMP_SWAP,
    IBV_WC_FETCH_ADD,
    IBV_WC_BIND_MW,
    IBV_WC_LOCAL_INV,
    IBV_WC_TSO,
    IBV_WC_ATOMIC_WRITE = 9,
/*
 * Set value of IBV_WC_RECV so consumers can test if a completion is a
 * receive by testing (opcode & IBV_WC_RECV).
 */
    IBV_WC_RECV            = 1 << 7,
    IBV_WC_RECV_RDMA_WITH_IMM,

    IBV_WC_TM_ADD,
    IBV_WC_TM_DEL,
    IBV_WC_TM_SYNC,
    IBV_WC_TM_RECV,
    IBV_WC_TM_NO_TAG,
    IBV_WC_DRIVER1,
    IBV_WC_DRIVER2,
    IBV_WC_DRIVER3,
};

struct ibv_wc {
    uint64_t        wr_id;
    enum ibv_wc_status    status;
    enum ibv_wc_opcode    opcode;
    uint32_t        vendor_err;
    uint32_t        byte_len;
    /* When (wc_flags & IBV_WC_WITH_IMM): Immediate data in network byte order.
     * When (wc_flags & IBV_WC_WITH_INV): Stores the invalidated rkey.
     */
    union {
        uint32_t        imm_data;
        uint32_t    invalidated_rkey;
    };
    uint32_t        qp_num;
    uint32_t        src_qp;
    unsigned int        wc_flags;
    uint16_t        pkey_index;
    uint16_t        slid;
    uint8_t            sl;
    uint8_t            dlid_path_bits;
};

enum ibv_access_flags {
    IBV_ACCESS_LOCAL_WRITE        = 1,
    IBV_ACCESS_REMOTE_WRITE        = (1<<1),
    IBV_ACCESS_REMOTE_READ        = (1<<2),
    IBV_ACCESS_REMOTE_ATOMIC    = (1<<3),
    IBV_ACCESS_MW_BIND        = (1<<4),
    IBV_ACCESS_ZERO_BASED        = (1<<5),
    IBV_ACCESS_ON_DEMAND        = (1<<6),
    IBV_ACCESS_HUGETLB        = (1<<7),
    IBV_ACCESS_RELAXED_ORDERING    = 1 << 20 /* IBV_ACCESS_OPTIONAL_FIRST */,
};

struct ibv_pd {
    struct ibv_context     *context;
    uint32_t        handle;
};

struct ibv_mr {
    struct ibv_context     *context;
    struct ibv_pd           *pd;
    void               *addr;
    size_t            length;
    uint32_t        handle;
    uint32_t        lkey;
    uint32_t        rkey;
};

enum ibv_mw_type {
    IBV_MW_TYPE_1            = 1,
    IBV_MW_TYPE_2            = 2
};

struct ibv_mw {
    struct ibv_context     *context;
    struct ibv_pd           *pd;
    uint32_t        rkey;
    uint32_t        handle;
    enum ibv_mw_type    type;
};

struct ibv_global_route {
    union ibv_gid        dgid;
    uint32_t        flow_label;
    uint8_t            sgid_index;
    uint8_t            hop_limit;
    uint8_t            traffic_class;
};

struct ibv_ah_attr {
    struct ibv_global_route    grh;
    uint16_t        dlid;
    uint8_t            sl;
    uint8_t            src_path_bits;
    uint8_t            static_rate;
    uint8_t            is_global;
    uint8_t            port_num;
};

struct ibv_qp_cap {
    uint32_t        max_send_wr;
    uint32_t        max_recv_wr;
    uint32_t        max_send_sge;
    uint32_t        max_recv_sge;
    uint32_t        max_inline_data;
};

enum ibv_qp_type {
    IBV_QPT_RC = 2,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_QPT_RAW_PACKET = 8,
    IBV_QPT_XRC_SEND = 9,
    IBV_QPT_XRC_RECV,
    IBV_QPT_DRIVER = 0xff,
};

struct ibv_qp_init_attr {
    void               *qp_context;
    struct ibv_cq           *send_cq;
    struct ibv_cq           *recv_cq;
    struct ibv_srq           *srq;
    struct ibv_qp_cap    cap;
    enum ibv_qp_type    qp_type;
    int            sq_sig_all;
};

enum ibv_qp_attr_mask {
    IBV_QP_STATE            = 1 <<     0,
    IBV_QP_CUR_STATE        = 1 <<     1,
    IBV_QP_EN_SQD_ASYNC_NOTIFY    = 1 <<     2,
    IBV_QP_ACCESS_FLAGS        = 1 <<     3,
    IBV_QP_PKEY_INDEX        = 1 <<     4,
    IBV_QP_PORT            = 1 <<     5,
    IBV_QP_QKEY            = 1 <<     6,
    IBV_QP_AV            = 1 <<     7,
    IBV_QP_PATH_MTU            = 1 <<     8,
    IBV_QP_TIMEOUT            = 1 <<     9,
    IBV_QP_RETRY_CNT        = 1 << 10,
    IBV_QP_RNR_RETRY        = 1 << 11,
    IBV_QP_RQ_PSN            = 1 << 12,
    IBV_QP_MAX_QP_RD_ATOMIC        = 1 << 13,
    IBV_QP_ALT_PATH            = 1 << 14,
    IBV_QP_MIN_RNR_TIMER        = 1 << 15,
    IBV_QP_SQ_PSN            = 1 << 16,
    IBV_QP_MAX_DEST_RD_ATOMIC    = 1 << 17,
    IBV_QP_PATH_MIG_STATE        = 1 << 18,
    IBV_QP_CAP            = 1 << 19,
    IBV_QP_DEST_QPN            = 1 << 20,
    /* These bits were supported on older kernels, but never exposed from
       libibverbs:
    _IBV_QP_SMAC               = 1 << 21,
    _IBV_QP_ALT_SMAC        = 1 << 22,
    _IBV_QP_VID                = 1 << 23,
    _IBV_QP_ALT_VID         = 1 << 24,
    */
    IBV_QP_RATE_LIMIT        = 1 << 25,
};

enum ibv_qp_state {
    IBV_QPS_RESET,
    IBV_QPS_INIT,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPS_SQE,
    IBV_QPS_ERR,
    IBV_QPS_UNKNOWN
};

enum ibv_mig_state {
    IBV_MIG_MIGRATED,
    IBV_MIG_REARM,
    IBV_MIG_ARMED
};

struct ibv_qp_attr {
    enum ibv_qp_state    qp_state;
    enum ibv_qp_state    cur_qp_state;
    enum ibv_mtu        path_mtu;
    enum ibv_mig_state    path_mig_state;
    uint32_t        qkey;
    uint32_t        rq_psn;
    uint32_t        sq_psn;
    uint32_t        dest_qp_num;
    unsigned int        qp_access_flags;
    struct ibv_qp_cap    cap;
    struct ibv_ah_attr    ah_attr;
    struct ibv_ah_attr    alt_ah_attr;
    uint16_t        pkey_index;
    uint16_t        alt_pkey_index;
    uint8_t            en_sqd_async_notify;
    uint8_t            sq_draining;
    uint8_t            max_rd_atomic;
    uint8_t            max_dest_rd_atomic;
    uint8_t            min_rnr_timer;
    uint8_t            port_num;
    uint8_t            timeout;
    uint8_t            retry_cnt;
    uint8_t            rnr_retry;
    uint8_t            alt_port_num;
    uint8_t            alt_timeout;
    uint32_t        rate_limit;
};

enum ibv_wr_opcode {
    IBV_WR_RDMA_WRITE,
    IBV_WR_RDMA_WRITE_WITH_IMM,
    IBV_WR_SEND,
    IBV_WR_SEND_WITH_IMM,
    IBV_WR_RDMA_READ,
    IBV_WR_ATOMIC_CMP_AND_SWP,
    IBV_WR_ATOMIC_FETCH_AND_ADD,
    IBV_WR_LOCAL_INV,
    IBV_WR_BIND_MW,
    IBV_WR_SEND_WITH_INV,
    IBV_WR_TSO,
    IBV_WR_DRIVER1,
    IBV_WR_ATOMIC_WRITE = 15,
};

enum ibv_send_flags {
    IBV_SEND_FENCE        = 1 << 0,
    IBV_SEND_SIGNALED    = 1 << 1,
    IBV_SEND_SOLICITED    = 1 << 2,
    IBV_SEND_INLINE        = 1 << 3,
    IBV_SEND_IP_CSUM    = 1 << 4
};

struct ibv_sge {
    uint64_t        addr;
    uint32_t        length;
    uint32_t        lkey;
};

struct ibv_mw_bind_info {
    struct ibv_mr    *mr;
    uint64_t     addr;
    uint64_t     length;
    unsigned int     mw_access_flags; /* use ibv_access_flags */
};

struct ibv_send_wr {
    uint64_t        wr_id;
    struct ibv_send_wr     *next;
    struct ibv_sge           *sg_list;
    int            num_sge;
    enum ibv_wr_opcode    opcode;
    unsigned int        send_flags;
    /* When opcode is *_WITH_IMM: Immediate data in network byte order.
     * When opcode is *_INV: Stores the rkey to invalidate
     */
    union {
        uint32_t            imm_data;
        uint32_t        invalidate_rkey;
    };
    union {
        struct {
            uint64_t    remote_addr;
            uint32_t    rkey;
        } rdma;
        struct {
            uint64_t    remote_addr;
            uint64_t    compare_add;
            uint64_t    swap;
            uint32_t    rkey;
        } atomic;
        struct {
            struct ibv_ah  *ah;
            uint32_t    remote_qpn;
            uint32_t    remote_qkey;
        } ud;
    } wr;
    union {
        struct {
            uint32_t    remote_srqn;
        } xrc;
    } qp_type;
    union {
        struct {
            struct ibv_mw    *mw;
            uint32_t        rkey;
            struct ibv_mw_bind_info    bind_info;
        } bind_mw;
        struct {
            void               *hdr;
            uint16_t        hdr_sz;
            uint16_t        mss;
        } tso;
    };
};

struct ibv_recv_wr {
    uint64_t        wr_id;
    struct ibv_recv_wr     *next;
    struct ibv_sge           *sg_list;
    int            num_sge;
};

struct ibv_mw_bind {
    uint64_t        wr_id;
    unsigned int        send_flags;
    struct ibv_mw_bind_info bind_info;
};

struct ibv_comp_channel {
    struct ibv_context     *context;
    int            fd;
    int            refcnt;
};

struct ibv_cq {
    struct ibv_context     *context;
    struct ibv_comp_channel *channel;
    void               *cq_context;
    uint32_t        handle;
    int            cqe;

    pthread_mutex_t        mutex;
    pthread_cond_t        cond;
    uint32_t        comp_events_completed;
    uint32_t        async_events_completed;
};

struct ibv_qp {
    struct ibv_context     *context;
    void               *qp_context;
    struct ibv_pd           *pd;
    struct ibv_cq           *send_cq;
    struct ibv_cq           *recv_cq;
    struct ibv_srq           *srq;
    uint32_t        handle;
    uint32_t        qp_num;
    enum ibv_qp_state       state;
    enum ibv_qp_type    qp_type;

    pthread_mutex_t        mutex;
    pthread_cond_t        cond;
    uint32_t        events_completed;
};

struct _ibv_device_ops {
    struct ibv_context *    (*_dummy1)(struct ibv_device *device, int cmd_fd);
    void            (*_dummy2)(struct ibv_context *context);
};

enum {
    IBV_SYSFS_NAME_MAX    = 64,
    IBV_SYSFS_PATH_MAX    = 256
};

struct ibv_device {
    struct _ibv_device_ops    _ops;
    enum ibv_node_type    node_type;
    enum ibv_transport_type    transport_type;
    /* Name of underlying kernel IB device, eg "mthca0" */
    char            name[IBV_SYSFS_NAME_MAX];
    /* Name of uverbs device, eg "uverbs0" */
    char            dev_name[IBV_SYSFS_NAME_MAX];
    /* Path to infiniband_verbs class device in sysfs */
    char            dev_path[IBV_SYSFS_PATH_MAX];
    /* Path to infiniband class device in sysfs */
    char            ibdev_path[IBV_SYSFS_PATH_MAX];
};

struct ibv_context_ops {
    int (*_compat_query_device)(struct ibv_context *context,
                    struct ibv_device_attr *device_attr);
    int (*_compat_query_port)(struct ibv_context *context,
                  uint8_t port_num,
                  struct _compat_ibv_port_attr *port_attr);
    void *(*_compat_alloc_pd)(void);
    void *(*_compat_dealloc_pd)(void);
    void *(*_compat_reg_mr)(void);
    void *(*_compat_rereg_mr)(void);
    void *(*_compat_dereg_mr)(void);
    struct ibv_mw *        (*alloc_mw)(struct ibv_pd *pd, enum ibv_mw_type type);
    int            (*bind_mw)(struct ibv_qp *qp, struct ibv_mw *mw,
                       struct ibv_mw_bind *mw_bind);
    int            (*dealloc_mw)(struct ibv_mw *mw);
    void *(*_compat_create_cq)(void);
    int            (*poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
    int            (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);
    void *(*_compat_cq_event)(void);
    void *(*_compat_resize_cq)(void);
    void *(*_compat_destroy_cq)(void);
    void *(*_compat_create_srq)(void);
    void *(*_compat_modify_srq)(void);
    void *(*_compat_query_srq)(void);
    void *(*_compat_destroy_srq)(void);
    int            (*post_srq_recv)(struct ibv_srq *srq,
                         struct ibv_recv_wr *recv_wr,
                         struct ibv_recv_wr **bad_recv_wr);
    void *(*_compat_create_qp)(void);
    void *(*_compat_query_qp)(void);
    void *(*_compat_modify_qp)(void);
    void *(*_compat_destroy_qp)(void);
    int            (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr,
                         struct ibv_send_wr **bad_wr);
    int            (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr,
                         struct ibv_recv_wr **bad_wr);
    void *(*_compat_create_ah)(void);
    void *(*_compat_destroy_ah)(void);
    void *(*_compat_attach_mcast)(void);
    void *(*_compat_detach_mcast)(void);
    void *(*_compat_async_event)(void);
};

struct ibv_context {
    struct ibv_device      *device;
    struct ibv_context_ops    ops;
    int            cmd_fd;
    int            async_fd;
    int            num_comp_vectors;
    pthread_mutex_t        mutex;
    void               *abi_compat;
};

/* The functions of the library (loaded with dlopen by the transport,
 * defined by softverbs). */
struct ibv_device **ibv_get_device_list(int *num_devices);
void ibv_free_device_list(struct ibv_device **list);
const char *ibv_get_device_name(struct ibv_device *device);
uint64_t ibv_get_device_guid(struct ibv_device *device);
struct ibv_context *ibv_open_device(struct ibv_device *device);
int ibv_close_device(struct ibv_context *context);
int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *device_attr);
int ibv_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr);
int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid);
struct ibv_pd *ibv_alloc_pd(struct ibv_context *context);
int ibv_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access);
struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                               int access);
struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                unsigned int access);
struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                 uint64_t iova, int fd, int access);
int ibv_dereg_mr(struct ibv_mr *mr);
struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                             struct ibv_comp_channel *channel, int comp_vector);
int ibv_destroy_cq(struct ibv_cq *cq);
struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr);
int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
                 struct ibv_qp_init_attr *init_attr);
int ibv_destroy_qp(struct ibv_qp *qp);
const char *ibv_wc_status_str(enum ibv_wc_status status);

/* The data path goes through the context's ops table, as rdma-core's own
 * inline wrappers do: no library call per post or poll. */
static inline int ibv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
                                struct ibv_send_wr **bad_wr)
{
    return qp->context->ops.post_send(qp, wr, bad_wr);
}

static inline int ibv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
                                struct ibv_recv_wr **bad_wr)
{
    return qp->context->ops.post_recv(qp, wr, bad_wr);
}

static inline int ibv_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
    return cq->context->ops.poll_cq(cq, num_entries, wc);
}

#endif
