/*
 * fuzz_disk.c - the disk tier's restart scan (store/disk.c, disk_format.c)
 * on files whose first region holds arbitrary bytes: records well formed
 * or damaged, torn, duplicated, moved, their seqs out of order.
 *
 * Each input is written over region 0 of a real tier file (the superblock
 * and file size stay valid), then the tier is opened on it. Invariants:
 * the open succeeds; every key it finds reads back either as a miss or as
 * exactly the bytes the well-formed generator gave that key (a damaged
 * record is never served); a new write after the scan reads back
 * byte-exact; nothing leaks (the sanitizers say so).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define FUZZ_NAME "fuzz_disk"
#include "fuzz_driver.h"

#include "gdrkv.h"
#include "store/disk.h"
#include "store/disk_format.h"

#define NKEYS 8
#define REGIONS 2
#define INPUT_MAX (1 << 16)

static const uint8_t NS[] = "fz";
#define NS_LEN (sizeof NS - 1)
static const uint64_t SIZES[] = {0, 1, 100, 4096, 5000, 20000};

static char dir[256], file[300];
static size_t last_len;

static void key_of(char *key, uint32_t k) { snprintf(key, 16, "key-%u", k); }

/* The value of key k at size: its bytes follow from both alone. */
static void fill_value(uint8_t *p, uint64_t size, uint32_t k)
{
    uint64_t x = 0x9e3779b97f4a7c15ull * (k + 1) + size;
    for (uint64_t i = 0; i < size; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

static struct disk_tier *open_tier(int reset)
{
    const char *paths[] = {dir};
    struct disk_opts o = {.paths = paths, .npaths = 1,
                          .bytes_per_path = DISK_SUPER_BYTES + REGIONS * DISK_REGION_BYTES,
                          .reset = reset};
    struct disk_tier *d = NULL;
    char err[512] = "";
    int rc = disk_open(&d, &o, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, FUZZ_NAME ": disk_open: %s\n", err);
    check(rc == 0, "the tier opens on a file with a valid superblock");
    return d;
}

static void cleanup(void)
{
    unlink(file);
    rmdir(dir);
}

static void setup_once(void)
{
    if (dir[0])
        return;
    setenv("GDRKV_LOG", "error", 0);    /* every open logs its scan otherwise */
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, sizeof dir, "%s/gdrkv-fuzz-disk-XXXXXX", tmp);
    check(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(file, sizeof file, "%s/gdrkv.disk", dir);
    disk_close(open_tier(1));
    atexit(cleanup);
}

/* Region 0's first bytes become data; what the last input left there
 * beyond them becomes zeros. */
static void write_region(const uint8_t *data, size_t len)
{
    static uint8_t zeros[INPUT_MAX];
    int fd = open(file, O_WRONLY);
    check(fd >= 0, "open the tier file");
    if (last_len > len)
        check(pwrite(fd, zeros, last_len - len, DISK_SUPER_BYTES + (off_t)len) ==
                  (ssize_t)(last_len - len), "clear the last input");
    check(pwrite(fd, data, len, DISK_SUPER_BYTES) == (ssize_t)len, "write the input");
    close(fd);
    last_len = len;
}

/* A found key must read back as a miss or as its own bytes. */
static void check_key(struct disk_tier *d, uint32_t k)
{
    char key[16];
    struct disk_loc loc;
    key_of(key, k);
    if (disk_lookup(d, NS, NS_LEN, (const uint8_t *)key, (uint32_t)strlen(key), &loc) != 0)
        return;
    check(loc.size <= disk_max_value(d), "a found record's size fits a region");
    uint8_t *got = malloc(loc.size ? loc.size : 1), *want = malloc(loc.size ? loc.size : 1);
    check(got && want, "out of memory");
    struct iovec iov = {got, loc.size};
    if (disk_read(d, &loc, NS, NS_LEN, (const uint8_t *)key, (uint32_t)strlen(key), &iov, 1) ==
        0) {
        fill_value(want, loc.size, k);
        check(memcmp(got, want, loc.size) == 0, "a record read back with bytes not its own");
    }
    disk_release(d, &loc);
    free(got);
    free(want);
}

/* After any scan, the tier takes a write and serves it. */
static void check_new_write(struct disk_tier *d)
{
    static uint8_t value[5000], got[5000];
    const char key[] = "after-scan";
    fill_value(value, sizeof value, 99);
    struct iovec in = {value, sizeof value};
    struct disk_item it = {.ns = NS, .ns_len = NS_LEN, .key = (const uint8_t *)key,
                           .key_len = sizeof key - 1, .iov = &in, .iovcnt = 1,
                           .size = sizeof value};
    int32_t status = -1;
    disk_put_batch(d, &it, 1, &status);
    check(status == 0, "a write after the scan");
    struct disk_loc loc;
    check(disk_lookup(d, NS, NS_LEN, it.key, it.key_len, &loc) == 0, "the new record found");
    struct iovec out = {got, sizeof got};
    check(loc.size == sizeof value &&
              disk_read(d, &loc, NS, NS_LEN, it.key, it.key_len, &out, 1) == 0 &&
              memcmp(got, value, sizeof value) == 0, "the new record read back byte-exact");
    disk_release(d, &loc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup_once();
    write_region(data, size < INPUT_MAX ? size : INPUT_MAX);
    struct disk_tier *d = open_tier(0);
    for (uint32_t k = 0; k < NKEYS; k++)
        check_key(d, k);
    check_new_write(d);
    disk_close(d);
    return 0;
}

#ifndef GK_LIBFUZZER

/* One batch of well-formed records from region 0's start, as the tier
 * writes them: keys and sizes drawn at random, seqs increasing. */
static size_t make_valid(uint8_t *buf, size_t cap)
{
    size_t pos = 0;
    uint64_t seq = 1 + rnd() % 1000;
    memset(buf, 0, cap);
    for (int n = 1 + (int)(rnd() % 6); n > 0; n--) {
        uint32_t k = (uint32_t)(rnd() % NKEYS);
        uint64_t size = SIZES[rnd() % GK_ARRAY_LEN(SIZES)];
        char key[16];
        key_of(key, k);
        uint32_t hdr = disk_record_hdr_len(NS_LEN, (uint32_t)strlen(key));
        uint64_t len = disk_record_len(hdr, size);
        if (pos + len > cap)
            break;
        fill_value(buf + pos + hdr, size, k);
        disk_record_write(buf + pos, DISK_SUPER_BYTES + pos, seq, NS, NS_LEN,
                          (const uint8_t *)key, (uint32_t)strlen(key), size,
                          gk_checksum64(buf + pos + hdr, size, seq));
        seq += 1 + rnd() % 3;
        pos += len;
    }
    return disk_round_up(pos, DISK_BLOCK);
}

/* Damage the way disks and crashes do: a header field, a dead word, a
 * record copied to another offset, a block zeroed; or bytes at random. */
static size_t mutate_once(uint8_t *buf, size_t len, size_t cap)
{
    size_t at = len ? rnd() % len / DISK_RECORD_ALIGN * DISK_RECORD_ALIGN : 0;
    switch (rnd() % 6) {
    case 0:                     /* a header field */
        if (at + DISK_RECORD_FIXED <= len)
            buf[at + rnd() % DISK_RECORD_FIXED] ^= (uint8_t)(1 + rnd() % 255);
        return len;
    case 1:                     /* a dead word */
        if (at + DISK_RECORD_FIXED <= len)
            buf[at + DISK_DEAD_OFF] = (uint8_t)rnd();
        return len;
    case 2: {                   /* a record-sized run copied elsewhere */
        size_t to = rnd() % cap / DISK_RECORD_ALIGN * DISK_RECORD_ALIGN, want = rnd() % 8192;
        size_t n = GK_MIN(want, GK_MIN(cap - to, len - at));
        memmove(buf + to, buf + at, n);
        return GK_MAX(len, to + n);
    }
    case 3:                     /* a block zeroed */
        if (len >= DISK_BLOCK) {
            size_t block = rnd() % (len / DISK_BLOCK) * DISK_BLOCK;
            memset(buf + block, 0, DISK_BLOCK);
        }
        return len;
    default:
        return mutate_bytes(buf, len, cap);
    }
}

int main(int argc, char **argv)
{
    static uint8_t buf[INPUT_MAX];
    setup_once();
    return fuzz_main(argc, argv, buf, sizeof buf, 4);
}

#endif
