/*
 * disk.h - the capacity tier under the pool: objects demoted from DRAM kept
 * in one file per disk (--disk PATH,... --disk-size SIZE), found through an
 * index of their own, read back when a reader wants them. Private to the
 * store (tiering.c decides what goes down and comes up).
 *
 * A file is cut into regions (DISK_REGION_BYTES). One region per file is
 * open at a time and filled in order, a batch of records per write; a full
 * region is sealed, and the tier evicts whole regions, least recently read
 * first, as flash caches do (CacheLib's BlockCache): every write is
 * sequential and eviction never moves live data. Each record carries its
 * namespace, key, size and checksums (disk_format.h), so an open rebuilds
 * the index from the files: what a killed server wrote is found again, and
 * a record whose bytes did not all reach the disk fails its checksum when
 * read, which makes it a miss, never wrong bytes.
 *
 * I/O is O_DIRECT (pread/pwrite, 4 KiB aligned, through bounce buffers)
 * where the filesystem allows it, buffered otherwise (tmpfs). Every error
 * is a miss or a write not done, counted and logged; nothing here fails
 * the store.
 *
 * Thread safety: any thread; one lock covers the index and regions, and the
 * I/O runs outside it. A reader holds the record's region (disk_lookup ..
 * disk_release) so it is not reused under the read.
 */
#ifndef GDRKV_DISK_H
#define GDRKV_DISK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "store.h"

#define DISK_REGION_BYTES (16ull << 20)

struct disk_tier;

struct disk_opts {
    const char *const *paths;   /* directories; the tier's file in each */
    uint32_t npaths;
    uint64_t bytes_per_path;    /* each file's size (whole regions are used) */
    int reset;                  /* start the files empty whatever they hold */
};

/* Opens or creates the files and rebuilds the index from what they hold.
 * Refuses (-1, the reason in err) a path that is not a writable directory,
 * a file another server holds, or a file of another geometry (unless
 * reset). */
int disk_open(struct disk_tier **out, const struct disk_opts *o, char *err, size_t errlen);
void disk_close(struct disk_tier *d);

/* The largest value a record can hold (a region minus its header). */
uint64_t disk_max_value(const struct disk_tier *d);

/* One object to write: namespace, key and the value's pieces in memory. */
struct disk_item {
    const uint8_t *ns, *key;
    uint32_t ns_len, key_len;
    const struct iovec *iov;
    uint32_t iovcnt;
    uint64_t size;              /* sum of the pieces */
};

/* Writes the items and indexes them (a record of the same key before is
 * superseded); status[i] is 0, or GDRKV_E_TOO_LARGE, or GDRKV_E_NO_SPACE
 * when every region is held by readers, or GDRKV_E_INTERNAL when the write
 * failed (logged, at most a line per DISK_WARN_INTERVAL_MS) and for the
 * items after it, which are not tried. */
void disk_put_batch(struct disk_tier *d, const struct disk_item *items, uint32_t n,
                    int32_t *status);

/* Whether the key is on disk: 1 with *size set, else 0. */
int disk_contains(struct disk_tier *d, const uint8_t *ns, uint32_t ns_len, const uint8_t *key,
                  uint32_t key_len, uint64_t *size);

/* A record held for reading. */
struct disk_loc {
    uint32_t file, region;
    uint64_t off;               /* where the record starts in its file */
    uint64_t len;               /* the record's bytes, header included */
    uint64_t seq;
    uint64_t size;              /* value bytes */
};

/* For a read: 0 with *loc held and the region marked recently used, or
 * GDRKV_E_NOT_FOUND. */
int disk_lookup(struct disk_tier *d, const uint8_t *ns, uint32_t ns_len, const uint8_t *key,
                uint32_t key_len, struct disk_loc *loc);
/* Reads the held record's value into the pieces dst (they sum to
 * loc->size): 0, or GDRKV_E_NOT_FOUND when the read failed or the bytes
 * are not the record's (then the record is dropped from the index). */
int disk_read(struct disk_tier *d, const struct disk_loc *loc, const uint8_t *ns,
              uint32_t ns_len, const uint8_t *key, uint32_t key_len, const struct iovec *dst,
              uint32_t dstcnt);
/* disk_read of n held records at once, in flight side by side (io_uring,
 * uring.h): status[i] as disk_read returns. */
struct disk_read_req {
    const struct disk_loc *loc;
    const uint8_t *ns, *key;
    uint32_t ns_len, key_len;
    const struct iovec *dst;
    uint32_t dstcnt;
};
void disk_read_batch(struct disk_tier *d, const struct disk_read_req *reqs, uint32_t n,
                     int32_t *status);
void disk_release(struct disk_tier *d, const struct disk_loc *loc);

/* DELETE and CLEAR: the records leave the index at once (no I/O: the
 * callers are network workers), and disk_bury marks them dead in their
 * files, so a restart does not bring them back; disk_close buries what is
 * left. 0 or GDRKV_E_NOT_FOUND; the clear returns how many it removed,
 * disk_bury how many it marked. */
int disk_delete(struct disk_tier *d, const uint8_t *ns, uint32_t ns_len, const uint8_t *key,
                uint32_t key_len);
uint64_t disk_clear_ns(struct disk_tier *d, const uint8_t *ns, uint32_t ns_len);
uint32_t disk_bury(struct disk_tier *d);

void disk_get_stats(struct disk_tier *d, struct store_disk_stats *out);

#endif
