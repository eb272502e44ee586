"""gdrkv bench --gpu: host<->GPU transfers of scattered pages, gdrkv against
the ceilings measured in the same run on the same buffers.

Ceilings (pinned host memory <-> GPU pages scattered over twice their
size; the pieces are handed to the driver from C, so no Python loop is
timed): one cuMemcpyAsync per page (what cudaMemcpyAsync per page gives),
one cuMemcpyBatchAsync for the batch, and gdrkv's copy kernel doing the
whole batch in one launch (gdrkv.gpu.copy). Then gdrkv itself: GET from a
`gdrkv serve` process over shm (and tcp) into scattered GPU pages, and PUT
from them, calling the C API with arrays built once. Last, interference:
how much slower a memory-bound kernel (a big device-to-device copy, the
stand-in for decode) runs while gdrkv streams GETs into the GPU, or PUTs
out of it, with gpu_copy=kernel and gpu_copy=copy_engine.

Needs torch (for GPU memory and CUDA events); the library does not.
"""
import functools
import os
import random
import statistics
import sys
import threading
import time

from .. import gpu
from .._native import ffi, lib
from ..client import Client
from ..sizes import format_size, parse_size
from ..table import format_table
from . import first_call, harness

GPU_SIZES = "4KiB,16KiB,64KiB,256KiB,1MiB"
SINGLE_TENANT = "-single-tenant"   # a transport measured against a --single-tenant server
CEILING_BYTES = 256 << 20      # moved per ceiling measurement
BATCH_BYTES = 16 << 20          # per gdrkv batch call
STORE_BYTES = 128 << 20         # stored per size, read back batch by batch
MIN_TIME_S = 0.3
PUT_ROUNDS = 5                  # PUT rounds of STORE_BYTES each; the median is reported
INTERFERENCE_PAGE = 64 << 10
INTERFERENCE_BYTES = 512 << 20  # each memory-bound kernel reads and writes this much


def add_arguments(parser):
    parser.add_argument("--gpu", action="store_true",
                        help="host<->GPU: per-page cudaMemcpyAsync, cuMemcpyBatchAsync and "
                             "one-kernel ceilings, gdrkv GET/PUT into scattered GPU pages, "
                             "and interference with a memory-bound kernel")
    parser.add_argument("--gpu-transports", default="shm,shm-single-tenant,tcp",
                        help="with --gpu: transports to measure; shm-single-tenant is shm "
                             "to a second server started with --single-tenant (default "
                             "shm,shm-single-tenant,tcp)")
    parser.add_argument("--pool-size", type=parse_size, default=first_call.default_pool_size(),
                        help="with --gpu or --vllm: the pool of the server the bench starts "
                             "(default: 64 GiB on hosts of 96 GiB or more, else half the "
                             "host's memory): what a fresh client must make reachable")
    parser.add_argument("--first-call-procs", type=_counts, default="1,4,8",
                        help="with --gpu: time the first calls of this many fresh client "
                             "processes at once, each count in turn (default 1,4,8; "
                             "0: none)")


def _counts(value):
    counts = [int(v) for v in value.split(",") if v.strip()]
    if any(c < 0 for c in counts):
        raise ValueError("process counts are 0 or more")
    return [c for c in counts if c]


def cuda_torch(mode):
    """(torch, the driver's description) when a GPU and torch are both
    here; else (None, None), having said which is missing."""
    ok, why = gpu.available()
    if not ok:
        print(f"gdrkv bench {mode}: no GPU: {why}", file=sys.stderr)
        return None, None
    try:
        import torch
    except ImportError:
        print(f"gdrkv bench {mode}: needs torch for GPU memory and CUDA events", file=sys.stderr)
        return None, None
    return torch, why


