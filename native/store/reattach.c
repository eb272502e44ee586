/*
 * reattach.c - a pool file's objects back after a restart (the heads it
 * reads are persist.h's).
 *
 * Three steps, the first and the last on a thread per core (a pool of
 * 4 KiB objects holds millions of them):
 *
 *   find     every committed, untorn head at the chunk starts of the pages
 *            the page table marks: page faults and checksums;
 *   order    the heads sorted by commit sequence, so that the LRU comes
 *            back in commit order (oldest writes evicted first);
 *   rebuild  each thread makes the objects of one run of consecutive heads,
 *            claiming their chunks (atomically: runs share pages) and
 *            chaining them into an LRU run and per-namespace runs of its
 *            own; then each thread indexes the objects whose buckets fall
 *            in its share of the index, in commit order, so that of two
 *            heads of one key the first one committed wins, as it would
 *            one at a time; last, the runs are spliced in order.
 *
 * Nothing else runs meanwhile: the store is not open yet (lifecycle.c's
 * store_open calls in here), so the store's lock is not taken; namespaces
 * are created under a lock of the rebuild's own. Objects and namespaces
 * are made by store.c's functions (store_state.h), which never call back.
 */
#include "store_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "common/grow.h"
#include "common/log.h"
#include "gdrkv.h"
#include "persist.h"

#define REATTACH_THREADS 16
/* Fewer pages or heads than these are not worth a thread. */
#define SCAN_PAGES_PER_THREAD 16
#define REBUILD_HEADS_PER_THREAD 16384

/* Runs fn on each of n jobs of job_size bytes, a thread each (the first
 * on the caller's), doing inline what no thread could be started for. */
static void on_threads(void *(*fn)(void *), void *jobs, size_t job_size, uint32_t n)
{
    pthread_t threads[REATTACH_THREADS];
    int started[REATTACH_THREADS] = {0};
    for (uint32_t t = 1; t < n; t++)
        started[t] = pthread_create(&threads[t], NULL, fn, (char *)jobs + t * job_size) == 0;
    fn(jobs);
    for (uint32_t t = 1; t < n; t++) {
        if (started[t])
            pthread_join(threads[t], NULL);
        else
            fn((char *)jobs + t * job_size);
    }
}

static uint32_t threads_for(uint64_t work, uint64_t per_thread)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t most = (uint64_t)GK_MIN(GK_MAX(cpus, 1), REATTACH_THREADS);
    return (uint32_t)GK_MAX(1, GK_MIN(most, work / per_thread));
}

/* ------------------------------------------------------------------ find */

/* A committed head found by the scan: where, and its commit order. */
struct found_head {
    uint64_t seq;
    uint64_t off;
};

/* One thread's share of the scan: pages [first, end). */
struct scan_job {
    const struct store *s;
    uint32_t first, end;
    struct found_head *heads;
    uint32_t n, cap;
    uint64_t min_seq, max_seq, dropped;
    int failed;                 /* out of memory */
};

/* Every committed, untorn head at the chunk starts of the job's pages that
 * the page table gives a class; the others are counted as dropped. */
static void *scan_pages(void *arg)
{
    struct scan_job *job = arg;
    const struct store *s = job->s;
    const uint32_t *tags = s->alloc.page_tags;
    for (uint32_t p = job->first; p < job->end && !job->failed; p++) {
        if (tags[p] == 0 || tags[p] > s->alloc.nclasses)
            continue;
        const struct alloc_class *c = &s->alloc.classes[tags[p] - 1];
        for (uint32_t j = 0; j < c->per_page; j++) {
            uint64_t off = (uint64_t)p * ALLOC_PAGE_SIZE + (uint64_t)j * c->size;
            struct persist_head h;
            if (!persist_is_head(s->pool.base, off))
                continue;
            if (!persist_read_head(s->pool.base, off, c->size, &h)) {
                job->dropped++;
                continue;
            }
            if (gk_grow(&job->heads, &job->cap, job->n + 1, sizeof *job->heads, 4096) != 0) {
                job->failed = 1;
                break;
            }
            job->heads[job->n++] = (struct found_head){h.seq, off};
            job->min_seq = GK_MIN(job->min_seq, h.seq);
            job->max_seq = GK_MAX(job->max_seq, h.seq);
        }
    }
    return NULL;
}

