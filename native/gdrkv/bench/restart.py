"""gdrkv bench --restart: how long a server takes to come back on a full
pool file (`gdrkv serve --pool-file`, docs/operations.md "Restarts").

For each object size: a server in this process on a pool file of
--restart-memory in --restart-dir (tmpfs by default), started empty and
filled to 90% over shm with batches of --count objects (fewer for large
sizes: no batch may evict), then closed. A new
server on that file is timed from the call until it serves (Server()
returns, every object re-attached: one is read back to check), --repeat
times; beside it, in the same run, a server started on a fresh memfd pool of
the same size, which is what every start costs without a re-attach. Both
start without pretouch. The re-attach reads a header per chunk and inserts
an index entry per object, so its time grows with the pool and its object
count: the per-64-GiB column scales the measured time by pool size.
"""
import os
import statistics
import tempfile
import time

from ..client import Client
from ..server import Server
from ..sizes import format_size, parse_size
from ..table import format_table
from . import harness

FILL = 0.9
SCALE = 64 << 30


def add_arguments(parser):
    parser.add_argument("--restart", action="store_true",
                        help="time a server's restart on a full --pool-file against a start "
                             "on an empty pool, per object size (--sizes, default 4KiB,64KiB)")
    parser.add_argument("--restart-memory", type=parse_size, default=parse_size("4GiB"),
                        metavar="SIZE", help="pool of the --restart runs (default 4GiB)")
    parser.add_argument("--restart-dir", default="/dev/shm", metavar="DIR",
                        help="where the --restart pool file goes (default /dev/shm)")


def run(args):
    memory, sizes = args.restart_memory, args.sizes
    free = os.statvfs(args.restart_dir)
    if free.f_bavail * free.f_frsize < memory + (64 << 20):
        print(f"gdrkv bench: {args.restart_dir} has {format_size(free.f_bavail * free.f_frsize)} "
              f"free, less than a {format_size(memory)} pool file", flush=True)
        return 1
    fd, path = tempfile.mkstemp(prefix="gdrkv-bench-", suffix=".pool", dir=args.restart_dir)
    os.close(fd)
    rows = []
    try:
        for size in sizes:
            rows.append(_measure(path, memory, size, args))
            print(_table(rows[-1:]), flush=True)
    finally:
        os.unlink(path)
    report = {"options": {"memory": memory, "sizes": sizes, "count": args.count,
                          "repeat": args.repeat, "dir": args.restart_dir},
              "results": rows}
    harness.write_json(args.json, report)
    return 0


def _measure(path, memory, size, args):
    objects, value = _fill(path, memory, size, args.count)
    restarts, empties = [], []
    for _ in range(args.repeat):
        start = time.perf_counter()
        with Server(memory=memory, pool_file=path, pretouch=False, rdma="off") as server:
            restarts.append(time.perf_counter() - start)
            stats = server.stats()
            if stats["restored_objects"] != objects:
                raise RuntimeError(f"{stats['restored_objects']} objects re-attached of {objects}")
            with Client(server.url, namespace="bench-restart") as client:
                if client.get(f"{size}/0") != value:
                    raise RuntimeError("an object came back with other bytes")
        start = time.perf_counter()
        with Server(memory=memory, pretouch=False, rdma="off"):
            empties.append(time.perf_counter() - start)
    restart, empty = statistics.median(restarts), statistics.median(empties)
    return {"size": size, "memory": memory, "objects": objects, "restart_s": restart,
            "empty_start_s": empty, "restart_s_per_64gib": restart * SCALE / memory}


def _fill(path, memory, size, count):
    """Fills a fresh pool file to FILL with objects of size bytes (all the
    same bytes: what a restart costs does not depend on them): how many, and
    their bytes."""
    # Batches of at most 1/20 of the pool, so the fill never evicts.
    count = max(1, min(count, memory // 20 // size))
    value = harness.pattern(size)
    src = harness.touched(size * count)
    for i in range(count):
        src[i * size:(i + 1) * size] = value
    with Server(memory=memory, pool_file=path, reset_pool_file=True, pretouch=False,
                rdma="off") as server, \
            Client(server.url, namespace="bench-restart", transport="shm") as client:
        base, _ = client.register(src)
        ptrs, sizes = [base + i * size for i in range(count)], [size] * count
        n = 0
        while server.stats()["pool_used_bytes"] < FILL * memory:
            keys = [f"{size}/{n + i}" for i in range(count)]
            harness.expect(f"fill {format_size(size)}", client.batch_put(keys, ptrs, sizes), 0)
            n += count
        client.unregister(base)
        stats = server.stats()
        if stats["evictions"]:
            raise RuntimeError(f"the fill of {format_size(size)} objects evicted some")
        return stats["objects"], bytes(value)


def _table(rows):
    out = [["size", "pool", "objects", "restart s", "empty start s", "restart s per 64 GiB"]]
    for r in rows:
        out.append([format_size(r["size"]), format_size(r["memory"]), str(r["objects"]),
                    f"{r['restart_s']:.3f}", f"{r['empty_start_s']:.3f}",
                    f"{r['restart_s_per_64gib']:.2f}"])
    return format_table(out)
