/*
 * gpu_slices.h - a large shared host mapping (a server's shm pool) made
 * reachable from the GPU in slices, on demand, by a thread of its own.
 *
 * Registering a mapping with CUDA pins every page of it: registering a
 * 96 GiB pool inside a call took 51 s (docs/gpu.md, "What each process
 * pins"). Here a copy only asks whether the slices it touches are
 * registered; the first to ask for a slice queues it, and the
 * registration thread registers it a few milliseconds later. Until then
 * the caller copies another way (the copy engines, which pin pageable
 * memory piece by piece themselves), so no call ever waits for a
 * registration, its own or another's. After the demanded slices, the
 * thread registers the next ones ahead, up to a limit.
 *
 * A copy must not cross a slice border: CUDA refuses a copy whose host
 * range spans two registrations. Slices are multiples of the store's
 * 1 MiB allocation pages and start at the mapping's base, so no object's
 * chunk crosses one (gpu_slices_border tells where the next border is,
 * for whoever merges pieces).
 *
 * Thread safety: gpu_slices_reach and the counters may be called from any
 * thread, lock-free once a slice is registered; only the first demand of
 * a slice takes the queue's lock.
 *
 * Under a pin limit smaller than the mapping, a slice that would pass it
 * evicts (unregisters) the least recently used registered slices that no
 * copy holds. Copies then hold the slices they use (gpu_slices_hold) until
 * the GPU is done with them (gpu_slices_unhold): a held slice is never
 * unregistered. Without such a limit nothing is evicted and nothing need
 * be held (gpu_slices_evicts).
 */
#ifndef GDRKV_GPU_SLICES_H
#define GDRKV_GPU_SLICES_H

#include <pthread.h>
#include <stdint.h>

/* The registration itself: CUDA's (gpu_slices_cuda_ops), or a test's.
 * thread_start (may be NULL) runs first on the registration thread; reg
 * returns 0 and where the GPU reaches base, or a negative error. */
struct gpu_slices_ops {
    void (*thread_start)(void *ctx);
    int (*reg)(void *ctx, const void *base, uint64_t len, int readonly, uint64_t *dptr);
    void (*unreg)(void *ctx, const void *base);
    void *ctx;
};

/* CUDA's registration, run in device dev's primary context: the device
 * whose copy first asked for the mapping, so a rank's thread never makes a
 * context on another rank's GPU. */
struct gpu_slices_ops gpu_slices_cuda_ops(int dev);

/* Slice size: a multiple of the store's allocation page (1 MiB). 64 MiB
 * registers in about 3 ms when its pages are in memory and about 50 ms
 * when registering faults them in (docs/gpu.md). */
#define GPU_SLICE_BYTES (64ull << 20)

enum gpu_slice_state {
    GPU_SLICE_UNREGISTERED = 0,
    GPU_SLICE_QUEUED,           /* demanded, the thread will register it */
    GPU_SLICE_READY,            /* registered: dptr holds where the GPU reaches it */
    GPU_SLICE_FAILED,           /* CUDA refused it: copies take the other way */
    GPU_SLICE_OVER_LIMIT,       /* larger than the limit itself: likewise */
    GPU_SLICE_EVICTING          /* the thread is taking it back: not to be held */
};

/* What slices cost and did, for the client's counters: kept by the
 * caller (one set for all of a client's pools), updated with relaxed
 * atomics. */
struct gpu_slices_stats {
    uint64_t pinned_bytes;      /* registered now (destroy takes its slices off) */
    uint64_t slices_registered;
    uint64_t slices_failed;
    uint64_t slices_over_limit; /* registrations the limit kept out (retried on demand
                                   when only held slices stood in the way) */
    uint64_t slices_evicted;    /* unregistered to make room under the limit */
    uint64_t demands;           /* slices a copy asked for before they were ready */
    uint64_t register_us;       /* time spent registering, all slices */
    uint64_t register_max_us;   /* the longest one */
};

