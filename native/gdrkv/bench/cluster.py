"""gdrkv bench --cluster N: a cluster on this machine, one etcd and N
`gdrkv serve` members (each on a loopback address and zone of its own,
--cluster-ttl-ms leases), under the load of --cluster-clients clients of
gdrkv+etcd://...?replicas=--cluster-replicas, through a kill, a join and a
leave (docs/operations.md, "Cluster"). It reports:
  - throughput: keys/s of the same load against one member (gdrkv://) and
    against the cluster;
  - detection: SIGKILL of a member -> every client's table without it
    (goal: at most the TTL + 1 s);
  - fall-over: that kill -> the first successful GET of a key the killed
    member owned, from its replica;
  - keys moved on a join: the share of keys whose owner changed, against
    the ideal (the new member's share of the capacity);
  - failed keys through the kill, the join and the leave (goal: 0 with
    replicas >= 2), and with --png a plot of keys/s and failures over time.
Needs etcd (Debian's etcd-server) on PATH.
"""
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from ..client import Client, place
from ..cluster.etcd import Etcd, EtcdError
from ..cluster.members import parse_entry, prefix
from ..errors import E_NOT_FOUND
from ..table import format_table
from . import harness

SIZE = 4096
KEYS = 2048                 # stored before the load; GETs read them back
WRITES = 4096               # keys each client writes over and over
BATCH = 32
BUCKET_S = 0.1
START_TIMEOUT_S = 30.0
PLACEMENT_SAMPLE = 20000
NAMESPACE = "bench-cluster"


def add_arguments(parser):
    parser.add_argument("--cluster", type=int, metavar="N",
                        help="start etcd and N servers here and measure the cluster through "
                             "a kill, a join and a leave (docs/operations.md, \"Cluster\")")
    parser.add_argument("--cluster-clients", type=int, default=4, metavar="K",
                        help="clients under load, each a thread of its own (default 4)")
    parser.add_argument("--cluster-replicas", type=int, default=2, metavar="R",
                        help="the clients' replicas (default 2)")
    parser.add_argument("--cluster-ttl-ms", type=int, default=5000, metavar="MS",
                        help="the members' etcd lease (default 5000)")
    parser.add_argument("--cluster-seconds", type=float, default=3.0, metavar="S",
                        help="each throughput run, and each quiet span of the timeline "
                             "(default 3)")