def run(args):
    torch, why = cuda_torch("--gpu")
    if torch is None:
        return 1
    sizes = args.sizes or [parse_size(s) for s in GPU_SIZES.split(",")]
    transports = [t for t in args.gpu_transports.split(",") if t]
    report = {"gpu": torch.cuda.get_device_name(0), "driver": why, "sizes": sizes,
              "ceilings": [], "gdrkv": [], "interference": []}
    print(f"# {report['gpu']} ({why})", flush=True)
    report["ceilings"] = [_ceilings(torch, size) for size in sizes]
    print(_ceiling_table(report["ceilings"]), flush=True)
    report["pool_size"] = args.pool_size
    report["first_calls"] = []
    # One server at a time: two pools of production size may not fit beside each other.
    plain = [t for t in transports if not t.endswith(SINGLE_TENANT)]
    single = [t for t in transports if t.endswith(SINGLE_TENANT)]
    for flags, group in (([], plain), (["--single-tenant"], single)):
        if not group:
            continue
        with harness.server(_ServerArgs(args), flags, pretouch=True, memory=args.pool_size) as url:
            if any(t.startswith("shm") for t in group) and args.first_call_procs:
                label = "shm" + (SINGLE_TENANT if flags else "")
                rows = first_call.run(url, args.first_call_procs, label)
                print(first_call.table(rows), flush=True)
                report["first_calls"] += rows
            for transport in group:
                for size in sizes:
                    report["gdrkv"] += _gdrkv(torch, url, transport, size, conns=args.conns)
            if "shm" in group:
                report["interference"] = _interference(torch, url)
    print(_gdrkv_table(report["gdrkv"], report["ceilings"]), flush=True)
    if report["interference"]:
        print(_interference_table(report["interference"]), flush=True)
    harness.write_json(args.json, report)
    return 0


class _ServerArgs:
    """What harness.server needs; its smallest pool (1.25 GiB) holds the
    STORE_BYTES one measurement stores at a time."""

    def __init__(self, args):
        self.url = args.url
        self.count = 1
        self.sizes = [1]


# ---------------------------------------------------------------- helpers

def _scattered(base, size, count, seed):
    slots = list(range(2 * count))
    random.Random(seed).shuffle(slots)
    return [base + s * size for s in slots[:count]]