/* Scans the whole pool, a job per thread: how many jobs. */
static uint32_t find_heads(struct store *s, struct scan_job *jobs)
{
    uint32_t npages = s->alloc.npages;
    uint32_t nthreads = threads_for(npages, SCAN_PAGES_PER_THREAD);
    for (uint32_t t = 0; t < nthreads; t++)
        jobs[t] = (struct scan_job){.s = s, .first = (uint32_t)((uint64_t)npages * t / nthreads),
                                    .end = (uint32_t)((uint64_t)npages * (t + 1) / nthreads),
                                    .min_seq = UINT64_MAX};
    on_threads(scan_pages, jobs, sizeof jobs[0], nthreads);
    return nthreads;
}

/* ----------------------------------------------------------------- order */

/*
 * The scan jobs' heads, sorted by seq into one array, on a thread per job:
 * the seqs are cut into as many ranges as there are jobs, holding about as
 * many heads each (a histogram of SORT_BINS equal bins tells where to
 * cut); each job moves its heads to their ranges, then each range is
 * sorted on its own, a byte at a time from the least significant (LSD
 * radix). Bytes, not 16-bit digits: these scatter each pass over 65536
 * places, a TLB miss per head, and sorted at about half the speed
 * (docs/benchmarks-log.md, "Pool-file restarts rebuilt on every core").
 */
#define SORT_BINS 4096

struct order {
    struct scan_job *scans;
    uint32_t nscans;
    uint64_t min_seq, max_seq;
    uint64_t bin_width;
    uint64_t split[REATTACH_THREADS + 1];  /* range r: seqs [split[r], split[r + 1]) */
    uint32_t (*counts)[REATTACH_THREADS];   /* [scan][range] */
    uint32_t *bins;                         /* [scan][SORT_BINS] */
    uint64_t start[REATTACH_THREADS + 1];   /* where each range begins in out */
    struct found_head *out, *tmp;
};

struct order_job {
    struct order *o;
    uint32_t id;
};

static uint32_t bin_of(const struct order *o, uint64_t seq)
{
    return (uint32_t)GK_MIN((seq - o->min_seq) / o->bin_width, SORT_BINS - 1);
}

static uint32_t range_of(const struct order *o, uint64_t seq)
{
    uint32_t r = 0;
    while (r + 1 < o->nscans && seq >= o->split[r + 1])
        r++;
    return r;
}

static void *bin_heads(void *arg)
{
    struct order_job *j = arg;
    const struct scan_job *scan = &j->o->scans[j->id];
    uint32_t *bins = j->o->bins + (size_t)j->id * SORT_BINS;
    for (uint32_t i = 0; i < scan->n; i++)
        bins[bin_of(j->o, scan->heads[i].seq)]++;
    return NULL;
}

static void *count_heads(void *arg)
{
    struct order_job *j = arg;
    const struct scan_job *scan = &j->o->scans[j->id];
    for (uint32_t i = 0; i < scan->n; i++)
        j->o->counts[j->id][range_of(j->o, scan->heads[i].seq)]++;
    return NULL;
}

static void *move_heads(void *arg)
{
    struct order_job *j = arg;
    struct order *o = j->o;
    const struct scan_job *scan = &o->scans[j->id];
    uint64_t at[REATTACH_THREADS];
    for (uint32_t r = 0; r < o->nscans; r++) {
        at[r] = o->start[r];
        for (uint32_t k = 0; k < j->id; k++)
            at[r] += o->counts[k][r];
    }
    for (uint32_t i = 0; i < scan->n; i++)
        o->out[at[range_of(o, scan->heads[i].seq)]++] = scan->heads[i];
    return NULL;
}

