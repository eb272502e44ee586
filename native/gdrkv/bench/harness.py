"""The measuring core shared by every `gdrkv bench` mode: rounds timed until
they last about MIN_ROUND_S, medians, pre-touched buffers, the ceilings
(the loopback TCP stream and memcpy) and a server in its own process.

Every number is the median over --repeat rounds; a round runs enough batches
to last about MIN_ROUND_S so the timer's resolution does not matter. With
ceilings, one round of each runs after every measured round, and each row is
compared with the ceiling rounds run between its own: on a shared machine
the load changes by the second, and a ceiling measured a minute earlier says
little. Buffers are touched before timing and reused, since first touch of
fresh memory is slow on some VMs and would be measured instead of gdrkv.
"""
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

from ..errors import strerror

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


def write_json(path, report):
    """--json PATH: the report, indented, when a path was given."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
            f.write("\n")


def expect(what, results, expected):
    failed = len(results) - results.count(expected)
    if failed:
        outcomes = Counter(strerror(r) if r < 0 else f"returned {r}"
                           for r in results if r != expected)
        summary = ", ".join(f"{n} x {text}" for text, n in outcomes.most_common())
        raise RuntimeError(f"{what}: {failed} of {len(results)} keys failed ({summary})")


def result(op, size, count, rounds, latencies):
    result = {"op": op, "size": size, "count": count, "batches_per_round": rounds[0][0]}
    if op != "exists":
        result["gb_per_s"] = median_rate(rounds, count * size) / 1e9
    result["mkeys_per_s"] = median_rate(rounds, count) / 1e6
    result["batch_ms_p50"] = statistics.median(latencies) * 1e3
    return result


def against(result, ceilings):
    """The ceilings measured between the result's rounds, and the result's
    GB/s as a percentage of each."""
    shares = dict(ceilings)
    if "gb_per_s" in result:
        for name, gbps in ceilings.items():
            shares["pct_of_" + name.split("_")[0]] = 100 * result["gb_per_s"] / gbps
    return shares


@contextlib.contextmanager
def server(args, flags=(), pretouch=False, memory=None):
    """The URL to measure: args.url, or a server started in its own process
    (client and server must not share a GIL), with these extra `gdrkv
    serve` flags (and --single-tenant when args.single_tenant); its pool
    faulted in at start with pretouch (else it starts faster), of memory
    bytes where that is more than the measurement needs."""
    if args.url:
        yield args.url
        return
    flags = list(flags) + (["--single-tenant"] if getattr(args, "single_tenant", False) else [])
    # Every size's put window, twice over, so the background eviction (at
    # 95% of the pool) never takes the objects being read.
    needed = 2 * sum(max(args.count * size, PUT_WINDOW) for size in args.sizes) + (256 << 20)
    memory = max(memory or 0, needed)
    command = [sys.executable, "-m", "gdrkv", "serve", "--listen", "127.0.0.1:0",
               "--memory", str(memory), *([] if pretouch else ["--no-pretouch"]), *flags]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        # Pretouching a pool of production size takes a while: allow 1 s per GiB more.
        ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S + (memory >> 30))
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("gdrkv listening on "):
            raise RuntimeError(f"the server did not start: {' '.join(command)}")
        yield "gdrkv://" + line.split()[3]
    finally:
        proc.terminate()
        reap(proc)


# ---------------------------------------------------------------- ceilings

class Ceilings:
    """The loopback TCP stream (through receive(j), see tcp_stream) and
    memcpy, a round of each at a time."""

    def __init__(self, receive):
        self._src, self._dst = pattern(CEILING_BYTES), touched(CEILING_BYTES)
        src, dst = address(self._src), address(self._dst)
        self._batches = {"tcp": receive,
                         "memcpy": lambda j: ctypes.memmove(dst, src, CEILING_BYTES)}
        self._per_round = {name: batches_per_round(batch, math.inf, nothing)
                           for name, batch in self._batches.items()}
        self._gb_per_s = {name: [] for name in self._batches}

    def sample(self):
        for name, batch in self._batches.items():
            n = self._per_round[name]
            self._gb_per_s[name].append(n * CEILING_BYTES / timed_round(batch, n, []) / 1e9)

    def rounds(self):
        return len(self._gb_per_s["tcp"])

    def medians(self, since=0):
        return {f"{name}_gb_per_s": statistics.median(rates[since:])
                for name, rates in self._gb_per_s.items()}


@contextlib.contextmanager
def tcp_stream():
    """Yields receive(j), which asks a sender process for CEILING_BYTES over
    loopback and receives them into a touched buffer."""
    listener = socket.create_server(("127.0.0.1", 0))
    code = f"from gdrkv.bench.harness import send_stream; send_stream({listener.getsockname()[1]})"
    sender = subprocess.Popen([sys.executable, "-c", code])
    try:
        with listener:
            listener.settimeout(START_TIMEOUT_S)
            conn, _ = listener.accept()
        with conn:
            conn.settimeout(START_TIMEOUT_S)
            view = memoryview(touched(CEILING_BYTES))

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
        reap(sender)   # it quits once the connection is closed


def send_stream(port):
    """The TCP ceiling's sender: for every b"g" received, sends CEILING_BYTES
    of a touched buffer in CEILING_CHUNK sendall() calls."""
    view = memoryview(pattern(CEILING_BYTES))
    with socket.create_connection(("127.0.0.1", port)) as sock:
        while sock.recv(1) == b"g":
            for off in range(0, CEILING_BYTES, CEILING_CHUNK):
                sock.sendall(view[off:off + CEILING_CHUNK])


# ---------------------------------------------------------------- measuring

def measure(batch, repeat, max_batches, reset, after_round):
    """Times `repeat` rounds of batch(0), ..., batch(n-1); returns ([(n,
    seconds) per round], [seconds per batch]). reset(), when given, runs
    untimed before every round; after_round() runs after it."""
    reset = reset or nothing
    n = batches_per_round(batch, max_batches, reset)
    rounds, latencies = [], []
    for _ in range(repeat):
        reset()
        rounds.append((n, timed_round(batch, n, latencies)))
        after_round()
    return rounds, latencies


def batches_per_round(batch, max_batches, reset):
    """How many batches last about MIN_ROUND_S (at most max_batches), from
    one batch timed after a warm-up one (first touches, connections)."""
    reset()
    batch(0)
    reset()
    start = time.perf_counter()
    batch(0)
    return int(min(max_batches, math.ceil(MIN_ROUND_S / (time.perf_counter() - start))))


def timed_round(batch, n, latencies):
    """Seconds that batch(0..n-1) took; each batch's time goes to latencies."""
    round_start = time.perf_counter()
    for j in range(n):
        start = time.perf_counter()
        batch(j)
        latencies.append(time.perf_counter() - start)
    return time.perf_counter() - round_start


def median_rate(rounds, units_per_batch):
    return statistics.median(n * units_per_batch / seconds for n, seconds in rounds)


def nothing():
    pass


def reap(proc):
    """Waits for a child that was told to stop; kills it if it does not."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- memory

def pattern(nbytes):
    """nbytes of random-looking data, every page written."""
    block = bytearray(os.urandom(PATTERN_BLOCK))
    buf = block * (nbytes // PATTERN_BLOCK + 1)
    del buf[nbytes:]
    return buf


def touched(nbytes):
    """A zeroed buffer with every page already faulted in."""
    buf = bytearray(nbytes)
    buf[::mmap.PAGESIZE] = bytes(len(range(0, nbytes, mmap.PAGESIZE)))
    return buf


def address(buf):
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def number(value, spec):
    return "-" if value is None else format(value, spec)


class Progress:
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