def _rate(fn, nbytes):
    """GB/s of fn() moving nbytes: median of rounds lasting MIN_TIME_S."""
    fn()                                        # warm-up: first touches, registrations
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-6)
    reps = max(1, int(MIN_TIME_S / once))
    rates = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        rates.append(reps * nbytes / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


# ---------------------------------------------------------------- ceilings

def _ceilings(torch, size):
    count = CEILING_BYTES // size
    host = torch.empty(CEILING_BYTES, dtype=torch.uint8).pin_memory()
    host.fill_(7)
    dev = torch.zeros(2 * CEILING_BYTES, dtype=torch.uint8, device="cuda")
    hp = [host.data_ptr() + i * size for i in range(count)]
    dp = _scattered(dev.data_ptr(), size, count, seed=size)
    lens = [size] * count
    row = {"size": size}
    h2d, d2h = gpu.Pieces(dp, hp, lens), gpu.Pieces(hp, dp, lens)
    for mode in ("per_piece", "copy_engine", "kernel"):
        row[f"{mode}_h2d"] = _rate(lambda: gpu.copy(0, h2d, mode), CEILING_BYTES)
        row[f"{mode}_d2h"] = _rate(lambda: gpu.copy(0, d2h, mode), CEILING_BYTES)
    del host, dev
    torch.cuda.empty_cache()
    return row


def _best(row, direction):
    return max(row[f"{m}_{direction}"] for m in ("per_piece", "copy_engine", "kernel"))


# ---------------------------------------------------------------- gdrkv

class _Batch:
    """A batch call's C arrays, built once so the timing holds no Python
    marshalling: keys[first:first+n] into (or from) ptrs."""

    def __init__(self, keys, ptrs, size):
        blob = b"".join(k.encode() for k in keys)
        self.n = len(keys)
        self.keys = ffi.new("char[]", blob)
        self.key_lens = ffi.new("uint32_t[]", [len(k.encode()) for k in keys])
        self.ptrs = ffi.new("uint64_t[]", ptrs)
        self.lens = ffi.new("uint64_t[]", [size] * self.n)
        self.counts = ffi.new("uint32_t[]", [1] * self.n)
        self.results = ffi.new("int64_t[]", self.n)
        self.expected = {}      # expected result -> every key's, as bytes

    def call(self, client, fn, expect):
        rc = fn(client._handle, self.n, self.keys, self.key_lens, self.ptrs, self.lens,
                self.counts, self.results, 0)
        # Every result checked, by one comparison of bytes: a Python loop
        # over 4096 results would be timed as well, and cost as much as
        # the call it checks.
        if expect not in self.expected:
            self.expected[expect] = bytes(ffi.buffer(ffi.new("int64_t[]", [expect] * self.n)))
        if rc or ffi.buffer(self.results)[:] != self.expected[expect]:
            bad = [r for r in ffi.unpack(self.results, self.n) if r != expect]
            raise RuntimeError(f"batch call failed: rc {rc}, {len(bad)} keys, e.g. {bad[:3]}")


def _gdrkv(torch, url, transport, size, modes=("kernel", "copy_engine", "auto"), conns=None):
    per_batch = max(1, BATCH_BYTES // size)
    nbatches = max(1, STORE_BYTES // BATCH_BYTES)
    count = per_batch * nbatches
    dev = torch.empty(2 * count * size, dtype=torch.uint8, device="cuda")
    dev.random_(0, 256)
    torch.cuda.synchronize()
    ptrs = _scattered(dev.data_ptr(), size, count, seed=size + 1)
    rows = []
    for mode in modes:
        ns = f"bench-gpu-{os.getpid()}-{transport}-{size}-{mode}"
        with Client(url, transport=transport.removesuffix(SINGLE_TENANT), namespace=ns,
                    gpu_copy=mode, **({"conns": conns} if conns else {})) as client:
            client.register(dev)
            batches = [_Batch([f"{i}" for i in range(b * per_batch, (b + 1) * per_batch)],
                              ptrs[b * per_batch:(b + 1) * per_batch], size)
                       for b in range(nbatches)]
            # PUT: a key already stored is not written again, so each round
            # stores every batch's keys afresh and they are deleted between
            # rounds (untimed); the median of PUT_ROUNDS rounds, after a
            # warm-up batch (first touches, registrations: a long-lived engine
            # client pays them once) that is deleted again.
            warm_keys = [f"warm-{i}" for i in range(per_batch)]
            _Batch(warm_keys, ptrs[:per_batch], size).call(client, lib.gdrkv_batch_put_stream, 0)
            client.batch_delete(warm_keys)
            rates = []
            for _ in range(PUT_ROUNDS):
                if rates:
                    client.batch_delete([f"{i}" for i in range(count)])
                start = time.perf_counter()
                for batch in batches:
                    batch.call(client, lib.gdrkv_batch_put_stream, 0)
                rates.append(count * size / (time.perf_counter() - start) / 1e9)
            put = statistics.median(rates)
            state = {"j": 0}

            def get():
                batches[state["j"] % nbatches].call(client, lib.gdrkv_batch_get_stream, size)
                state["j"] += 1

            rows.append({"transport": transport, "size": size, "gpu_copy": mode,
                         "get_gb_per_s": _rate(get, per_batch * size),
                         "put_gb_per_s": put, "keys_per_batch": per_batch})
            client.clear()
            client.unregister(dev)
    del dev
    torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------- interference

def memory_bound(torch, a, b, stream, iters):
    """Milliseconds per device-to-device copy of a into b on stream."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record()
        for _ in range(iters):
            b.copy_(a)
        end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def _interference(torch, url):
    a = torch.empty(INTERFERENCE_BYTES, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    stream = torch.cuda.Stream()
    memory_bound(torch, a, b, stream, 10)
    alone = statistics.median(memory_bound(torch, a, b, stream, 100) for _ in range(3))
    size, per_batch = INTERFERENCE_PAGE, BATCH_BYTES // INTERFERENCE_PAGE
    dev = torch.zeros(2 * per_batch * size, dtype=torch.uint8, device="cuda")
    ptrs = _scattered(dev.data_ptr(), size, per_batch, seed=9)
    measure = functools.partial(memory_bound, torch, a, b, stream, 100)
    rows = []
    for op in ("get", "put"):
        for mode in ("kernel", "copy_engine"):
            with Client(url, transport="shm", namespace=f"bench-intf-{os.getpid()}-{op}-{mode}",
                        gpu_copy=mode) as client:
                client.register(dev)
                busy, gbps = _while_streaming(client, op, ptrs, size, measure)
                rows.append({"op": op, "gpu_copy": mode, "page": size,
                             "kernel_ms_alone": alone, "kernel_ms_with_gdrkv": busy,
                             "slowdown_pct": 100 * (busy / alone - 1),
                             f"gdrkv_{op}_gb_per_s": gbps})
                client.clear()
    del measure, a, b, dev
    torch.cuda.empty_cache()
    return rows


def _while_streaming(client, op, ptrs, size, measure):
    """measure()'s median of three while another thread streams batches of
    GETs (of one stored batch) or PUTs (of two key sets in turn, each
    deleted before it is stored again) between ptrs and gdrkv; and the GB/s
    gdrkv moved meanwhile."""
    n = len(ptrs)
    sets = [[f"{op}{s}-{i}" for i in range(n)] for s in range(2)]
    batches = [_Batch(keys, ptrs, size) for keys in sets]
    batches[0].call(client, lib.gdrkv_batch_put_stream, 0)
    stop, moved = threading.Event(), [0]

    def stream_ops():
        turn = 0
        while not stop.is_set():
            if op == "get":
                batches[0].call(client, lib.gdrkv_batch_get_stream, size)
            else:
                turn ^= 1
                client.batch_delete(sets[turn])
                batches[turn].call(client, lib.gdrkv_batch_put_stream, 0)
            moved[0] += n * size

    thread = threading.Thread(target=stream_ops)
    thread.start()
    try:
        time.sleep(0.2)
        t0, m0 = time.perf_counter(), moved[0]
        busy = statistics.median(measure() for _ in range(3))
        gbps = (moved[0] - m0) / (time.perf_counter() - t0) / 1e9
    finally:
        stop.set()
        thread.join()
    return busy, gbps


# ---------------------------------------------------------------- tables

def _ceiling_table(rows):
    out = [["page", "per-page memcpy H2D/D2H", "batch memcpy H2D/D2H", "one kernel H2D/D2H"]]
    for r in rows:
        out.append([format_size(r["size"])] + [
            f"{r[m + '_h2d']:.1f} / {r[m + '_d2h']:.1f}"
            for m in ("per_piece", "copy_engine", "kernel")])
    return "ceilings, GB/s (pinned host <-> scattered GPU pages)\n" + format_table(out)


def _gdrkv_table(rows, ceilings):
    best = {c["size"]: (_best(c, "h2d"), _best(c, "d2h")) for c in ceilings}
    out = [["transport", "page", "gpu_copy", "GET GB/s", "% best H2D", "PUT GB/s",
            "% best D2H"]]
    for r in rows:
        h2d, d2h = best[r["size"]]
        out.append([r["transport"], format_size(r["size"]), r["gpu_copy"],
                    f"{r['get_gb_per_s']:.2f}", f"{100 * r['get_gb_per_s'] / h2d:.0f}",
                    f"{r['put_gb_per_s']:.2f}", f"{100 * r['put_gb_per_s'] / d2h:.0f}"])
    return "gdrkv into/out of scattered GPU pages\n" + format_table(out)


def _interference_table(rows):
    out = [["op", "gpu_copy", "page", "D2D copy ms alone", "with gdrkv", "slowdown %",
            "gdrkv GB/s meanwhile"]]
    for r in rows:
        op = r["op"]
        out.append([op.upper(), r["gpu_copy"], format_size(r["page"]),
                    f"{r['kernel_ms_alone']:.3f}", f"{r['kernel_ms_with_gdrkv']:.3f}",
                    f"{r['slowdown_pct']:.1f}", f"{r[f'gdrkv_{op}_gb_per_s']:.2f}"])
    return ("interference: a memory-bound kernel (copy of "
            f"{format_size(INTERFERENCE_BYTES)}) while gdrkv streams shm GETs or PUTs\n"
            + format_table(out))