static void *sort_range(void *arg)
{
    struct order_job *j = arg;
    struct order *o = j->o;
    uint64_t first = o->start[j->id], n = o->start[j->id + 1] - first;
    uint64_t base = o->split[j->id], top = o->split[j->id + 1] - base - 1;   /* largest key */
    struct found_head *src = o->out + first, *dst = o->tmp + first;
    for (unsigned shift = 0; shift < 64 && (top >> shift); shift += 8) {
        uint64_t count[256] = {0};
        for (uint64_t i = 0; i < n; i++)
            count[((src[i].seq - base) >> shift) & 0xff]++;
        for (uint64_t d = 0, total = 0; d < 256; d++) {
            uint64_t c = count[d];
            count[d] = total;
            total += c;
        }
        for (uint64_t i = 0; i < n; i++)
            dst[count[((src[i].seq - base) >> shift) & 0xff]++] = src[i];
        struct found_head *t = src;
        src = dst;
        dst = t;
    }
    if (src != o->out + first)
        memcpy(o->out + first, src, n * sizeof *src);
    return NULL;
}

/* Where to cut the seqs: at bin edges, about n / nscans heads apart. */
static void cut_ranges(struct order *o, uint64_t n)
{
    uint64_t seen = 0, end = o->max_seq + 1;
    uint32_t r = 1;
    o->split[0] = o->min_seq;
    for (uint32_t b = 0; b < SORT_BINS && r < o->nscans; b++) {
        for (uint32_t k = 0; k < o->nscans; k++)
            seen += o->bins[(size_t)k * SORT_BINS + b];
        uint64_t edge = GK_MIN(o->min_seq + (uint64_t)(b + 1) * o->bin_width, end);
        while (r < o->nscans && seen >= n * r / o->nscans)
            o->split[r++] = edge;
    }
    while (r <= o->nscans)
        o->split[r++] = end;
}

/* The heads of the scan jobs sorted by seq (their lists freed): NULL when
 * out of memory. */
static struct found_head *order_heads(struct store *s, struct scan_job *scans, uint32_t nscans,
                                      uint32_t *count, uint64_t *max_seq)
{
    struct order o = {.scans = scans, .nscans = nscans, .min_seq = UINT64_MAX};
    struct order_job jobs[REATTACH_THREADS];
    uint64_t n = 0;
    int failed = 0;
    for (uint32_t t = 0; t < nscans; t++) {
        n += scans[t].n;
        failed |= scans[t].failed;
        o.min_seq = GK_MIN(o.min_seq, scans[t].min_seq);
        o.max_seq = GK_MAX(o.max_seq, scans[t].max_seq);
        s->st.restore_dropped += scans[t].dropped;
        jobs[t] = (struct order_job){&o, t};
    }
    if (n == 0)
        o.min_seq = 0;
    o.bin_width = (o.max_seq - o.min_seq) / SORT_BINS + 1;
    o.out = failed || n > UINT32_MAX ? NULL : malloc((n ? n : 1) * sizeof *o.out);
    o.tmp = o.out ? malloc((n ? n : 1) * sizeof *o.tmp) : NULL;
    o.bins = o.tmp ? calloc((size_t)nscans * SORT_BINS, sizeof *o.bins) : NULL;
    o.counts = o.bins ? calloc(nscans, sizeof *o.counts) : NULL;
    if (o.counts) {
        on_threads(bin_heads, jobs, sizeof jobs[0], nscans);
        cut_ranges(&o, n);
        on_threads(count_heads, jobs, sizeof jobs[0], nscans);
        for (uint32_t r = 0; r < nscans; r++) {
            o.start[r + 1] = o.start[r];
            for (uint32_t k = 0; k < nscans; k++)
                o.start[r + 1] += o.counts[k][r];
        }
        on_threads(move_heads, jobs, sizeof jobs[0], nscans);
        on_threads(sort_range, jobs, sizeof jobs[0], nscans);
    } else {
        free(o.out);
        o.out = NULL;
    }
    for (uint32_t t = 0; t < nscans; t++)
        free(scans[t].heads);
    free(o.tmp);
    free(o.bins);
    free(o.counts);
    *count = (uint32_t)n;
    *max_seq = o.max_seq;
    return o.out;
}

