/*
 * registry.c - how processes find each other's QPs and MRs: one file per
 * user, $SOFTVERBS_DIR/softverbs-<uid> (default /dev/shm), mapped
 * MAP_SHARED. A zero-filled file is a valid empty registry, so whoever
 * comes first just sizes it.
 *
 * A slot belongs to the pid in its owner field, claimed by compare-exchange
 * from 0 or from a pid that no longer exists (a crashed process frees its
 * slots by dying). Each entry is published like a seqlock: its key (MR) or
 * QPN (QP) is 0 while the other fields change and is stored last with
 * release order; a reader copies the fields and checks the key again, so it
 * never acts on a half-written or recycled entry. The key carries a
 * generation that changes on every claim, which makes a deregistered key
 * stale instead of silently naming the next MR in that slot.
 */
#include "sv.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SV_REG_MAGIC 0x3147455256534f53ull   /* "SOSVREG1" */
#define SV_REG_HEADER 4096

struct sv_registry {
    _Atomic uint64_t magic;
    uint32_t nqp, nmr;
    _Atomic uint32_t qp_hint, mr_hint;      /* where the next search starts */
};

static struct sv_registry *reg;
static struct sv_reg_qp *qps;
static struct sv_reg_mr *mrs;
static int open_rc;
static pthread_once_t open_once = PTHREAD_ONCE_INIT;
static pid_t self_pid;

static void after_fork(void) { self_pid = getpid(); }

pid_t sv_self(void)
{
    return self_pid ? self_pid : getpid();
}

int sv_pid_dead(pid_t pid)
{
    return pid <= 0 || (kill(pid, 0) < 0 && errno == ESRCH);
}

static size_t registry_size(void)
{
    return SV_REG_HEADER + sizeof(struct sv_reg_qp) * SV_MAX_QP +
           sizeof(struct sv_reg_mr) * SV_MAX_MR;
}

static int map_registry(void)
{
    const char *dir = getenv("SOFTVERBS_DIR");
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/softverbs-%u", dir && *dir ? dir : "/dev/shm",
                     (unsigned)getuid());
    if (n < 0 || (size_t)n >= sizeof path)
        return ENAMETOOLONG;
    /* O_NOFOLLOW and the owner check: /dev/shm is world-writable, and a
     * file someone else planted must not become our QP table. */
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return errno;
    struct stat st;
    size_t size = registry_size();
    int rc = 0;
    if (fstat(fd, &st) < 0)
        rc = errno;
    else if (!S_ISREG(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077))
        rc = EPERM;
    else if ((size_t)st.st_size < size && ftruncate(fd, (off_t)size) < 0)
        rc = errno;
    void *p = MAP_FAILED;
    if (!rc) {
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            rc = errno;
    }
    close(fd);
    if (rc)
        return rc;

    struct sv_registry *r = p;
    uint64_t expected = 0;
    if (!atomic_compare_exchange_strong(&r->magic, &expected, SV_REG_MAGIC) &&
        expected != SV_REG_MAGIC) {
        munmap(p, size);
        return EPROTO;                  /* another layout: remove the stale file */
    }
    reg = r;
    qps = (struct sv_reg_qp *)((char *)p + SV_REG_HEADER);
    mrs = (struct sv_reg_mr *)(qps + SV_MAX_QP);
    return 0;
}

static void open_once_fn(void)
{
    self_pid = getpid();
    pthread_atfork(NULL, NULL, after_fork);
    open_rc = map_registry();
}

int sv_registry_open(void)
{
    pthread_once(&open_once, open_once_fn);
    return open_rc;
}

/*
 * Claims a free slot in owners[0..n) (stride bytes apart): first pass takes
 * never-used or released slots, the second also those of dead processes.
 */
