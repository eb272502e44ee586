/*
 * disk.c - see disk.h.
 *
 * In memory: an index (index.h) from (namespace, key) to the entry of the
 * record's latest copy, and per region its state, fill, readers and the
 * list of its entries (dropped from the index when the region is evicted).
 * One writer at a time (write_lock): a batch of records is packed into an
 * aligned buffer and written to the open region of the next file in turn
 * with one pwrite, then indexed. Readers and deleters hold the region they
 * touch (readers > 0) so it is not evicted and rewritten under them.
 *
 * Locking: `lock` covers the index, regions and counters, never I/O;
 * `write_lock` serializes the writer; a file's `rmw_lock` serializes the
 * read-modify-writes of dead words (two records may share a block).
 */
#include "disk.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "common/files.h"
#include "common/grow.h"
#include "common/log.h"
#include "disk_format.h"
#include "gdrkv.h"
#include "index.h"
#include "uring.h"

#define DISK_FILE_NAME "gdrkv.disk"
#define DISK_MIN_REGIONS 2
#define DISK_INDEX_BUCKETS 4096
/* The window a restart reads record headers through. */
#define DISK_SCAN_WINDOW (1u << 20)
/* A failing disk fails every write and read: one log line per kind of
 * failure per this, with the count of the others (log.h). */
#define DISK_WARN_INTERVAL_MS 10000

enum region_state { REGION_FREE, REGION_OPEN, REGION_SEALED };

struct disk_entry {
    struct index_node node;         /* node.key points into bytes */
    struct disk_entry *prev, *next; /* the region's entries */
    uint32_t file, region;
    uint64_t off, len, seq, size;
    uint32_t ns_len;
    uint8_t bytes[];                /* namespace, then key */
};

struct disk_region {
    enum region_state state;
    uint64_t fill;                  /* bytes written from the region's start (whole blocks) */
    uint64_t last_used;             /* the tier's clock at the last read or write */
    uint32_t readers;               /* held by disk_lookup or a dead-word write */
    int writing;                    /* a batch is being written into it */
    struct disk_entry *entries;
};

struct disk_file {
    int fd;
    int direct;                     /* O_DIRECT */
    char path[PATH_MAX];
    uint64_t nregions;
    struct disk_region *regions;
    int64_t open_region;            /* -1: none */
    pthread_mutex_t rmw_lock;
};

/* Records to mark dead in their files; their regions are held so that
 * nothing is written over them first. */
struct dead_list {
    struct disk_loc *locs;
    uint32_t n, cap;
};

struct disk_tier {
    pthread_mutex_t lock;
    pthread_mutex_t write_lock;
    struct index ix;
    struct disk_file *files;
    uint32_t nfiles;
    uint32_t next_file;
    uint64_t seq;                   /* last record seq handed out */
    uint64_t clock;                 /* LRU stamps */
    uint64_t ns_seed;
    uint8_t *write_buf;             /* DISK_REGION_BYTES, aligned: the writer's */
    struct store_disk_stats stats;
    struct dead_list dead;          /* deleted, not yet marked in their files (disk_bury) */
    struct gk_log_rate write_warn, read_warn, dead_warn;
};

static uint64_t region_off(uint64_t region) { return DISK_SUPER_BYTES + region * DISK_REGION_BYTES; }

static uint64_t ns_id(const struct disk_tier *d, const uint8_t *ns, uint32_t len)
{
    return gk_hash64(ns, len, d->ns_seed);
}

static void *aligned_alloc_block(size_t len)
{
    void *p = NULL;
    return posix_memalign(&p, DISK_BLOCK, disk_round_up(len ? len : 1, DISK_BLOCK)) == 0 ? p
                                                                                        : NULL;
}

/* ------------------------------------------------------------ I/O */