struct gpu_slice {
    uint8_t state;              /* enum gpu_slice_state, atomic */
    uint32_t users;             /* atomic: copies holding it (gpu_slices_hold) */
    uint64_t last_used;         /* atomic: when a copy last held it (ns) */
    uint64_t dptr;              /* READY: the GPU's address of the slice's first byte */
};

struct gpu_slices {
    const uint8_t *base;
    uint64_t len;
    uint64_t slice_bytes;
    unsigned slice_shift;       /* slice_bytes == 1 << slice_shift */
    uint32_t count;
    int readonly;
    uint64_t pin_limit;         /* most bytes pinned at once */
    uint64_t pinned;            /* bytes registered now: the thread writes it, anyone
                                   reads it (gpu_slices_pinned) */
    uint64_t ahead_limit;       /* registered ahead of demand, at most */
    struct gpu_slices_ops ops;
    struct gpu_slice *slices;

    pthread_mutex_t lock;       /* the demand queue, stopping */
    pthread_cond_t wake;
    uint32_t *queue;            /* slice indices demanded, a ring of count */
    uint32_t q_head, q_len;
    uint32_t ahead_next;        /* the next slice the thread looks at ahead */
    uint64_t ahead_bytes;       /* registered ahead so far */
    int registering;            /* the thread is registering a slice */
    pthread_cond_t idle;        /* the queue is empty and nothing is registering */
    int stopping;
    int thread_started;
    pthread_t thread;

    struct gpu_slices_stats *stats; /* the caller's */
};

/* Sets up [base, base + len) for registration by slices of slice_bytes
 * (0: GPU_SLICE_BYTES) and starts the thread; nothing is registered yet.
 * pin_limit 0 means the whole mapping; ahead_limit is how much of it the
 * thread registers before anything asks (0: none). What they do is added
 * to *stats, which must outlive s. 0, or GDRKV_E_INTERNAL. */
int gpu_slices_init(struct gpu_slices *s, const void *base, uint64_t len, int readonly,
                    uint64_t slice_bytes, uint64_t pin_limit, uint64_t ahead_limit,
                    const struct gpu_slices_ops *ops, struct gpu_slices_stats *stats);
/* Stops the thread and unregisters every slice: no copy may be using one. */
void gpu_slices_destroy(struct gpu_slices *s);

/* Whether every slice that [addr, addr + len) touches is registered; if
 * not, the ones that were never asked for are queued. Never waits. */
int gpu_slices_reach(struct gpu_slices *s, uint64_t addr, uint64_t len);
/* Bytes of the mapping registered now (the PINS report, client_shm.c). */
uint64_t gpu_slices_pinned(const struct gpu_slices *s);
/* Whether registering may evict slices (a pin limit below the mapping's
 * size): then copies must hold what they use. */
int gpu_slices_evicts(const struct gpu_slices *s);
/* gpu_slices_reach for the one slice holding addr, which is then held,
 * stamped now_ns, until gpu_slices_unhold: 1 (held; its index in *slice),
 * or 0 (not registered: demanded, as gpu_slices_reach does). Never waits. */
int gpu_slices_hold(struct gpu_slices *s, uint64_t addr, uint64_t now_ns, uint32_t *slice);
/* Lets go of a slice gpu_slices_hold held, once the GPU is done with it. */
void gpu_slices_unhold(struct gpu_slices *s, uint32_t slice);

/* The GPU's address of addr, which gpu_slices_reach found registered. */
uint64_t gpu_slices_dptr(const struct gpu_slices *s, uint64_t addr);
/* The first slice border after addr (addr inside the mapping). */
uint64_t gpu_slices_border(const struct gpu_slices *s, uint64_t addr);
/* Whether addr lies in the mapping. */
int gpu_slices_within(const struct gpu_slices *s, uint64_t addr);

/* Tests: waits until the thread has nothing queued (or timeout_ms passed);
 * 1 when idle. */
int gpu_slices_wait_idle(struct gpu_slices *s, int timeout_ms);

#endif