/* --------------------------------------------------------------- rebuild */

/* A thread's objects of one namespace. */
struct ns_run {
    struct store_ns *ns;
    struct dlink objs;
    uint64_t objects, bytes;
};

/* One head's object, in commit order: NULL when dropped. */
struct made {
    struct store_obj *obj;
    uint32_t share;             /* of the index (index_share_of) */
};

struct rebuild {
    struct store *s;
    const struct found_head *heads;
    struct made *made;
    uint32_t n, nthreads;
    uint64_t first_ns_id;       /* namespaces created here have ids above it */
    pthread_mutex_t ns_lock;
};

struct rebuild_job {
    struct rebuild *r;
    uint32_t id;                /* also its share of the index */
    uint32_t first, end;        /* its run of heads */
    struct dlink lru;           /* the run's objects, newest at the head */
    struct ns_run **runs;       /* by namespace id - first_ns_id - 1 */
    uint32_t nruns;
    struct store_ns *last_ns;   /* heads come in runs of one namespace */
    uint32_t *losers;           /* made[] of second heads of a key */
    uint32_t nlosers, losers_cap;
    uint64_t made, bytes;
    int failed;                 /* out of memory */
};

static struct store_ns *namespace_of(struct rebuild_job *j, const struct gk_ns *name)
{
    struct store_ns *ns = j->last_ns;
    if (ns && ns->node.key_len == name->len && memcmp(ns->name, name->name, name->len) == 0)
        return ns;
    struct rebuild *r = j->r;
    pthread_mutex_lock(&r->ns_lock);
    ns = store_ns_find(r->s, name);
    if (!ns)
        ns = store_ns_create(r->s, name);
    pthread_mutex_unlock(&r->ns_lock);
    if (ns)
        j->last_ns = ns;
    return ns;
}

static struct ns_run *run_of(struct rebuild_job *j, struct store_ns *ns)
{
    uint64_t i = ns->id - j->r->first_ns_id - 1;
    if (i >= j->nruns) {
        uint32_t cap = j->nruns;
        if (gk_grow(&j->runs, &cap, (uint32_t)i + 1, sizeof *j->runs, 8) != 0)
            return NULL;
        memset(j->runs + j->nruns, 0, (cap - j->nruns) * sizeof *j->runs);
        j->nruns = cap;
    }
    if (!j->runs[i] && (j->runs[i] = calloc(1, sizeof *j->runs[i])) != NULL) {
        j->runs[i]->ns = ns;
        dlink_init(&j->runs[i]->objs);
    }
    return j->runs[i];
}

/* Gives back the chunks o claimed, and o. */
static void unmake(struct store *s, struct store_obj *o)
{
    for (uint32_t i = 0; i < o->nchunks; i++)
        alloc_restore_unclaim(&s->alloc, o->chunks[i].off - store_chunk_hdr(s, o, i));
    free(o);
}

/* The committed object whose head is at off, its chunks claimed; NULL,
 * with nothing kept, when any part of it does not hold together: a state
 * no server leaves, so some bytes are not what they seem. */
static struct store_obj *make_object(struct rebuild_job *j, uint64_t off)
{
    struct store *s = j->r->s;
    struct persist_head h;
    persist_head_at(s->pool.base, off, &h);
    struct gk_entry e = {.key = h.key, .key_len = h.key_len, .size = h.size};
    struct gk_ns name = {.name = h.ns, .len = h.ns_len};
    uint32_t head_len;

