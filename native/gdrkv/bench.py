"""gdrkv bench: batched put/get/exists throughput against a server in another
process, side by side with this machine's ceilings (the loopback TCP stream
and memcpy) measured in the same run.

Every number is the median over --repeat rounds; a round runs enough batches
to last about MIN_ROUND_S so the timer's resolution does not matter. With
--ceiling, one round of each ceiling runs after every gdrkv round, and each
row is compared with the ceiling rounds run between its own: on a shared
machine the load changes by the second, and a ceiling measured a minute
earlier says little. Buffers are touched before timing and reused, since
first touch of fresh memory is slow on some VMs and would be measured
instead of gdrkv.
"""
import argparse
import contextlib
import ctypes
import json
import math
import mmap
import os
import select
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter

from . import bench_gpu
from .client import Client
from .doctor import cpu_model
from .errors import strerror
from .sizes import format_size, parse_size
from .table import format_table

OPS = ("put", "get", "exists")
DEFAULT_SIZES = "4KiB,64KiB,1MiB"
MIN_ROUND_S = 0.2
# Bytes one put round may store: every batch of a round needs fresh keys,
# since a put of a key already stored is a no-op.
PUT_WINDOW = 512 << 20
CEILING_BYTES = 256 << 20
CEILING_CHUNK = 1 << 20
START_TIMEOUT_S = 60
# Odd, so objects whose size is a power of two start at different offsets of
# the random block: no two objects of a batch hold the same bytes, and a get
# that lands an object in the wrong place fails verification.
PATTERN_BLOCK = (1 << 20) + 4093


def add_arguments(parser):
    parser.add_argument("--url",
                        help="server to measure (default: start one in a separate process)")
    parser.add_argument("--sizes", type=_sizes,
                        help="object sizes (default 4KiB,64KiB,1MiB; with --compare "
                             "4KiB,64KiB,1MiB,4MiB)")
    parser.add_argument("--count", type=_positive, default=256,
                        help="objects per batch (default 256)")
    parser.add_argument("--repeat", type=_positive, default=5,
                        help="rounds per measurement; the median is reported (default 5)")
    parser.add_argument("--ops", type=_ops, default=",".join(OPS),
                        help=f"operations to measure (default {','.join(OPS)})")
    parser.add_argument("--conns", type=_positive,
                        help="connections per server (default: the client's)")
    parser.add_argument("--transport", default="auto", help="client transport (default auto)")
    parser.add_argument("--ceiling", action="store_true",
                        help="also measure the loopback TCP stream and memcpy, "
                             "between gdrkv's rounds")
    parser.add_argument("--json", metavar="PATH",
                        help="write the machine, the options and every median here")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--compare", action="store_true",
                        help="gdrkv over every transport, Mooncake, Redis and the engines' "
                             "own storage on one workload, with the ceilings (it starts "
                             "every server: no --url, --conns or --transport)")
    parser.add_argument("--png", metavar="PATH",
                        help="with --compare: plot throughput against object size here")
    bench_gpu.add_arguments(parser)


def run(args):
    if args.gpu:
        return bench_gpu.run(args)
    if args.compare:
        from . import bench_compare
        args.sizes = args.sizes or _sizes(bench_compare.DEFAULT_SIZES)
        return bench_compare.run(args)
    args.sizes = args.sizes or _sizes(DEFAULT_SIZES)
    progress = _Progress(len(args.sizes) * len(args.ops) * args.repeat,
                         enabled=sys.stderr.isatty() and not args.quiet)
    options = {"transport": args.transport, "namespace": f"gdrkv-bench-{os.getpid()}"}
    if args.conns:
        options["conns"] = args.conns
    try:
        with progress, contextlib.ExitStack() as stack:
            ceilings = _Ceilings(stack.enter_context(_tcp_stream())) if args.ceiling else None
            client = stack.enter_context(Client(stack.enter_context(_server(args)), **options))
            results = [r for size in args.sizes
                       for r in _bench_size(client, size, args, ceilings, progress)]
            client.clear()
    except (RuntimeError, OSError) as e:
        print(f"gdrkv bench: {e}", file=sys.stderr)
        return 1
    summary = ceilings.medians() if ceilings else {}
    print(_table(results, summary))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(_report(args, results, summary), f, indent=2)
            f.write("\n")
    return 0


