"""gdrkv bench --disk-tier DIR: GETs served from the disk tier against the
device itself and against SGLang's file backend on the same directory, and
the write rate a full pool sustains against the device's.

For each object size (--sizes, default 64KiB,1MiB), in one run:
  - raw: --disk-working-set bytes written to a file in DIR in objects of
    that size with O_DIRECT, one after the other (the disk's ceiling for
    the tier's sequential writes), then read back by RAW_THREADS threads
    (preadv into aligned memory), a queue as deep as the server keeps (its
    disk threads each keep a frame's reads in flight through io_uring): the
    disk's ceiling for such reads;
  - gdrkv: a server in this process with a --disk-memory pool (a small
    fraction of the working set) and a disk tier in DIR (the default
    disk_full_policy, throttle); the pool is filled, then the working set
    written unpaced in batches of --count objects, each write waiting for
    the disk to make room (the "write, pool full" rows: nothing is
    dropped, so this is the rate writers get once the pool is full), then
    read back in such batches over each transport, every object coming up
    from disk (the pool holds none of them by then);
  - SGLang (where installed): HiCacheFile on a folder in DIR against gdrkv's
    HiCache backend on that server, pages of that size set and read back
    through HiCacheStorage, the file backend's pages dropped from the page
    cache first (posix_fadvise), as they would be on a host whose memory
    went to the pool.
Rates are medians of --repeat rounds (the writes: one round), in GB/s, with
ratios to the raw reads (writes: to the raw writes).
"""
import contextlib
import mmap
import os
import shutil
import statistics
import tempfile
import threading
import time

from ..client import Client
from ..server import Server
from ..sizes import format_size, parse_size
from ..table import format_table
from . import engines, harness

DEFAULT_SIZES = "64KiB,1MiB"
# Reads in flight for the raw ceiling: the server's 4 disk threads each
# keep up to 64 of a frame's reads in flight through io_uring (uring.c), so
# a shallower queue would understate what the disk gives.
RAW_THREADS = 32


def add_arguments(parser):
    parser.add_argument("--disk-tier", metavar="DIR",
                        help="measure GETs served from a disk tier in DIR (a directory on the "
                             "disk to measure) against O_DIRECT reads of the same disk and "
                             "SGLang's file backend there")
    parser.add_argument("--disk-working-set", type=parse_size, default=parse_size("1GiB"),
                        metavar="SIZE", help="bytes written and read back per size "
                                             "(default 1GiB)")
    parser.add_argument("--disk-memory", type=parse_size, default=parse_size("64MiB"),
                        metavar="SIZE", help="the pool in front of the disk tier "
                                             "(default 64MiB)")