    if (!store_key_ok(&e) || !store_ns_name_ok(&name) || h.size > GK_MAX_OBJECT ||
        store_obj_cut(s, h.ns_len, &e, &head_len) != h.npieces || head_len != h.head_len)
        return NULL;
    struct store_ns *ns = namespace_of(j, &name);
    struct store_obj *o =
        ns ? store_obj_new(s, ns, &e, h.npieces, head_len,
                           index_key_hash(&s->objects, e.key, e.key_len), NULL)
           : NULL;
    int ok = o != NULL;
    for (uint32_t i = 0; ok && i < h.npieces; i++) {
        uint64_t raw = i ? gk_load64(h.piece_offs + 8ull * (i - 1)) : off;
        uint32_t hdr = store_chunk_hdr(s, o, i);
        uint64_t len = alloc_piece_len(h.size, head_len, s->piece_hdr, i);
        ok = alloc_restore_claim(&s->alloc, raw, hdr + len) == 0;
        if (ok)
            o->chunks[o->nchunks++] = (struct store_chunk){raw + hdr, len};
        ok = ok && (i == 0 || persist_piece_ok(s->pool.base, raw, off, i));
    }
    if (!ok && o)
        unmake(s, o);
    return ok ? o : NULL;
}

static void *make_run(void *arg)
{
    struct rebuild_job *j = arg;
    struct rebuild *r = j->r;
    for (uint32_t i = j->first; i < j->end && !j->failed; i++) {
        struct store_obj *o = make_object(j, r->heads[i].off);
        r->made[i] = (struct made){o, 0};
        if (!o)
            continue;
        struct ns_run *run = run_of(j, o->ns);
        if (!run) {
            unmake(r->s, o);
            r->made[i].obj = NULL;
            j->failed = 1;
            break;
        }
        o->state = OBJ_COMMITTED;
        o->unverified = 1;
        dlink_push_head(&j->lru, &o->lru);
        dlink_push_head(&run->objs, &o->ns_link);
        run->objects++;
        run->bytes += o->size;
        j->made++;
        j->bytes += o->size;
        r->made[i].share = index_share_of(&r->s->objects, o->node.hash, r->nthreads);
    }
    return NULL;
}

static void *index_share(void *arg)
{
    struct rebuild_job *j = arg;
    struct rebuild *r = j->r;
    struct index *ix = &r->s->objects;
    for (uint32_t i = 0; i < r->n; i++) {
        struct store_obj *o = r->made[i].obj;
        if (!o || r->made[i].share != j->id)
            continue;
        if (!index_find(ix, o->node.hash, o->node.ns_id, o->node.key, o->node.key_len)) {
            index_insert_in_share(ix, &o->node);
        } else if (gk_grow(&j->losers, &j->losers_cap, j->nlosers + 1, sizeof *j->losers,
                           64) == 0) {
            j->losers[j->nlosers++] = i;
        } else {
            j->failed = 1;
            return NULL;
        }
    }
    return NULL;
}

static struct rebuild_job *job_of(struct rebuild_job *jobs, uint32_t n, uint32_t i)
{
    uint32_t t = 0;
    while (t + 1 < n && i >= jobs[t].end)
        t++;
    return &jobs[t];
}

/* Takes out the second heads of a key the indexing found (a state no
 * server leaves: seen only in damaged files, so one at a time). */
static void drop_losers(struct rebuild *r, struct rebuild_job *jobs)
{
    for (uint32_t t = 0; t < r->nthreads; t++) {
        for (uint32_t k = 0; k < jobs[t].nlosers; k++) {
            uint32_t i = jobs[t].losers[k];
            struct store_obj *o = r->made[i].obj;
            struct rebuild_job *maker = job_of(jobs, r->nthreads, i);
            struct ns_run *run = maker->runs[o->ns->id - r->first_ns_id - 1];
            dlink_remove(&o->lru);
            dlink_remove(&o->ns_link);
            run->objects--;
            run->bytes -= o->size;
            maker->made--;
            maker->bytes -= o->size;
            r->made[i].obj = NULL;
            unmake(r->s, o);
        }
    }
}

/* The runs into the store, oldest first, so that the newest are at the
 * heads of the LRU and of each namespace's list. */
