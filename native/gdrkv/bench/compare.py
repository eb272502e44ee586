"""gdrkv bench --compare: gdrkv and its peers on one workload in one run.

Every system stores, reads and looks up the same batches of --count objects
from the same pre-touched buffers, round after round, with the loopback TCP
stream and memcpy ceilings sampled after every round (see harness.py): gdrkv
over each transport the client accepts, Mooncake Store over TCP, Redis
(pipelined SET and EXISTS, MGET). Then the engine-level shootouts of
engines.py. A system this machine lacks is reported as such, never
silently dropped.

Mooncake binds 0.0.0.0 whatever it is told, so when it is installed the
whole comparison re-runs itself inside a private network namespace holding
only loopback, where gdrkv, Redis and Mooncake share that loopback and
nothing can reach them from outside.
"""
import contextlib
import ctypes
import datetime
import math
import os
import shutil
import subprocess
import sys
import tempfile

from ..sizes import format_size, physical_memory
from ..sysinfo.host import cpu_model
from ..table import format_table
from . import engines as bench_engines
from . import harness, peers, plot
from .harness import number

DEFAULT_SIZES = "4KiB,64KiB,1MiB,4MiB"
BASELINE = "gdrkv tcp"
MEASURED = "measured"


def run(args):
    if args.url:
        print("gdrkv bench: --compare starts every server itself; it takes no --url",
              file=sys.stderr)
        return 2
    if _wants_private_netns():
        command = peers.private_netns_command(
            [sys.executable, "-m", "gdrkv", "bench", *_argv(args)])
        if command:
            return subprocess.call(command)
    logs = tempfile.mkdtemp(prefix="gdrkv-compare-")
    try:
        report = _compare(args, logs)
    except (RuntimeError, OSError) as e:
        print(f"gdrkv bench: {e} (peer logs in {logs})", file=sys.stderr)
        return 1
    if not any(status.startswith("failed") for status in report["systems"].values()):
        shutil.rmtree(logs, ignore_errors=True)     # else the failures point there
    report["png"] = _plot(report, args.png)
    print(_tables(report))
    harness.write_json(args.json, report)
    return 0


def _wants_private_netns():
    if os.environ.get(peers.NETNS_ENV) == "1":
        return False
    try:
        import mooncake.store  # noqa: F401  (only whether it imports)
    except ImportError:
        return False
    return True


def _argv(args):
    """The command line of args, for the run inside the namespace."""
    argv = ["--compare", "--sizes", ",".join(map(str, args.sizes)), "--count", str(args.count),
            "--repeat", str(args.repeat), "--ops", ",".join(args.ops)]
    for flag in ("json", "png"):
        if getattr(args, flag):
            argv += [f"--{flag}", os.path.abspath(getattr(args, flag))]
    return argv + (["--quiet"] if args.quiet else [])


def _compare(args, logs):
    # The most one peer holds at once: a size's put window or one batch
    # (see _compare_size), with room for its allocator.
    capacity = int(1.5 * max(max(harness.PUT_WINDOW, args.count * s) for s in args.sizes))
    capacity += 64 << 20
    with contextlib.ExitStack() as stack:
        ceilings = harness.Ceilings(stack.enter_context(harness.tcp_stream()))
        url = stack.enter_context(harness.server(args))
        stores = stack.enter_context(peers.open_stores(url, capacity, logs))
        measured = {name: store for name, store in stores.items() if not isinstance(store, str)}
        engines, engine_reasons = bench_engines.available(stores)
        rounds = (len(measured) * len(args.sizes) * len(args.ops)
                  + len(engines) * len(bench_engines.OPS)) * args.repeat
        progress = stack.enter_context(
            harness.Progress(rounds, enabled=sys.stderr.isatty() and not args.quiet))
        failed = {}
        results = [row for size in args.sizes
                   for row in _compare_size(measured, failed, size, args, ceilings, progress)]
        results = [row for row in results if row["system"] not in failed]
        engine_results, engine_failures = bench_engines.run(url, stores, engines, args,
                                                            progress, logs)
    _add_ratios(results, "system", ("size", "op"), BASELINE)
    _add_ratios(engine_results, "system", ("engine", "op"), BASELINE)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "cpu_model": cpu_model(),
                    "memory_bytes": physical_memory()},
        "options": {"sizes": args.sizes, "count": args.count, "repeat": args.repeat,
                    "ops": args.ops},
        "systems": {name: failed.get(name, MEASURED) if name in measured else store
                    for name, store in stores.items()},
        "ceilings": ceilings.medians(),
        "results": results,
        "engines": {"systems": {**{f"{e} {s}": MEASURED for e, s in engines},
                                **engine_reasons, **engine_failures},
                    "results": engine_results},
    }