# ---------------------------------------------------------------- gdrkv

def _bench_size(client, size, args, ceilings, progress):
    """Measures the chosen ops on batches of args.count objects of size bytes."""
    count, batch_bytes, label = args.count, args.count * size, format_size(size)
    src, dst = _pattern(batch_bytes), _touched(batch_bytes)
    src_ptr, _ = client.register(src)
    dst_ptr, _ = client.register(dst)
    sizes = [size] * count
    src_ptrs = [src_ptr + i * size for i in range(count)]
    dst_ptrs = [dst_ptr + i * size for i in range(count)]
    window = max(1, PUT_WINDOW // batch_bytes)
    keys = [[f"{size}/{j}/{i}" for i in range(count)] for j in range(window)]
    stored = set()

    def put(j):
        _expect(f"put {label}", client.batch_put(keys[j], src_ptrs, sizes), 0)
        stored.add(j)

    def delete_stored():
        # Checked: keys that failed to go would make the next puts no-ops.
        for j in stored:
            _expect(f"delete {label}", client.batch_delete(keys[j]), 0)
        stored.clear()

    def get(j):
        _expect(f"get {label}", client.batch_get(keys[0], dst_ptrs, sizes), size)

    def exists(j):
        if not all(client.batch_exists(keys[0])):
            raise RuntimeError(f"exists {label}: stored keys are missing")

    def measure(op, batch, max_batches=math.inf, reset=None):
        first_ceiling = ceilings.rounds() if ceilings else 0

        def after_round():
            progress.step(f"{op} {label}")
            if ceilings:
                ceilings.sample()

        rounds, latencies = _measure(batch, args.repeat, max_batches, reset, after_round)
        result = _result(op, size, count, rounds, latencies)
        if ceilings:
            result.update(_against(result, ceilings.medians(since=first_ceiling)))
        return result

    results = []
    try:
        if "put" in args.ops:
            results.append(measure("put", put, window, delete_stored))
        else:
            put(0)
        if "get" in args.ops:
            results.append(measure("get", get))
            if dst != src:
                raise RuntimeError(f"get {label}: the bytes read differ from the bytes put")
        if "exists" in args.ops:
            results.append(measure("exists", exists))
    finally:
        client.unregister(src)
        client.unregister(dst)
    return results


def _expect(what, results, expected):
    failed = len(results) - results.count(expected)
    if failed:
        outcomes = Counter(strerror(r) if r < 0 else f"returned {r}"
                           for r in results if r != expected)
        summary = ", ".join(f"{n} x {text}" for text, n in outcomes.most_common())
        raise RuntimeError(f"{what}: {failed} of {len(results)} keys failed ({summary})")


def _result(op, size, count, rounds, latencies):
    result = {"op": op, "size": size, "count": count, "batches_per_round": rounds[0][0]}
    if op != "exists":
        result["gb_per_s"] = _median_rate(rounds, count * size) / 1e9
    result["mkeys_per_s"] = _median_rate(rounds, count) / 1e6
    result["batch_ms_p50"] = statistics.median(latencies) * 1e3
    return result


def _against(result, ceilings):
    """The ceilings measured between the result's rounds, and the result's
    GB/s as a percentage of each."""
    shares = dict(ceilings)
    if "gb_per_s" in result:
        for name, gbps in ceilings.items():
            shares["pct_of_" + name.split("_")[0]] = 100 * result["gb_per_s"] / gbps
    return shares


@contextlib.contextmanager
def _server(args):
    """The URL to measure: args.url, or a server started in its own process
    (client and server must not share a GIL)."""
    if args.url:
        yield args.url
        return
    # Every size's put window, twice over, so the background eviction (at
    # 95% of the pool) never takes the objects being read.
    memory = 2 * sum(max(args.count * size, PUT_WINDOW) for size in args.sizes) + (256 << 20)
    command = [sys.executable, "-m", "gdrkv", "serve", "--listen", "127.0.0.1:0",
               "--memory", str(memory), "--no-pretouch"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("gdrkv listening on "):
            raise RuntimeError(f"the server did not start: {' '.join(command)}")
        yield "gdrkv://" + line.split()[3]
    finally:
        proc.terminate()
        _reap(proc)


# ---------------------------------------------------------------- ceilings

class _Ceilings:
    """The loopback TCP stream (through receive(j), see _tcp_stream) and
    memcpy, a round of each at a time."""

    def __init__(self, receive):
        self._src, self._dst = _pattern(CEILING_BYTES), _touched(CEILING_BYTES)
        src, dst = _address(self._src), _address(self._dst)
        self._batches = {"tcp": receive,
                         "memcpy": lambda j: ctypes.memmove(dst, src, CEILING_BYTES)}
        self._per_round = {name: _batches_per_round(batch, math.inf, _nothing)
                           for name, batch in self._batches.items()}
        self._gb_per_s = {name: [] for name in self._batches}

    def sample(self):
        for name, batch in self._batches.items():
            n = self._per_round[name]
            self._gb_per_s[name].append(n * CEILING_BYTES / _timed_round(batch, n, []) / 1e9)

    def rounds(self):
        return len(self._gb_per_s["tcp"])

    def medians(self, since=0):
        return {f"{name}_gb_per_s": statistics.median(rates[since:])
                for name, rates in self._gb_per_s.items()}


@contextlib.contextmanager
def _tcp_stream():
    """Yields receive(j), which asks a sender process for CEILING_BYTES over
    loopback and receives them into a touched buffer."""
    listener = socket.create_server(("127.0.0.1", 0))
    code = f"from gdrkv.bench import send_stream; send_stream({listener.getsockname()[1]})"
    sender = subprocess.Popen([sys.executable, "-c", code])
    try:
        with listener:
            listener.settimeout(START_TIMEOUT_S)
            conn, _ = listener.accept()
        with conn:
            conn.settimeout(START_TIMEOUT_S)
            view = memoryview(_touched(CEILING_BYTES))

            def receive(j):
                conn.sendall(b"g")
                got = 0
                while got < CEILING_BYTES:
                    n = conn.recv_into(view[got:])
                    if n == 0:
                        raise RuntimeError("the TCP ceiling sender quit")
                    got += n

            yield receive
    finally:
        _reap(sender)   # it quits once the connection is closed


def send_stream(port):
    """The TCP ceiling's sender: for every b"g" received, sends CEILING_BYTES
    of a touched buffer in CEILING_CHUNK sendall() calls."""
    view = memoryview(_pattern(CEILING_BYTES))
    with socket.create_connection(("127.0.0.1", port)) as sock:
        while sock.recv(1) == b"g":
            for off in range(0, CEILING_BYTES, CEILING_CHUNK):
                sock.sendall(view[off:off + CEILING_CHUNK])


# ---------------------------------------------------------------- measuring

def _measure(batch, repeat, max_batches, reset, after_round):
    """Times `repeat` rounds of batch(0), ..., batch(n-1); returns ([(n,
    seconds) per round], [seconds per batch]). reset(), when given, runs
    untimed before every round; after_round() runs after it."""
    reset = reset or _nothing
    n = _batches_per_round(batch, max_batches, reset)
    rounds, latencies = [], []
    for _ in range(repeat):
        reset()
        rounds.append((n, _timed_round(batch, n, latencies)))
        after_round()
    return rounds, latencies


def _batches_per_round(batch, max_batches, reset):
    """How many batches last about MIN_ROUND_S (at most max_batches), from
    one batch timed after a warm-up one (first touches, connections)."""
    reset()
    batch(0)
    reset()
    start = time.perf_counter()
    batch(0)
    return int(min(max_batches, math.ceil(MIN_ROUND_S / (time.perf_counter() - start))))


def _timed_round(batch, n, latencies):
    """Seconds that batch(0..n-1) took; each batch's time goes to latencies."""
    round_start = time.perf_counter()
    for j in range(n):
        start = time.perf_counter()
        batch(j)
        latencies.append(time.perf_counter() - start)
    return time.perf_counter() - round_start


def _median_rate(rounds, units_per_batch):
    return statistics.median(n * units_per_batch / seconds for n, seconds in rounds)


def _nothing():
    pass


def _reap(proc):
    """Waits for a child that was told to stop; kills it if it does not."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- memory

def _pattern(nbytes):
    """nbytes of random-looking data, every page written."""
    block = bytearray(os.urandom(PATTERN_BLOCK))
    buf = block * (nbytes // PATTERN_BLOCK + 1)
    del buf[nbytes:]
    return buf


def _touched(nbytes):
    """A zeroed buffer with every page already faulted in."""
    buf = bytearray(nbytes)
    buf[::mmap.PAGESIZE] = bytes(len(range(0, nbytes, mmap.PAGESIZE)))
    return buf


def _address(buf):
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


# ---------------------------------------------------------------- output

def _table(results, ceilings):
    rows = [["size", "op", "GB/s", "Mkeys/s", "batch p50 ms", "% TCP ceiling", "% memcpy"]]
    for r in results:
        rows.append([format_size(r["size"]), r["op"], _number(r.get("gb_per_s"), ".2f"),
                     _number(r["mkeys_per_s"], ".3f"), _number(r["batch_ms_p50"], ".3f"),
                     _number(r.get("pct_of_tcp"), ".0f"), _number(r.get("pct_of_memcpy"), ".0f")])
    if not ceilings:
        return format_table([row[:5] for row in rows])
    return (format_table(rows) + "\n"
            f"ceilings, median of all rounds: loopback TCP stream {ceilings['tcp_gb_per_s']:.2f} "
            f"GB/s, memcpy {ceilings['memcpy_gb_per_s']:.2f} GB/s (each row's % is against the "
            "ceiling rounds run between its own rounds)")


def _number(value, spec):
    return "-" if value is None else format(value, spec)


def _report(args, results, ceilings):
    options = {k: v for k, v in vars(args).items() if k not in ("run", "command")}
    return {"machine": {"cpus": os.cpu_count(), "cpu_model": cpu_model()},
            "options": options, "ceilings": ceilings, "results": results}


class _Progress:
    """A one-line text bar on stderr, counting measurement rounds."""

    WIDTH = 30

    def __init__(self, total, enabled):
        self.total, self.done, self.enabled = total, 0, enabled

    def step(self, label):
        self.done += 1
        if self.enabled:
            filled = self.WIDTH * self.done // self.total
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (self.WIDTH - filled)}] "
                             f"{self.done}/{self.total} {label:<16}")
            sys.stderr.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.enabled:     # leaves the line blank for what is printed next
            sys.stderr.write("\r" + " " * (self.WIDTH + 40) + "\r")
            sys.stderr.flush()


# ---------------------------------------------------------------- arguments

def _sizes(text):
    try:
        sizes = [parse_size(s) for s in text.split(",")]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if 0 in sizes:
        raise argparse.ArgumentTypeError("sizes must be positive")
    return sizes


def _positive(text):
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    return int(text)


def _ops(text):
    ops = text.split(",")
    unknown = set(ops) - set(OPS)
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown op {sorted(unknown)[0]!r}; ops: {', '.join(OPS)}")
    return [op for op in OPS if op in ops]