static void splice_runs(struct rebuild *r, struct rebuild_job *jobs)
{
    struct store *s = r->s;
    for (uint32_t t = 0; t < r->nthreads; t++) {
        struct rebuild_job *j = &jobs[t];
        dlink_splice_head(&s->lru, &j->lru);
        for (uint32_t k = 0; k < j->nruns; k++) {
            struct ns_run *run = j->runs[k];
            if (!run)
                continue;
            dlink_splice_head(&run->ns->objs, &run->objs);
            run->ns->objects += run->objects;
            run->ns->bytes += run->bytes;
        }
        s->st.objects += j->made;
        s->st.object_bytes += j->bytes;
        s->st.restored_objects += j->made;
    }
    s->restored_unverified = s->st.restored_objects > 0;
    /* A namespace whose every object was dropped goes: namespaces live
     * exactly as long as they have objects. */
    for (struct dlink *l = s->ns_list.next, *next; l != &s->ns_list; l = next) {
        next = l->next;
        store_ns_drop_if_empty(s, CONTAINER_OF(l, struct store_ns, all));
    }
}

static int any_failed(const struct rebuild_job *jobs, uint32_t n)
{
    int failed = 0;
    for (uint32_t t = 0; t < n; t++)
        failed |= jobs[t].failed;
    return failed;
}

/* Makes, indexes and links the objects of heads[0..n), in commit order. */
static int rebuild(struct store *s, const struct found_head *heads, uint32_t n,
                   uint64_t *made_ns)
{
    struct rebuild r = {.s = s, .heads = heads, .n = n,
                        .nthreads = threads_for(n, REBUILD_HEADS_PER_THREAD),
                        .first_ns_id = s->last_ns_id};
    struct rebuild_job *jobs = calloc(r.nthreads, sizeof *jobs);
    r.made = calloc(n ? n : 1, sizeof *r.made);
    int failed = !jobs || !r.made;
    pthread_mutex_init(&r.ns_lock, NULL);
    for (uint32_t t = 0; !failed && t < r.nthreads; t++) {
        jobs[t] = (struct rebuild_job){.r = &r, .id = t,
                                       .first = (uint32_t)((uint64_t)n * t / r.nthreads),
                                       .end = (uint32_t)((uint64_t)n * (t + 1) / r.nthreads)};
        dlink_init(&jobs[t].lru);
    }
    if (!failed) {
        on_threads(make_run, jobs, sizeof *jobs, r.nthreads);
        *made_ns = gk_now_ns();
        failed = any_failed(jobs, r.nthreads);
    }
    if (!failed) {
        on_threads(index_share, jobs, sizeof *jobs, r.nthreads);
        failed = any_failed(jobs, r.nthreads);
    }
    if (!failed) {
        drop_losers(&r, jobs);
        uint64_t kept = 0;
        for (uint32_t t = 0; t < r.nthreads; t++)
            kept += jobs[t].made;
        index_add_count(&s->objects, kept);
        splice_runs(&r, jobs);
        s->st.restore_dropped += n - kept;
    } else if (r.made) {
        /* Out of memory: the store will not open; its chunks go with it. */
        for (uint32_t i = 0; i < n; i++)
            if (r.made[i].obj)
                unmake(s, r.made[i].obj);
    }
    for (uint32_t t = 0; jobs && t < r.nthreads; t++) {
        for (uint32_t k = 0; k < jobs[t].nruns; k++)
            free(jobs[t].runs[k]);
        free(jobs[t].runs);
        free(jobs[t].losers);
    }
    pthread_mutex_destroy(&r.ns_lock);
    free(jobs);
    free(r.made);
    return failed ? -1 : 0;
}