static int claim(_Atomic uint32_t *hint, char *base, size_t stride, int n)
{
    pid_t me = sv_self();
    uint32_t start = atomic_fetch_add_explicit(hint, 1, memory_order_relaxed);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n; i++) {
            int slot = (int)((start + (uint32_t)i) % (uint32_t)n);
            _Atomic int32_t *owner = (_Atomic int32_t *)(base + stride * (size_t)slot);
            int32_t cur = atomic_load_explicit(owner, memory_order_relaxed);
            if (cur != 0 && (pass == 0 || cur == me || !sv_pid_dead(cur)))
                continue;
            if (atomic_compare_exchange_strong(owner, &cur, me))
                return slot;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------- MRs */

int sv_reg_mr_claim(void)
{
    /* Slot 0 is never used so that no valid key is 0 or tiny. */
    int slot = claim(&reg->mr_hint, (char *)(mrs + 1), sizeof *mrs, SV_MAX_MR - 1);
    if (slot < 0)
        return -1;
    slot++;
    atomic_store(&mrs[slot].key, 0);
    return slot;
}

static uint32_t next_gen(_Atomic uint32_t *gen, uint32_t mask)
{
    uint32_t g;
    do
        g = (atomic_fetch_add(gen, 1) + 1) & mask;
    while (g == 0);
    return g;
}

uint32_t sv_reg_mr_publish(int slot, const struct sv_mr_view *v)
{
    struct sv_reg_mr *e = &mrs[slot];
    uint32_t gen = next_gen(&e->gen, 0xffff);
    atomic_store_explicit(&e->access, v->access, memory_order_relaxed);
    atomic_store_explicit(&e->kind, v->kind, memory_order_relaxed);
    atomic_store_explicit(&e->pd_id, v->pd_id, memory_order_relaxed);
    atomic_store_explicit(&e->addr, v->addr, memory_order_relaxed);
    atomic_store_explicit(&e->iova, v->iova, memory_order_relaxed);
    atomic_store_explicit(&e->length, v->length, memory_order_relaxed);
    uint32_t key = (uint32_t)slot | gen << SV_MR_SLOT_BITS;
    atomic_store_explicit(&e->key, key, memory_order_release);
    return key;
}

void sv_reg_mr_release(int slot)
{
    atomic_store(&mrs[slot].key, 0);
    atomic_store(&mrs[slot].owner, 0);
}

int sv_reg_mr_get(uint32_t key, struct sv_mr_view *out)
{
    if (!reg || key == 0)
        return -1;
    struct sv_reg_mr *e = &mrs[key & (SV_MAX_MR - 1)];
    if (atomic_load_explicit(&e->key, memory_order_acquire) != key)
        return -1;
    out->owner = atomic_load_explicit(&e->owner, memory_order_relaxed);
    out->access = atomic_load_explicit(&e->access, memory_order_relaxed);
    out->kind = atomic_load_explicit(&e->kind, memory_order_relaxed);
    out->pd_id = atomic_load_explicit(&e->pd_id, memory_order_relaxed);
    out->addr = atomic_load_explicit(&e->addr, memory_order_relaxed);
    out->iova = atomic_load_explicit(&e->iova, memory_order_relaxed);
    out->length = atomic_load_explicit(&e->length, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(&e->key, memory_order_relaxed) == key ? 0 : -1;
}

/* ------------------------------------------------------------------- QPs */

int sv_reg_qp_claim(void)
{
    int slot = claim(&reg->qp_hint, (char *)qps, sizeof *qps, SV_MAX_QP);
    if (slot >= 0)
        atomic_store(&qps[slot].qpn, 0);
    return slot;
}

uint32_t sv_reg_qp_publish(int slot, uint64_t pd_id)
{
    struct sv_reg_qp *e = &qps[slot];
    /* 10 bits of generation keep the QPN within 24 bits. */
    uint32_t gen = next_gen(&e->gen, (1u << (24 - SV_QP_SLOT_BITS)) - 1);
    atomic_store_explicit(&e->state, IBV_QPS_RESET, memory_order_relaxed);
    atomic_store_explicit(&e->remote_qpn, 0, memory_order_relaxed);
    atomic_store_explicit(&e->path_mtu, 0, memory_order_relaxed);
    atomic_store_explicit(&e->max_dest_rd_atomic, 0, memory_order_relaxed);
    atomic_store_explicit(&e->access, 0, memory_order_relaxed);
    atomic_store_explicit(&e->pd_id, pd_id, memory_order_relaxed);
    uint32_t qpn = (uint32_t)slot | gen << SV_QP_SLOT_BITS;
    atomic_store_explicit(&e->qpn, qpn, memory_order_release);
    return qpn;
}

void sv_reg_qp_release(int slot)
{
    atomic_store(&qps[slot].state, IBV_QPS_RESET);
    atomic_store(&qps[slot].qpn, 0);
    atomic_store(&qps[slot].owner, 0);
}

struct sv_reg_qp *sv_reg_qp_slot(int slot)
{
    return &qps[slot];
}

int sv_reg_qp_get(uint32_t qpn, struct sv_qp_view *out)
{
    if (!reg || qpn == 0 || qpn >> 24)
        return -1;
    struct sv_reg_qp *e = &qps[qpn & (SV_MAX_QP - 1)];
    if (atomic_load_explicit(&e->qpn, memory_order_acquire) != qpn)
        return -1;
    out->owner = atomic_load_explicit(&e->owner, memory_order_relaxed);
    out->state = atomic_load_explicit(&e->state, memory_order_relaxed);
    out->remote_qpn = atomic_load_explicit(&e->remote_qpn, memory_order_relaxed);
    out->max_dest_rd_atomic = atomic_load_explicit(&e->max_dest_rd_atomic, memory_order_relaxed);
    out->access = atomic_load_explicit(&e->access, memory_order_relaxed);
    out->path_mtu = atomic_load_explicit(&e->path_mtu, memory_order_relaxed);
    out->pd_id = atomic_load_explicit(&e->pd_id, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(&e->qpn, memory_order_relaxed) == qpn ? 0 : -1;
}