def _compare_size(stores, failed, size, args, ceilings, progress):
    """The rows for objects of size bytes of every store not in failed, all
    moving the same source buffer into the same destination buffer. A store
    that fails goes into failed ({name: why}): a peer that breaks costs its
    own rows, not the comparison."""
    count, batch_bytes, label = args.count, args.count * size, format_size(size)
    src, dst = harness.pattern(batch_bytes), harness.touched(batch_bytes)
    # Every put batch of a round needs fresh keys: a stored key is not stored again.
    window = max(1, harness.PUT_WINDOW // batch_bytes)
    keys = [[f"{size}/{j}/{i}" for i in range(count)] for j in range(window)]
    results = []
    for name, store in stores.items():
        if name in failed:
            continue
        ctypes.memset(harness.address(dst), 0, batch_bytes)
        store.attach(src, dst, size, count)
        try:
            rows = _measure_store(name, store, keys, size, args, ceilings, progress)
            if "get" in args.ops and dst != src:
                raise RuntimeError("get: the bytes read differ from the bytes put")
            results += rows
        except RuntimeError as e:
            failed[name] = f"failed at {label}: {e}"
        finally:
            store.detach()
    return results


def _measure_store(name, store, keys, size, args, ceilings, progress):
    """name's rows for one size; puts take fresh keys from keys[j], gets
    and lookups read keys[0]."""
    label, stored = format_size(size), set()

    def put(j):
        store.put(keys[j])
        stored.add(j)

    def delete_stored():
        for j in stored:
            store.delete(keys[j])
        stored.clear()

    def measure(op, batch, max_batches=math.inf, reset=None):
        first_ceiling = ceilings.rounds()

        def after_round():
            progress.step(f"{name} {op} {label}")
            ceilings.sample()

        rounds, latencies = harness.measure(batch, args.repeat, max_batches, reset, after_round)
        row = {"system": name, **harness.result(op, size, len(keys[0]), rounds, latencies)}
        row.update(harness.against(row, ceilings.medians(since=first_ceiling)))
        return row

    rows = []
    try:
        if "put" in args.ops:
            rows.append(measure("put", put, len(keys), delete_stored))
        else:
            put(0)
        if "get" in args.ops:
            rows.append(measure("get", lambda j: store.get(keys[0])))
        if "exists" in args.ops:
            rows.append(measure("exists", lambda j: store.exists(keys[0])))
    finally:
        delete_stored()     # each size starts from an empty store
    return rows


# ---------------------------------------------------------------- output

def _add_ratios(rows, column, group, baseline):
    """Adds baseline_x to every row: the baseline system's rate divided by
    the row's, for the rows that share the group's values."""
    rates = {tuple(r[g] for g in group): _rate(r) for r in rows if r[column] == baseline}
    for row in rows:
        base = rates.get(tuple(row[g] for g in group))
        if base is not None:
            row["baseline_x"] = base / _rate(row)


def _rate(row):
    for metric in ("gb_per_s", "pages_per_s", "mkeys_per_s"):
        if row.get(metric):
            return row[metric]
    raise ValueError(f"row without a rate: {row}")


def _plot(report, path):
    """Where the PNG went, or why there is none."""
    if not path:
        return "not asked for (--png)"
    try:
        plot.plot(report, path)
    except ImportError:
        return "skipped: matplotlib is not installed (tests/install_peers.sh)"
    return path


def _tables(report):
    rows = [["size", "op", "system", "GB/s", "Mkeys/s", "batch p50 ms", "% TCP ceiling",
             "% memcpy", f"{BASELINE} x"]]
    for r in report["results"]:
        rows.append([format_size(r["size"]), r["op"], r["system"],
                     number(r.get("gb_per_s"), ".2f"), number(r["mkeys_per_s"], ".3f"), number(r["batch_ms_p50"], ".3f"),
                     number(r.get("pct_of_tcp"), ".0f"), number(r.get("pct_of_memcpy"), ".0f"),
                     number(r.get("baseline_x"), ".2f")])
    ceilings = report["ceilings"]
    lines = [format_table(rows),
             (f"ceilings, median of all rounds: loopback TCP stream "
              f"{ceilings['tcp_gb_per_s']:.2f} GB/s, "
              f"memcpy {ceilings['memcpy_gb_per_s']:.2f} GB/s"),
             *_not_measured(report["systems"])]
    engine_rows = [["engine", "op", "system", "pages/s", "GB/s", "page", "pages/call",
                    "call p50 ms", f"{BASELINE} x"]]
    for r in report["engines"]["results"]:
        engine_rows.append([r["engine"], r["op"], r["system"], f"{r['pages_per_s']:.0f}",
                            number(r["gb_per_s"], ".2f"), format_size(r["page_bytes"]),
                            str(r["pages_per_call"]), f"{r['call_ms_p50']:.3f}",
                            number(r.get("baseline_x"), ".2f")])
    if len(engine_rows) > 1:
        lines += ["", format_table(engine_rows)]
    lines += _not_measured(report["engines"]["systems"])
    lines.append(f"plot: {report['png']}")
    return "\n".join(lines)


def _not_measured(systems):
    return [f"{name}: {status}" for name, status in systems.items() if status != MEASURED]