/* Rebuilds index, allocator and LRU from the pool file's heads. */
static int restore_objects(struct store *s)
{
    uint64_t start = gk_now_ns(), max_seq;
    uint32_t n;
    struct scan_job scans[REATTACH_THREADS] = {{0}};
    uint32_t nscans = find_heads(s, scans);
    uint64_t found = gk_now_ns();
    struct found_head *heads = order_heads(s, scans, nscans, &n, &max_seq);
    if (!heads)
        return -1;
    uint64_t sorted = gk_now_ns();
    /* Sized for every object at once: no growth on the way. */
    index_destroy(&s->objects);
    if (index_init(&s->objects, n) != 0) {
        free(heads);
        return -1;
    }
    alloc_restore_begin(&s->alloc);
    uint64_t made = 0;
    int rc = rebuild(s, heads, n, &made);
    free(heads);
    if (rc != 0)
        return -1;
    alloc_restore_done(&s->alloc);
    s->commit_seq = max_seq;
    uint64_t end = gk_now_ns();
    GK_INFO("pool: re-attached %llu objects (%llu MiB) in %llu ms (find %llu, order %llu, "
            "objects %llu, index %llu); %llu heads dropped (writes cut short)",
            (unsigned long long)s->st.restored_objects,
            (unsigned long long)(s->st.object_bytes >> 20),
            (unsigned long long)((end - start) / 1000000),
            (unsigned long long)((found - start) / 1000000),
            (unsigned long long)((sorted - found) / 1000000),
            (unsigned long long)((made - sorted) / 1000000),
            (unsigned long long)((end - made) / 1000000),
            (unsigned long long)s->st.restore_dropped);
    return 0;
}

int store_attach_pool_file(struct store *s, const char *path, char *err, size_t errlen)
{
    uint64_t capacity = alloc_capacity(&s->alloc);
    uint8_t *meta = s->pool.base + persist_meta_off(capacity);
    char why[200];

    if (!s->pool.fresh && persist_check(meta, capacity, &s->alloc, why, sizeof why) != 0) {
        snprintf(err, errlen, "the pool file %s: %s: start with the memory it was made with, "
                 "or reset it", path, why);
        return -1;
    }
    if (s->pool.fresh)
        persist_format(meta, capacity, &s->alloc);
    s->alloc.page_tags = persist_page_table(meta);
    s->alloc.pool = s->pool.base;
    s->piece_hdr = PERSIST_PIECE_HDR;
    s->st.pool_file = 1;
    if (!s->pool.fresh && restore_objects(s) != 0) {
        snprintf(err, errlen, "out of memory re-attaching the objects of the pool file %s", path);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ restored values */

/* Restored values. A restart trusts a pool file's heads (their own
 * checksums), not its value bytes: whoever can write the file while no
 * server runs can change them. So a restored object is served only once
 * its value matches the checksum its head was sealed with at COMMIT, on
 * its first read, by the reader's thread, outside the lock (it is pinned):
 * the restart costs nothing more, and each restored object one checksum
 * pass, once. One that does not match is dropped, and its read is a miss. */
int store_drop_if_changed(struct store *s, struct store_obj *o, int reading)
{
    if (store_value_sum(s, o) == persist_value_sum(s->pool.base, store_obj_head_off(o))) {
        __atomic_store_n(&o->unverified, 0, __ATOMIC_RELAXED);
        return 0;
    }
    store_lock(s);
    if (o->state == OBJ_COMMITTED) {    /* not dropped by another reader meanwhile */
        GK_WARN("a restored object's value (%llu bytes) does not match its checksum: dropped",
                (unsigned long long)o->size);
        s->st.restore_bad_values++;
        do_obj_unlink_dropping_ns(s, o);
    }
    do_obj_unpin(s, o);
    if (reading) {
        s->st.hits--;
        s->st.misses++;
    }
    store_unlock(s);
    return 1;
}

void store_verify_restored(struct store *s, struct store_obj **objs, uint32_t n,
                           int32_t *status, uint64_t *sizes)
{
    for (uint32_t i = 0; i < n; i++) {
        if (objs[i] && __atomic_load_n(&objs[i]->unverified, __ATOMIC_RELAXED) &&
            store_drop_if_changed(s, objs[i], 1)) {
            objs[i] = NULL;
            status[i] = GDRKV_E_NOT_FOUND;
            sizes[i] = 0;
        }
    }
}