def run(args):
    folder = tempfile.mkdtemp(prefix="gdrkv-bench-disk-", dir=args.disk_tier)
    rows = []
    try:
        for size in args.sizes:
            rows += _measure_size(folder, size, args)
            print(_table([r for r in rows if r["size"] == size]), flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    harness.write_json(args.json, {"options": {"dir": args.disk_tier, "sizes": args.sizes,
                                               "working_set": args.disk_working_set,
                                               "memory": args.disk_memory,
                                               "count": args.count, "repeat": args.repeat},
                                   "results": rows})
    return 0


def _measure_size(folder, size, args):
    n = max(1, args.disk_working_set // size)
    batch = max(1, min(args.count, (args.disk_memory // 4) // size))
    raw_writes, raw_reads = _raw(folder, size, n, args.repeat)
    rows = [_row("raw O_DIRECT", size, batch, raw_reads),
            _row("raw O_DIRECT write", size, 1, raw_writes)]
    disk_size = 2 * n * (size + 4096) + (64 << 20)
    with Server(memory=args.disk_memory, disk=folder, disk_size=disk_size,
                reset_disk=True) as server:
        for transport in ("tcp", "shm"):
            keys = [f"{transport}-{size}-{i}" for i in range(n)]
            with Client(server.url, transport=transport, timeout_ms=60000,
                        namespace=f"bench-disk-{os.getpid()}") as client:
                rows.append(_row(f"gdrkv {transport} write, pool full", size, batch,
                                 [_fill(server, client, keys, size, batch)]))
                rows.append(_row(f"gdrkv {transport} from disk", size, batch,
                                 _gets(server, client, keys, size, batch, args.repeat)))
                client.clear()
        rows += _sglang(server, folder, size, n, batch, args.repeat)
    for row in rows:
        raw = rows[1 if "write" in row["system"] else 0]["gb_per_s"]
        row["raw_x"] = row["gb_per_s"] / raw
    return rows


def _row(system, size, batch, gbps):
    return {"system": system, "size": size, "per_call": batch, "gb_per_s": statistics.median(gbps),
            "rounds": gbps}


def _aligned(nbytes):
    return mmap.mmap(-1, max(nbytes, mmap.PAGESIZE))


def _raw(folder, size, n, repeat):
    """GB/s of O_DIRECT writes of n objects of size to a file, one after the
    other (one round), and of reads of them by RAW_THREADS threads (repeat
    rounds)."""
    path = os.path.join(folder, "raw.bin")
    span = (size + 4095) // 4096 * 4096
    chunks = [_aligned(span) for _ in range(RAW_THREADS)]
    chunks[0].write(os.urandom(span))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o600)
    try:
        start = time.perf_counter()
        for i in range(n):
            os.pwrite(fd, chunks[0], i * span)
        os.fsync(fd)
        writes = [n * size / (time.perf_counter() - start) / 1e9]

        def read(t):
            for i in range(t, n, RAW_THREADS):
                os.preadv(fd, [chunks[t]], i * span)

        rates = []
        for _ in range(repeat):
            start = time.perf_counter()
            threads = [threading.Thread(target=read, args=(t,)) for t in range(RAW_THREADS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            rates.append(n * size / (time.perf_counter() - start) / 1e9)
        return writes, rates
    finally:
        os.close(fd)
        os.unlink(path)


def _fill(server, client, keys, size, batch):
    """Fills the pool, then writes keys unpaced in calls of batch, as an
    engine does (each waits for the disk to make room: throttled, nothing
    is dropped), then a pool's worth of filler again, and deletes the
    filler, so that none of the keys is left in the pool and every read
    comes from disk. Returns the GB/s of the keys' writes."""
    value = bytearray(os.urandom(size))
    base, _ = client.register(value)
    pool = server.stats()["pool_bytes"]
    fillers = [[f"filler-{name}-{i}" for i in range(max(1, pool // size))] for name in "ab"]
    try:
        _put_all(client, fillers[0], base, size, batch)
        start = time.perf_counter()
        _put_all(client, keys, base, size, batch)
        rate = len(keys) * size / (time.perf_counter() - start) / 1e9
        _put_all(client, fillers[1], base, size, batch)
    finally:
        client.unregister(value)
    filler = fillers[0] + fillers[1]
    for i in range(0, len(filler), batch):
        client.batch_delete(filler[i:i + batch])
    return rate


def _put_all(client, keys, base, size, batch):
    for i in range(0, len(keys), batch):
        part = keys[i:i + batch]
        got = client.batch_put(part, [base] * len(part), [size] * len(part))
        if got != [0] * len(part):
            raise RuntimeError(f"gdrkv bench: writes to the disk tier failed: {got}")


def _gets(server, client, keys, size, batch, repeat):
    dest = bytearray(batch * size)
    base, _ = client.register(dest)
    ptrs = [base + i * size for i in range(batch)]
    rates = []
    try:
        for r in range(repeat):
            if r:
                _fill(server, client, [], size, batch)      # push them out again
            start = time.perf_counter()
            for i in range(0, len(keys), batch):
                part = keys[i:i + batch]
                got = client.batch_get(part, ptrs[:len(part)], [size] * len(part))
                if got != [size] * len(part):
                    raise RuntimeError(f"gdrkv bench: reads from the disk tier failed: {got}")
            rates.append(len(keys) * size / (time.perf_counter() - start) / 1e9)
    finally:
        client.unregister(dest)
    return rates


def _sglang(server, folder, size, n, batch, repeat):
    try:
        from sglang.srt.mem_cache.hicache_storage import HiCacheFile
    except ImportError:
        return []
    from ..adapters.sglang_hicache import GdrkvHiCacheStorage

    # Pages of this size: page_size tokens of one layer, one head of 128 bf16 (K and V).
    tokens = max(1, size // (2 * 128 * 2))
    pool = engines.PageFirstHostPool(2 * batch, page_size=tokens, layer_num=1, head_num=1,
                                     head_dim=128)
    page_bytes = sum(pool.get_page_buffer_meta(pool.first_indices([0]))[1])
    source, landing = pool.first_indices(range(batch)), pool.first_indices(range(batch, 2 * batch))
    calls = [[f"{j:08x}{i:056x}" for i in range(batch)] for j in range(max(1, n // batch))]

    rows = []
    files = os.path.join(folder, "hicache")
    os.makedirs(files, exist_ok=True)
    model = "gdrkv-bench/disk"
    backends = {
        "sglang file": HiCacheFile(engines.sglang_config({"file_storage_path": files}, model)),
        "sglang gdrkv from disk": GdrkvHiCacheStorage(engines.sglang_config({
            "interface_v1": 1, "url": server.url, "transport": "shm",
            "namespace": f"bench-disk-sglang-{os.getpid()}"}, model), {}),
    }
    with contextlib.ExitStack() as stack:
        for name, backend in backends.items():
            backend.register_mem_pool_host(pool)
            if hasattr(backend, "close"):
                stack.callback(backend.close)
            copying = name == "sglang file"
            # As the controller moves pages for it: flat copies for the file
            # backend, zero copy for gdrkv.
            pages = engines.kv_pages("file" if copying else "gdrkv", backend, pool)
            for keys in calls:
                if not pages.set(keys, source):
                    raise RuntimeError(f"gdrkv bench: {name} set failed")
            rates = []
            for _ in range(repeat):
                if copying:
                    _drop_page_cache(files)
                else:
                    with Client(server.url, namespace="filler-ns") as client:
                        _fill(server, client, [], size, batch)
                start = time.perf_counter()
                for keys in calls:
                    if not pages.get(keys, landing):
                        raise RuntimeError(f"gdrkv bench: {name} get failed")
                rates.append(len(calls) * batch * page_bytes /
                             (time.perf_counter() - start) / 1e9)
            rows.append(_row(name + " get", size, batch, rates))
            backend.clear()
    return rows


def _drop_page_cache(folder):
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _table(rows):
    lines = [["size", "system", "GB/s", "per call", "x raw"]]
    for r in rows:
        lines.append([format_size(r["size"]), r["system"], f"{r['gb_per_s']:.2f}",
                      str(r["per_call"]), f"{r['raw_x']:.2f}"])
    return format_table(lines)