def run(args):
    if args.cluster < 2:
        print("gdrkv bench: --cluster needs at least 2 servers", file=sys.stderr)
        return 2
    if not shutil.which("etcd"):
        print("gdrkv bench: --cluster needs etcd on PATH (Debian: etcd-server)", file=sys.stderr)
        return 1
    workdir = tempfile.mkdtemp(prefix="gdrkv-bench-cluster-")
    procs = []
    try:
        endpoint = _start_etcd(workdir, procs)
        name = f"bench-{os.getpid()}"
        bench = _Bench(args, endpoint, name, procs)
        report = bench.measure()
    except (RuntimeError, OSError, EtcdError) as e:
        print(f"gdrkv bench: {e}", file=sys.stderr)
        return 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            harness.reap(proc)
        shutil.rmtree(workdir, ignore_errors=True)
    report["png"] = _plot(report, args.png)
    print(_table(report))
    harness.write_json(args.json, report)
    return 0


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _start_etcd(workdir, procs):
    client_port, peer_port = _free_ports(2)
    client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    log = open(os.path.join(workdir, "etcd.log"), "wb")
    procs.append(subprocess.Popen(
        ["etcd", "--name", "bench", "--data-dir", os.path.join(workdir, "etcd"),
         "--listen-client-urls", client, "--advertise-client-urls", client,
         "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
         "--initial-cluster", f"bench={peer}"], stdout=log, stderr=log,
        stdin=subprocess.DEVNULL))
    endpoint = f"127.0.0.1:{client_port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            Etcd([endpoint]).put(b"/ready", b"1")
            return endpoint
        except EtcdError:
            if procs[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not start (see {workdir}/etcd.log)") from None
            time.sleep(0.05)


class _Bench:
    def __init__(self, args, endpoint, name, procs):
        self.args, self.name, self.procs = args, name, procs
        self.etcd = Etcd([endpoint])
        self.server_url = f"etcd://{endpoint}/{name}"
        self.url = f"gdrkv+etcd://{endpoint}/{name}?replicas={args.cluster_replicas}"
        self.members = {}       # address -> its process
        self.events = []        # (seconds since the load began, what)

    def start_member(self, i):
        command = [sys.executable, "-m", "gdrkv", "serve", "--listen", f"127.0.0.{i + 2}:0",
                   "--memory", "256MiB", "--no-pretouch", "--cluster", self.server_url,
                   "--zone", f"z{i}", "--cluster-ttl-ms", str(self.args.cluster_ttl_ms),
                   "--cluster-leave-ms", "1000"]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        line = proc.stdout.readline()
        if not line.startswith("gdrkv listening on "):
            raise RuntimeError(f"a member did not start: {' '.join(command)}")
        address = line.split()[3]
        self.members[address] = proc
        self.wait_entries(lambda found: address in found, f"{address} in etcd")
        return address

    def entries(self):
        return {m.addr: m for m in (parse_entry(self.name, k, v)
                                    for k, v, _ in self.etcd.range_prefix(prefix(self.name))[1])
                if m}

    def wait_entries(self, done, what):
        deadline = time.monotonic() + START_TIMEOUT_S
        while not done(self.entries()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.02)

    def measure(self):
        n = self.args.cluster
        for i in range(n):
            self.start_member(i)
        first = next(iter(self.members))
        single = _Load(f"gdrkv://{first}", self.args).run_for(self.args.cluster_seconds)
        cluster = _Load(self.url, self.args).run_for(self.args.cluster_seconds)
        load = _Load(self.url, self.args)
        with load.running():
            time.sleep(self.args.cluster_seconds)
            detection, fallover = self.kill(load, list(self.members)[-1])
            time.sleep(self.args.cluster_seconds)
            moved, ideal = self.join(load, n)
            time.sleep(self.args.cluster_seconds)
            self.leave(load, first)
            time.sleep(self.args.cluster_seconds)
        return {"options": {"servers": n, "clients": self.args.cluster_clients,
                            "replicas": self.args.cluster_replicas,
                            "ttl_ms": self.args.cluster_ttl_ms, "size": SIZE, "batch": BATCH},
                "single_keys_per_s": single, "cluster_keys_per_s": cluster,
                "detection_s": detection, "fallover_s": fallover,
                "join_moved_share": moved, "join_ideal_share": ideal,
                "failed_keys": load.failed, "missed_keys": load.missed,
                "timeline": load.timeline(), "events": load.events}

    def kill(self, load, victim):
        """SIGKILLs victim: (seconds until every client's table lost it,
        seconds until a key it owned was read from a replica)."""
        table = [(m.addr, m.capacity, m.zone, m.leaving) for m in self.entries().values()]
        index = [m[0] for m in table].index(victim)
        owned = next(k for k in load.keys if place(k, table, 1) == [index])
        with Client(self.url, namespace=NAMESPACE) as reader:
            buf = bytearray(SIZE)
            ptr = reader.register(buf)[0]
            start = time.monotonic()
            self.members.pop(victim).send_signal(signal.SIGKILL)
            load.mark("kill")
            while reader.batch_get([owned], [ptr], [SIZE])[0] != SIZE:
                if time.monotonic() - start > START_TIMEOUT_S:
                    raise RuntimeError("no replica answered for a killed member's key")
            fallover = time.monotonic() - start
        while any(victim in _table_of(c) for c in load.clients):
            if time.monotonic() - start > START_TIMEOUT_S:
                raise RuntimeError("the clients never dropped the killed member")
            time.sleep(0.005)
        return time.monotonic() - start, fallover

    def join(self, load, i):
        """Starts member i: (share of keys whose owner changed, ideal share)."""
        before = [(m.addr, m.capacity, m.zone, m.leaving) for m in self.entries().values()]
        load.mark("join")
        self.start_member(i)
        load.mark("joined")
        after = [(m.addr, m.capacity, m.zone, m.leaving) for m in self.entries().values()]
        keys = [f"placement-{random.getrandbits(64)}" for _ in range(PLACEMENT_SAMPLE)]
        moved = sum(before[place(k, before)[0]][0] != after[place(k, after)[0]][0]
                    for k in keys)
        return moved / len(keys), 1 / len(after)

    def leave(self, load, address):
        load.mark("leave")
        proc = self.members.pop(address)
        proc.send_signal(signal.SIGTERM)
        proc.wait(START_TIMEOUT_S)


class _Load:
    """args.cluster_clients threads, each its own client of url, reading
    back the KEYS stored first and storing fresh keys, per BUCKET_S the
    keys served, failed (neither served nor a miss) and missed."""

    def __init__(self, url, args):
        self.clients = [Client(url, namespace=NAMESPACE) for _ in
                        range(args.cluster_clients)]
        self.keys = [f"k{i}" for i in range(KEYS)]
        self.value = harness.pattern(SIZE)
        self.buffers = [(bytearray(self.value) * BATCH, bytearray(SIZE * BATCH))
                        for _ in self.clients]
        self.ptrs = [(c.register(src)[0], c.register(dst)[0])
                     for c, (src, dst) in zip(self.clients, self.buffers)]
        src = self.ptrs[0][0]
        for i in range(0, KEYS, BATCH):
            harness.expect("the keys read back", self.clients[0].batch_put(
                self.keys[i:i + BATCH], [src + j * SIZE for j in range(BATCH)],
                [SIZE] * BATCH), 0)
        self.counts = {}        # bucket -> [served, failed, missed]
        self.events = []
        self.failed = self.missed = 0
        self.stop = threading.Event()
        self.start = time.monotonic()
        self.lock = threading.Lock()

    def mark(self, what):
        self.events.append((round(time.monotonic() - self.start, 3), what))

    def count(self, served, failed, missed):
        bucket = int((time.monotonic() - self.start) / BUCKET_S)
        with self.lock:
            row = self.counts.setdefault(bucket, [0, 0, 0])
            row[0] += served
            row[1] += failed
            row[2] += missed
            self.failed += failed
            self.missed += missed

    def worker(self, i):
        """Reads BATCH random keys of KEYS, stores a missed one again (as an
        engine would after recomputing it), and stores BATCH keys of a
        window of WRITES of its own (new ones until it wraps, then the same:
        the pools never fill, so nothing is evicted)."""
        client, (src, dst) = self.clients[i], self.ptrs[i]
        rng = random.Random(i)
        n = 0
        while not self.stop.is_set():
            keys = rng.sample(self.keys, BATCH)
            got = client.batch_get(keys, [dst + j * SIZE for j in range(BATCH)], [SIZE] * BATCH)
            missed = [k for k, r in zip(keys, got) if r == E_NOT_FOUND]
            writes = missed + [f"w{i}-{(n + j) % WRITES}" for j in range(BATCH - len(missed))]
            put = client.batch_put(writes, [src + j * SIZE for j in range(BATCH)],
                                   [SIZE] * BATCH)
            n += BATCH - len(missed)
            self.count(sum(r == SIZE for r in got) + sum(r == 0 for r in put),
                       sum(r < 0 and r != E_NOT_FOUND for r in got) + sum(r < 0 for r in put),
                       len(missed))

    def running(self):
        load = self

        class Running:
            def __enter__(self):
                load.start = time.monotonic()
                load.threads = [threading.Thread(target=load.worker, args=(i,), daemon=True)
                                for i in range(len(load.clients))]
                for t in load.threads:
                    t.start()

            def __exit__(self, *exc):
                load.stop.set()
                for t in load.threads:
                    t.join()
                for c in load.clients:
                    c.close()
        return Running()

    def run_for(self, seconds):
        """keys/s over seconds of this load."""
        with self.running():
            time.sleep(seconds)
        served = sum(row[0] for row in self.counts.values())
        return served / seconds

    def timeline(self):
        last = max(self.counts, default=0)
        return [{"t": b * BUCKET_S, "keys_per_s": self.counts.get(b, [0])[0] / BUCKET_S,
                 "failed": self.counts.get(b, [0, 0])[1],
                 "missed": self.counts.get(b, [0, 0, 0])[2]} for b in range(last + 1)]


def _table_of(client):
    """The addresses in a client's own (C) server table, read without a
    round trip to any server."""
    return set(client.members())


def _plot(report, path):
    if not path:
        return "not asked for (--png)"
    try:
        from .plot import plot_timeline
        plot_timeline(report, path)
    except ImportError:
        return "skipped: matplotlib is not installed"
    return path


def _table(report):
    ttl = report["options"]["ttl_ms"] / 1000
    rows = [["measure", "value", "goal"],
            ["keys/s, one server", f"{report['single_keys_per_s']:.0f}", ""],
            [f"keys/s, cluster of {report['options']['servers']}, "
             f"replicas={report['options']['replicas']}",
             f"{report['cluster_keys_per_s']:.0f}", ""],
            ["detection: kill -> every table updated",
             f"{report['detection_s']:.2f} s", f"<= {ttl + 1:.1f} s"],
            ["fall-over: kill -> first GET from a replica",
             f"{report['fallover_s'] * 1000:.1f} ms", ""],
            ["keys moved on a join", f"{report['join_moved_share']:.3f}",
             f"<= {1.1 * report['join_ideal_share']:.3f} (1.1 x ideal)"],
            ["failed keys through kill, join, leave", str(report["failed_keys"]), "0"],
            ["missed keys through kill, join, leave", str(report["missed_keys"]), ""]]
    return format_table(rows) + f"\nplot: {report['png']}"
