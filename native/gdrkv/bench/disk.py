"""gdrkv bench --disk-tier DIR: GETs served from the disk tier against the
device itself and against SGLang's file backend on the same directory.

For each object size (--sizes, default 64KiB,1MiB), in one run:
  - raw: --disk-working-set bytes written to a file in DIR, then read back
    in objects of that size with O_DIRECT (preadv into aligned memory) by
    RAW_THREADS threads, a queue as deep as the server keeps (its disk
    threads each keep a frame's reads in flight through io_uring): the
    disk's ceiling for such reads;
  - gdrkv: a server in this process with a --disk-memory pool (a small
    fraction of the working set) and a disk tier in DIR; the working set is
    written (paced, so nothing is dropped), then read back in batches of
    --count objects over each transport, every object coming up from disk
    (the pool holds none of them by then);
  - SGLang (where installed): HiCacheFile on a folder in DIR against gdrkv's
    HiCache backend on that server, pages of that size set and read back
    through HiCacheStorage, the file backend's pages dropped from the page
    cache first (posix_fadvise), as they would be on a host whose memory
    went to the pool.
Rates are medians of --repeat rounds, in GB/s, with ratios to the raw reads.
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
    rows = [_row("raw O_DIRECT", size, batch, _raw_reads(folder, size, n, args.repeat))]
    disk_size = 2 * n * (size + 4096) + (64 << 20)
    with Server(memory=args.disk_memory, disk=folder, disk_size=disk_size,
                reset_disk=True) as server:
        for transport in ("tcp", "shm"):
            keys = [f"{transport}-{size}-{i}" for i in range(n)]
            with Client(server.url, transport=transport, timeout_ms=60000,
                        namespace=f"bench-disk-{os.getpid()}") as client:
                _fill(server, client, keys, size, batch)
                rows.append(_row(f"gdrkv {transport} from disk", size, batch,
                                 _gets(server, client, keys, size, batch, args.repeat)))
                client.clear()
        rows += _sglang(server, folder, size, n, batch, args.repeat)
    raw = rows[0]["gb_per_s"]
    for row in rows:
        row["raw_x"] = row["gb_per_s"] / raw
    return rows


def _row(system, size, batch, gbps):
    return {"system": system, "size": size, "per_call": batch, "gb_per_s": statistics.median(gbps),
            "rounds": gbps}


def _aligned(nbytes):
    return mmap.mmap(-1, max(nbytes, mmap.PAGESIZE))


def _raw_reads(folder, size, n, repeat):
    """GB/s of O_DIRECT reads of n objects of size from a file written for
    it, by RAW_THREADS threads."""
    path = os.path.join(folder, "raw.bin")
    span = (size + 4095) // 4096 * 4096
    chunks = [_aligned(span) for _ in range(RAW_THREADS)]
    chunks[0].write(os.urandom(span))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o600)
    try:
        for i in range(n):
            os.pwrite(fd, chunks[0], i * span)
        os.fsync(fd)

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
        return rates
    finally:
        os.close(fd)
        os.unlink(path)


def _fill(server, client, keys, size, batch):
    """Writes keys, paced so the demoter keeps up (2% of the pool at a
    time: a burst past the high watermark would evict objects not written
    yet); then a pool's worth of filler, deleted again, so that none of the
    keys is left in the pool and every read comes from disk."""
    value = os.urandom(size)
    pool = server.stats()["pool_bytes"]
    step = max(1, pool // 50 // size)
    filler = [f"filler-{i}" for i in range(max(1, pool // size))]
    for part in (keys, filler):
        for i in range(0, len(part), step):
            for k in part[i:i + step]:
                client.put(k, value)
            _wait_demoter(server)
    client.batch_delete(filler)


def _wait_demoter(server, timeout=120):
    """Until the pool is back under its high watermark."""
    deadline = time.monotonic() + timeout
    while (lambda s: s["pool_used_bytes"] > 0.95 * s["pool_bytes"])(server.stats()):
        if time.monotonic() > deadline:
            raise RuntimeError("gdrkv bench: the disk tier's demoter did not keep up")
        time.sleep(0.002)


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
    # Calls of at most 2% of the pool, as in _fill: a larger burst of sets
    # would evict pages before the demoter wrote them (SGLang's own calls,
    # 128 pages at most, are far below that in a pool of real size).
    batch = max(1, min(batch, server.stats()["pool_bytes"] // 50 // size))
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
                if not copying:
                    _wait_demoter(server)
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