static int full_pread(int fd, uint8_t *buf, uint64_t len, uint64_t off)
{
    while (len > 0) {
        ssize_t n = pread(fd, buf, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n == 0 ? -EIO : -errno;
        buf += n, len -= (uint64_t)n, off += (uint64_t)n;
    }
    return 0;
}

static int full_pwrite(int fd, const uint8_t *buf, uint64_t len, uint64_t off)
{
    while (len > 0) {
        ssize_t n = pwrite(fd, buf, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n == 0 ? -ENOSPC : -errno;
        buf += n, len -= (uint64_t)n, off += (uint64_t)n;
    }
    return 0;
}

/* ------------------------------------------------------------ index */

static struct disk_entry *find(struct disk_tier *d, const uint8_t *ns, uint32_t ns_len,
                               const uint8_t *key, uint32_t key_len)
{
    uint64_t id = ns_id(d, ns, ns_len);
    struct index_node *n = index_find(&d->ix, index_hash(&d->ix, id, key, key_len), id, key,
                                      key_len);
    if (!n)
        return NULL;
    struct disk_entry *e = (struct disk_entry *)((char *)n - offsetof(struct disk_entry, node));
    /* Namespaces are told apart by a 64-bit hash of their names: check. */
    return e->ns_len == ns_len && memcmp(e->bytes, ns, ns_len) == 0 ? e : NULL;
}

static void unlink_entry(struct disk_tier *d, struct disk_entry *e)
{
    struct disk_region *r = &d->files[e->file].regions[e->region];
    index_remove(&d->ix, &e->node);
    if (e->prev)
        e->prev->next = e->next;
    else
        r->entries = e->next;
    if (e->next)
        e->next->prev = e->prev;
    d->stats.disk_objects--;
    d->stats.disk_object_bytes -= e->size;
}

static void drop_entry(struct disk_tier *d, struct disk_entry *e)
{
    unlink_entry(d, e);
    free(e);
}

/* Indexes a record, superseding an older entry of its key. */
static void add_entry(struct disk_tier *d, struct disk_entry *e)
{
    const uint8_t *ns = e->bytes, *key = e->bytes + e->ns_len;
    uint32_t key_len = e->node.key_len;
    struct disk_entry *old = find(d, ns, e->ns_len, key, key_len);
    if (old)
        drop_entry(d, old);
    e->node.ns_id = ns_id(d, ns, e->ns_len);
    e->node.key = key;
    e->node.hash = index_hash(&d->ix, e->node.ns_id, key, key_len);
    index_insert(&d->ix, &e->node);
    struct disk_region *r = &d->files[e->file].regions[e->region];
    e->prev = NULL;
    e->next = r->entries;
    if (r->entries)
        r->entries->prev = e;
    r->entries = e;
    d->stats.disk_objects++;
    d->stats.disk_object_bytes += e->size;
}

static struct disk_entry *new_entry(uint32_t file, uint32_t region, uint64_t off, uint64_t len,
                                    uint64_t seq, uint64_t size, const uint8_t *ns,
                                    uint32_t ns_len, const uint8_t *key, uint32_t key_len)
{
    struct disk_entry *e = malloc(sizeof *e + ns_len + key_len);
    if (!e)
        return NULL;
    memset(e, 0, sizeof *e);
    e->file = file, e->region = region;
    e->off = off, e->len = len, e->seq = seq, e->size = size;
    e->ns_len = ns_len;
    e->node.key_len = key_len;
    memcpy(e->bytes, ns, ns_len);
    memcpy(e->bytes + ns_len, key, key_len);
    return e;
}

/* ------------------------------------------------------------ regions */

static void evict_region(struct disk_tier *d, struct disk_region *r)
{
    while (r->entries) {
        d->stats.disk_evicted_objects++;
        drop_entry(d, r->entries);
    }
    d->stats.disk_used_bytes -= r->fill;
    d->stats.disk_evicted_regions++;
    r->state = REGION_FREE;
    r->fill = 0;
}

/* The file's open region, opening one when there is none: a free region,
 * else a sealed one nobody holds, evicted: one without live records if
 * there is one, else the least recently used. NULL when every region is
 * held. Under lock. */
static struct disk_region *open_region(struct disk_tier *d, struct disk_file *f)
{
    if (f->open_region >= 0)
        return &f->regions[f->open_region];
    struct disk_region *victim = NULL;
    int64_t pick = -1;
    for (uint64_t i = 0; i < f->nregions; i++) {
        struct disk_region *r = &f->regions[i];
        if (r->state == REGION_FREE) {
            pick = (int64_t)i;
            victim = NULL;
            break;
        }
        /* A region whose records were all deleted or superseded goes
         * first: evicting it loses nothing. */
        if (r->state == REGION_SEALED && !r->readers && !r->writing &&
            (!victim || (!r->entries && victim->entries) ||
             (!r->entries == !victim->entries && r->last_used < victim->last_used))) {
            victim = r;
            pick = (int64_t)i;
        }
    }
    if (pick < 0)
        return NULL;
    if (victim)
        evict_region(d, victim);
    f->open_region = pick;
    f->regions[pick].state = REGION_OPEN;
    f->regions[pick].last_used = ++d->clock;
    return &f->regions[pick];
}

static void seal_region(struct disk_file *f, struct disk_region *r)
{
    r->state = REGION_SEALED;
    f->open_region = -1;
}

/* ------------------------------------------------------------ writes */

static void copy_value(uint8_t *dst, const struct disk_item *it)
{
    for (uint32_t k = 0; k < it->iovcnt; k++) {
        memcpy(dst, it->iov[k].iov_base, it->iov[k].iov_len);
        dst += it->iov[k].iov_len;
    }
}

static uint64_t item_record_len(const struct disk_item *it)
{
    return disk_record_len(disk_record_hdr_len(it->ns_len, it->key_len), it->size);
}

/* Packs items[first..] into the write buffer as records from file offset
 * base, while they fit in room bytes; returns how many it packed and sets
 * *len to the bytes to write (whole blocks) and seqs[]. */
static uint32_t pack(struct disk_tier *d, const struct disk_item *items, uint32_t first,
                     uint32_t n, uint64_t base, uint64_t room, uint64_t *len, uint64_t *seqs,
                     uint64_t *offs)
{
    uint64_t pos = 0;
    uint32_t i = first;
    for (; i < n; i++) {
        const struct disk_item *it = &items[i];
        uint32_t hdr_len = disk_record_hdr_len(it->ns_len, it->key_len);
        uint64_t rec_len = item_record_len(it);
        if (pos + rec_len > room)
            break;
        uint8_t *rec = d->write_buf + pos;
        copy_value(rec + hdr_len, it);
        memset(rec + hdr_len + it->size, 0, rec_len - hdr_len - it->size);
        pthread_mutex_lock(&d->lock);
        uint64_t seq = ++d->seq;
        pthread_mutex_unlock(&d->lock);
        disk_record_write(rec, base + pos, seq, it->ns, it->ns_len, it->key, it->key_len,
                          it->size, gk_checksum64(rec + hdr_len, it->size, seq));
        seqs[i - first] = seq;
        offs[i - first] = base + pos;
        pos += rec_len;
    }
    uint64_t padded = disk_round_up(pos, DISK_BLOCK);
    memset(d->write_buf + pos, 0, padded - pos);
    *len = padded;
    return i - first;
}

void disk_put_batch(struct disk_tier *d, const struct disk_item *items, uint32_t n,
                    int32_t *status)
{
    uint64_t *seqs = malloc(2 * (n ? n : 1) * sizeof *seqs);
    if (!seqs) {
        for (uint32_t i = 0; i < n; i++)
            status[i] = GDRKV_E_INTERNAL;
        return;
    }
    uint64_t *offs = seqs + n;
    pthread_mutex_lock(&d->write_lock);
    for (uint32_t i = 0; i < n;) {
        const struct disk_item *it = &items[i];
        if (it->size > disk_max_value(d)) {
            status[i++] = GDRKV_E_TOO_LARGE;
            continue;
        }
        pthread_mutex_lock(&d->lock);
        uint32_t fi = d->next_file;
        struct disk_file *f = &d->files[fi];
        struct disk_region *r = open_region(d, f);
        if (!r) {
            pthread_mutex_unlock(&d->lock);
            status[i++] = GDRKV_E_NO_SPACE;
            continue;
        }
        uint32_t ri = (uint32_t)(r - f->regions);
        r->writing = 1;
        uint64_t base = region_off(ri) + r->fill;
        uint64_t room = DISK_REGION_BYTES - r->fill;
        pthread_mutex_unlock(&d->lock);

        uint64_t len;
        uint32_t packed = pack(d, items, i, n, base, room, &len, seqs, offs);
        uint64_t start = gk_now_ns();
        int rc = packed ? full_pwrite(f->fd, d->write_buf, len, base) : 0;

        pthread_mutex_lock(&d->lock);
        r->writing = 0;
        d->stats.disk_write_ns += gk_now_ns() - start;
        if (rc == 0) {
            r->fill += len;
            r->last_used = ++d->clock;
            d->stats.disk_used_bytes += len;
        } else {
            d->stats.disk_errors++;
        }
        for (uint32_t k = 0; k < packed; k++) {
            const struct disk_item *p = &items[i + k];
            struct disk_entry *e =
                rc ? NULL
                   : new_entry(fi, ri, offs[k], item_record_len(p), seqs[k], p->size, p->ns,
                               p->ns_len, p->key, p->key_len);
            status[i + k] = e ? 0 : GDRKV_E_INTERNAL;
            if (e) {
                add_entry(d, e);
                d->stats.disk_writes++;
                d->stats.disk_written_bytes += p->size;
            }
        }
        /* The next item does not fit what is left: the next batch opens
         * another region. A failed write leaves the region open at its
         * fill, to be written over by the next batch: sealing it would
         * evict another region per failure, live records and all, and a
         * restart's scan stops at what the failed write left (its seqs are
         * older than the next batch's). */
        if (!rc && (i + packed < n || r->fill + DISK_BLOCK > DISK_REGION_BYTES))
            seal_region(f, r);
        d->next_file = (fi + 1) % d->nfiles;
        pthread_mutex_unlock(&d->lock);
        i += packed;
        if (rc) {
            gk_log_rated(&d->write_warn, GK_LOG_WARN, "disk: writing %u objects to %s "
                         "failed: %s", packed, f->path, strerror(-rc));
            /* The disk just failed: the rest of the batch is not tried
             * (the demoter backs off, tiering.c). */
            for (; i < n; i++)
                status[i] = GDRKV_E_INTERNAL;
        }
    }
    pthread_mutex_unlock(&d->write_lock);
    free(seqs);
}

/* ------------------------------------------------------------ reads */

int disk_contains(struct disk_tier *d, const uint8_t *ns, uint32_t ns_len, const uint8_t *key,
                  uint32_t key_len, uint64_t *size)
{
    pthread_mutex_lock(&d->lock);
    struct disk_entry *e = find(d, ns, ns_len, key, key_len);
    if (e)
        *size = e->size;
    pthread_mutex_unlock(&d->lock);
    return e != NULL;
}

int disk_lookup(struct disk_tier *d, const uint8_t *ns, uint32_t ns_len, const uint8_t *key,
                uint32_t key_len, struct disk_loc *loc)
{
    pthread_mutex_lock(&d->lock);
    struct disk_entry *e = find(d, ns, ns_len, key, key_len);
    if (e) {
        struct disk_region *r = &d->files[e->file].regions[e->region];
        r->readers++;
        r->last_used = ++d->clock;
        *loc = (struct disk_loc){.file = e->file, .region = e->region, .off = e->off,
                                 .len = e->len, .seq = e->seq, .size = e->size};
    }
    pthread_mutex_unlock(&d->lock);
    return e ? 0 : GDRKV_E_NOT_FOUND;
}

void disk_release(struct disk_tier *d, const struct disk_loc *loc)
{
    pthread_mutex_lock(&d->lock);
    d->files[loc->file].regions[loc->region].readers--;
    pthread_mutex_unlock(&d->lock);
}

/* A record that can't be read back is a miss now and later: out of the
 * index, if the index still points at it. */
static void forget(struct disk_tier *d, const struct disk_loc *loc, const uint8_t *ns,
                   uint32_t ns_len, const uint8_t *key, uint32_t key_len, int bad_bytes)
{
    pthread_mutex_lock(&d->lock);
    struct disk_entry *e = find(d, ns, ns_len, key, key_len);
    if (e && e->seq == loc->seq)
        drop_entry(d, e);
    if (bad_bytes)
        d->stats.disk_bad_records++;
    else
        d->stats.disk_errors++;
    pthread_mutex_unlock(&d->lock);
}

/* Where a record's read goes: its blocks, into an aligned buffer. */
struct read_span {
    uint64_t start, len;
    uint8_t *buf;
};

static int span_of(const struct disk_loc *loc, struct read_span *sp)
{
    sp->start = loc->off / DISK_BLOCK * DISK_BLOCK;
    sp->len = disk_round_up(loc->off + loc->len, DISK_BLOCK) - sp->start;
    sp->buf = aligned_alloc_block(sp->len);
    return sp->buf ? 0 : -1;
}

/* Checks a record read back (rc: 0, or the read's -errno; ringed: through
 * io_uring) against what the index says, and copies its value into dst:
 * 0 or GDRKV_E_NOT_FOUND. */
static int finish_read(struct disk_tier *d, const struct disk_read_req *q,
                       const struct read_span *sp, int rc, uint64_t took, int ringed)
{
    const struct disk_loc *loc = q->loc;
    struct disk_file *f = &d->files[loc->file];
    struct disk_record r;
    const uint8_t *rec = sp->buf + (loc->off - sp->start);
    int parsed = rc == 0 && disk_record_parse(rec, loc->len, loc->off, loc->len, &r);
    if (parsed && r.dead)               /* deleted since the lookup */
        return GDRKV_E_NOT_FOUND;
    int bad = rc == 0 &&
              (!parsed || r.seq != loc->seq || r.size != loc->size || r.ns_len != q->ns_len ||
               r.key_len != q->key_len || memcmp(r.ns, q->ns, q->ns_len) != 0 ||
               memcmp(r.key, q->key, q->key_len) != 0 ||
               gk_checksum64(rec + r.hdr_len, r.size, r.seq) != r.value_sum);
    if (rc || bad) {
        if (rc)
            gk_log_rated(&d->read_warn, GK_LOG_WARN,
                         "disk: reading %" PRIu64 " bytes of %s failed: %s", sp->len, f->path,
                         strerror(-rc));
        forget(d, loc, q->ns, q->ns_len, q->key, q->key_len, bad);
        return GDRKV_E_NOT_FOUND;
    }
    const uint8_t *value = rec + r.hdr_len;
    uint64_t left = r.size;
    for (uint32_t k = 0; k < q->dstcnt && left; k++) {
        uint64_t n = GK_MIN(left, (uint64_t)q->dst[k].iov_len);
        memcpy(q->dst[k].iov_base, value, n);
        value += n, left -= n;
    }
    pthread_mutex_lock(&d->lock);
    d->stats.disk_reads++;
    d->stats.disk_read_bytes += loc->size;
    d->stats.disk_read_ns += took;
    d->stats.disk_uring_reads += ringed != 0;
    pthread_mutex_unlock(&d->lock);
    return left ? GDRKV_E_NOT_FOUND : 0;
}

void disk_read_batch(struct disk_tier *d, const struct disk_read_req *reqs, uint32_t n,
                     int32_t *status)
{
    struct read_span *sp = calloc(n ? n : 1, sizeof *sp);
    struct uring_read *rd = calloc(n ? n : 1, sizeof *rd);
    int64_t *res = calloc(n ? n : 1, sizeof *res);
    uint32_t k = 0;                     /* reads issued, in request order */
    uint32_t *which = calloc(n ? n : 1, sizeof *which);
    for (uint32_t i = 0; i < n; i++) {
        status[i] = GDRKV_E_NOT_FOUND;  /* out of memory: a miss */
        if (!sp || !rd || !res || !which || span_of(reqs[i].loc, &sp[i]) != 0)
            continue;
        rd[k] = (struct uring_read){.fd = d->files[reqs[i].loc->file].fd, .buf = sp[i].buf,
                                    .len = (uint32_t)sp[i].len, .off = sp[i].start};
        which[k++] = i;
    }
    uint64_t t0 = gk_now_ns();
    int ringed = k && uring_read_all(rd, k, res);
    /* Reads side by side: each waited for about the whole batch. */
    uint64_t took = gk_now_ns() - t0;
    for (uint32_t j = 0; j < k; j++) {
        uint32_t i = which[j];
        int rc = res[j] < 0 ? (int)res[j] : 0;
        if (rc == 0 && (uint64_t)res[j] < sp[i].len)     /* short: read the rest */
            rc = full_pread(rd[j].fd, sp[i].buf + res[j], sp[i].len - (uint64_t)res[j],
                            sp[i].start + (uint64_t)res[j]);
        status[i] = finish_read(d, &reqs[i], &sp[i], rc, took, ringed);
    }
    for (uint32_t i = 0; sp && i < n; i++)
        free(sp[i].buf);
    free(sp);
    free(rd);
    free(res);
    free(which);
}

int disk_read(struct disk_tier *d, const struct disk_loc *loc, const uint8_t *ns,
              uint32_t ns_len, const uint8_t *key, uint32_t key_len, const struct iovec *dst,
              uint32_t dstcnt)
{
    struct disk_read_req q = {.loc = loc, .ns = ns, .ns_len = ns_len, .key = key,
                              .key_len = key_len, .dst = dst, .dstcnt = dstcnt};
    int32_t status;
    disk_read_batch(d, &q, 1, &status);
    return status;
}

/* ------------------------------------------------------------ deletes */

/* Sets the dead word of the record at off (its region held). */
static int mark_dead(struct disk_tier *d, struct disk_file *f, uint64_t off)
{
    uint64_t at = off + DISK_DEAD_OFF;
    uint64_t block = at / DISK_BLOCK * DISK_BLOCK;
    uint8_t *buf = aligned_alloc_block(DISK_BLOCK);
    if (!buf)
        return -ENOMEM;
    pthread_mutex_lock(&f->rmw_lock);
    int rc = full_pread(f->fd, buf, DISK_BLOCK, block);
    if (rc == 0) {
        gk_store64(buf + (at - block), 1);
        rc = full_pwrite(f->fd, buf, DISK_BLOCK, block);
    }
    pthread_mutex_unlock(&f->rmw_lock);
    free(buf);
    if (rc) {
        pthread_mutex_lock(&d->lock);
        d->stats.disk_errors++;
        pthread_mutex_unlock(&d->lock);
        gk_log_rated(&d->dead_warn, GK_LOG_WARN, "disk: marking a deleted record in %s "
                     "failed: %s (a restart may find it again)", f->path, strerror(-rc));
    }
    return rc;
}

static int hold_for_death(struct disk_tier *d, struct disk_entry *e)
{
    struct dead_list *l = &d->dead;
    if (gk_grow(&l->locs, &l->cap, l->n + 1, sizeof *l->locs, 16) != 0)
        return -1;
    d->files[e->file].regions[e->region].readers++;
    l->locs[l->n++] = (struct disk_loc){.file = e->file, .region = e->region, .off = e->off};
    drop_entry(d, e);
    return 0;
}

uint32_t disk_bury(struct disk_tier *d)
{
    pthread_mutex_lock(&d->lock);
    struct dead_list l = d->dead;
    d->dead = (struct dead_list){0};
    pthread_mutex_unlock(&d->lock);
    for (uint32_t i = 0; i < l.n; i++) {
        mark_dead(d, &d->files[l.locs[i].file], l.locs[i].off);
        disk_release(d, &l.locs[i]);
    }
    free(l.locs);
    return l.n;
}

int disk_delete(struct disk_tier *d, const uint8_t *ns, uint32_t ns_len, const uint8_t *key,
                uint32_t key_len)
{
    pthread_mutex_lock(&d->lock);
    struct disk_entry *e = find(d, ns, ns_len, key, key_len);
    int rc = e ? 0 : GDRKV_E_NOT_FOUND;
    if (e && hold_for_death(d, e) != 0)
        drop_entry(d, e);   /* out of memory: gone now, maybe back after a restart */
    pthread_mutex_unlock(&d->lock);
    return rc;
}

uint64_t disk_clear_ns(struct disk_tier *d, const uint8_t *ns, uint32_t ns_len)
{
    uint64_t removed = 0;
    pthread_mutex_lock(&d->lock);
    for (uint32_t fi = 0; fi < d->nfiles; fi++) {
        struct disk_file *f = &d->files[fi];
        for (uint64_t ri = 0; ri < f->nregions; ri++) {
            struct disk_entry *e = f->regions[ri].entries, *next;
            for (; e; e = next) {
                next = e->next;
                if (e->ns_len != ns_len || memcmp(e->bytes, ns, ns_len) != 0)
                    continue;
                removed++;
                if (hold_for_death(d, e) != 0)
                    drop_entry(d, e);
            }
        }
    }
    pthread_mutex_unlock(&d->lock);
    return removed;
}

/* ------------------------------------------------------------ open */

/* A record found by the scan, before the replay indexes it. */
struct found {
    struct disk_entry *e;
    int dead;
};

static int by_seq(const void *a, const void *b)
{
    uint64_t x = ((const struct found *)a)->e->seq, y = ((const struct found *)b)->e->seq;
    return x < y ? -1 : x > y;
}

/* Reads the records of one region through a window of headers: from the
 * start, each record after the one before (or at the next block, where a
 * batch ended), while they parse and their seqs grow; what follows is
 * padding or an older use of the region. Sets the region's fill. */
static int scan_region(struct disk_tier *d, uint32_t fi, uint32_t ri, uint8_t *win,
                       struct found **found, uint32_t *nfound, uint32_t *cap)
{
    struct disk_file *f = &d->files[fi];
    struct disk_region *r = &f->regions[ri];
    uint64_t base = region_off(ri), pos = 0, prev_seq = 0;
    uint64_t win_start = UINT64_MAX, win_len = 0;
    int tried_block = 0;

    while (pos + DISK_RECORD_FIXED <= DISK_REGION_BYTES) {
        /* The window must hold the longest header that may start at pos. */
        if (win_start == UINT64_MAX || pos < win_start ||
            pos + DISK_RECORD_FIXED + 2 * UINT16_MAX > win_start + win_len) {
            win_start = pos / DISK_BLOCK * DISK_BLOCK;
            win_len = GK_MIN((uint64_t)DISK_SCAN_WINDOW, DISK_REGION_BYTES - win_start);
            int rc = full_pread(f->fd, win, win_len, base + win_start);
            if (rc)
                return rc;
        }
        struct disk_record rec;
        int ok = disk_record_parse(win + (pos - win_start), win_start + win_len - pos,
                                   base + pos, DISK_REGION_BYTES - pos, &rec) &&
                 rec.seq > prev_seq;
        if (!ok) {
            /* A batch ends with zeros to its block: the next one starts
             * there. Anything else ends the region's records. */
            uint64_t next_block = disk_round_up(pos, DISK_BLOCK);
            if (next_block == pos || tried_block)
                break;
            tried_block = 1;
            pos = next_block;
            continue;
        }
        tried_block = 0;
        struct disk_entry *e = new_entry(fi, ri, base + pos, disk_record_len(rec.hdr_len, rec.size),
                                         rec.seq, rec.size, rec.ns, rec.ns_len, rec.key,
                                         rec.key_len);
        if (!e || gk_grow(found, cap, *nfound + 1, sizeof **found, 256) != 0) {
            free(e);
            return -ENOMEM;
        }
        (*found)[(*nfound)++] = (struct found){.e = e, .dead = rec.dead};
        prev_seq = rec.seq;
        if (rec.seq > d->seq)
            d->seq = rec.seq;
        pos += e->len;
        r->fill = disk_round_up(pos, DISK_BLOCK);
        if (r->last_used < rec.seq)
            r->last_used = rec.seq;
    }
    r->state = r->fill ? REGION_SEALED : REGION_FREE;
    d->stats.disk_used_bytes += r->fill;
    return 0;
}

/* Rebuilds the index from every region's records, replayed in seq order: a
 * later record of a key supersedes an earlier one, a dead one deletes it. */
static int restore(struct disk_tier *d, char *err, size_t errlen)
{
    struct found *found = NULL;
    uint32_t nfound = 0, cap = 0;
    uint8_t *win = aligned_alloc_block(DISK_SCAN_WINDOW);
    int rc = win ? 0 : -ENOMEM;
    for (uint32_t fi = 0; fi < d->nfiles && rc == 0; fi++) {
        for (uint64_t ri = 0; ri < d->files[fi].nregions && rc == 0; ri++) {
            rc = scan_region(d, fi, (uint32_t)ri, win, &found, &nfound, &cap);
            if (rc)
                snprintf(err, errlen, "reading the disk file %s: %s", d->files[fi].path,
                         strerror(-rc));
        }
    }
    free(win);
    if (nfound)
        qsort(found, nfound, sizeof *found, by_seq);
    for (uint32_t i = 0; i < nfound; i++) {
        struct disk_entry *e = found[i].e;
        if (rc || found[i].dead) {
            struct disk_entry *live = rc ? NULL
                                         : find(d, e->bytes, e->ns_len, e->bytes + e->ns_len,
                                                e->node.key_len);
            if (live)
                drop_entry(d, live);
            free(e);
            continue;
        }
        add_entry(d, e);
    }
    free(found);
    d->stats.disk_restored_objects = d->stats.disk_objects;
    d->clock = d->seq;
    return rc;
}

static int open_file(struct disk_tier *d, struct disk_file *f, const char *dir, uint64_t bytes,
                     int reset, char *err, size_t errlen)
{
    struct stat st;
    if (stat(dir, &st) != 0) {
        snprintf(err, errlen, "disk path %s: %s", dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "disk path %s: not a directory", dir);
        return -1;
    }
    if (snprintf(f->path, sizeof f->path, "%s/%s", dir, DISK_FILE_NAME) >= (int)sizeof f->path) {
        snprintf(err, errlen, "disk path %s: too long", dir);
        return -1;
    }
    f->nregions = (bytes - DISK_SUPER_BYTES) / DISK_REGION_BYTES;
    if (bytes < DISK_SUPER_BYTES || f->nregions < DISK_MIN_REGIONS) {
        snprintf(err, errlen, "disk size %" PRIu64 " MiB is too small: each disk needs at least "
                 "%d regions of %llu MiB", bytes >> 20, DISK_MIN_REGIONS,
                 (unsigned long long)(DISK_REGION_BYTES >> 20));
        return -1;
    }
    f->direct = 1;
    f->fd = gk_open_owned_file(f->path, "the disk file", O_DIRECT, &st, err, errlen);
    if (f->fd < 0 && errno == EINVAL) {     /* tmpfs and friends */
        f->direct = 0;
        f->fd = gk_open_owned_file(f->path, "the disk file", 0, &st, err, errlen);
    }
    if (f->fd < 0)
        return -1;
    if (!f->direct)
        GK_WARN("disk: %s can't do O_DIRECT: its reads and writes go through the page cache",
                f->path);
    uint64_t file_len = region_off(f->nregions);
    uint8_t *super = aligned_alloc_block(DISK_SUPER_BYTES);
    if (!super) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int fresh = reset || st.st_size == 0;
    if (!fresh && ((uint64_t)st.st_size != file_len ||
                   full_pread(f->fd, super, DISK_SUPER_BYTES, 0) != 0 ||
                   !disk_super_check(super, f->nregions))) {
        snprintf(err, errlen, "the disk file %s was made for another --disk-size or gdrkv "
                 "version: start with the size it was made with, or reset it", f->path);
        free(super);
        return -1;
    }
    if (fresh) {
        int rc = ftruncate(f->fd, 0) == 0 && ftruncate(f->fd, (off_t)file_len) == 0 ? 0 : errno;
        if (!rc)
            rc = fallocate(f->fd, 0, 0, (off_t)file_len) == 0 ? 0 : errno;
        if (rc == EOPNOTSUPP)
            rc = 0;
        disk_super_write(super, f->nregions);
        if (!rc)
            rc = -full_pwrite(f->fd, super, DISK_SUPER_BYTES, 0);
        if (rc) {
            snprintf(err, errlen, "cannot make the disk file %s %" PRIu64 " MiB: %s", f->path,
                     file_len >> 20, strerror(rc));
            (void)!ftruncate(f->fd, 0);
            free(super);
            return -1;
        }
    }
    free(super);
    f->regions = calloc(f->nregions, sizeof *f->regions);
    if (!f->regions) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    f->open_region = -1;
    d->stats.disk_bytes += f->nregions * DISK_REGION_BYTES;
    return 0;
}

int disk_open(struct disk_tier **out, const struct disk_opts *o, char *err, size_t errlen)
{
    struct disk_tier *d = calloc(1, sizeof *d);
    if (!d || !o->npaths) {
        free(d);
        snprintf(err, errlen, o->npaths ? "out of memory" : "no disk paths");
        return -1;
    }
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->write_lock, NULL);
    d->write_warn = d->read_warn = d->dead_warn =
        (struct gk_log_rate)GK_LOG_RATE(DISK_WARN_INTERVAL_MS);
    d->ns_seed = gk_mix64(gk_now_ns() ^ (uint64_t)getpid());
    d->files = calloc(o->npaths, sizeof *d->files);
    d->write_buf = aligned_alloc_block(DISK_REGION_BYTES);
    int rc = d->files && d->write_buf && index_init(&d->ix, DISK_INDEX_BUCKETS) == 0 ? 0 : -1;
    if (rc)
        snprintf(err, errlen, "out of memory");
    for (uint32_t i = 0; rc == 0 && i < o->npaths; i++) {
        pthread_mutex_init(&d->files[i].rmw_lock, NULL);
        d->files[i].fd = -1;
        d->nfiles = i + 1;
        rc = open_file(d, &d->files[i], o->paths[i], o->bytes_per_path, o->reset, err, errlen);
    }
    if (rc == 0)
        rc = restore(d, err, errlen);
    if (rc) {
        disk_close(d);
        return -1;
    }
    GK_INFO("disk: %u file(s) of %" PRIu64 " MiB, %" PRIu64 " objects found", d->nfiles,
            d->stats.disk_bytes / d->nfiles >> 20, d->stats.disk_objects);
    *out = d;
    return 0;
}

void disk_close(struct disk_tier *d)
{
    if (!d)
        return;
    disk_bury(d);
    for (uint32_t i = 0; i < d->nfiles; i++) {
        struct disk_file *f = &d->files[i];
        for (uint64_t r = 0; f->regions && r < f->nregions; r++) {
            while (f->regions[r].entries)
                drop_entry(d, f->regions[r].entries);
        }
        free(f->regions);
        if (f->fd >= 0)
            close(f->fd);
        pthread_mutex_destroy(&f->rmw_lock);
    }
    if (d->ix.cur.buckets)
        index_destroy(&d->ix);
    free(d->files);
    free(d->write_buf);
    pthread_mutex_destroy(&d->lock);
    pthread_mutex_destroy(&d->write_lock);
    free(d);
}

uint64_t disk_max_value(const struct disk_tier *d)
{
    (void)d;
    return DISK_REGION_BYTES - disk_record_hdr_len(UINT16_MAX, UINT16_MAX);
}

void disk_get_stats(struct disk_tier *d, struct store_disk_stats *out)
{
    pthread_mutex_lock(&d->lock);
    *out = d->stats;
    pthread_mutex_unlock(&d->lock);
}
