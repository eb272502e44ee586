"""gdrkv's own rows of `gdrkv bench`: batched put/get/exists of one object
size against a server, checked byte for byte, with the ceilings measured
between its rounds."""
import math

from ..sizes import format_size
from ..table import format_table
from . import harness
from .harness import number


def bench_size(client, size, args, ceilings, progress):
    """Measures the chosen ops on batches of args.count objects of size bytes."""
    count, batch_bytes, label = args.count, args.count * size, format_size(size)
    src, dst = harness.pattern(batch_bytes), harness.touched(batch_bytes)
    src_ptr, _ = client.register(src)
    dst_ptr, _ = client.register(dst)
    sizes = [size] * count
    src_ptrs = [src_ptr + i * size for i in range(count)]
    dst_ptrs = [dst_ptr + i * size for i in range(count)]
    window = max(1, harness.PUT_WINDOW // batch_bytes)
    keys = [[f"{size}/{j}/{i}" for i in range(count)] for j in range(window)]
    stored = set()

    def put(j):
        harness.expect(f"put {label}", client.batch_put(keys[j], src_ptrs, sizes), 0)
        stored.add(j)

    def delete_stored():
        # Checked: keys that failed to go would make the next puts no-ops.
        for j in stored:
            harness.expect(f"delete {label}", client.batch_delete(keys[j]), 0)
        stored.clear()

    def get(j):
        harness.expect(f"get {label}", client.batch_get(keys[0], dst_ptrs, sizes), size)

    def exists(j):
        if not all(client.batch_exists(keys[0])):
            raise RuntimeError(f"exists {label}: stored keys are missing")

    def measure(op, batch, max_batches=math.inf, reset=None):
        first_ceiling = ceilings.rounds() if ceilings else 0

        def after_round():
            progress.step(f"{op} {label}")
            if ceilings:
                ceilings.sample()

        rounds, latencies = harness.measure(batch, args.repeat, max_batches, reset, after_round)
        result = harness.result(op, size, count, rounds, latencies)
        if ceilings:
            result.update(harness.against(result, ceilings.medians(since=first_ceiling)))
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


def table(results, ceilings):
    rows = [["size", "op", "GB/s", "Mkeys/s", "batch p50 ms", "% TCP ceiling", "% memcpy"]]
    for r in results:
        rows.append([format_size(r["size"]), r["op"], number(r.get("gb_per_s"), ".2f"),
                     number(r["mkeys_per_s"], ".3f"), number(r["batch_ms_p50"], ".3f"),
                     number(r.get("pct_of_tcp"), ".0f"), number(r.get("pct_of_memcpy"), ".0f")])
    if not ceilings:
        return format_table([row[:5] for row in rows])
    return (format_table(rows) + "\n"
            f"ceilings, median of all rounds: loopback TCP stream {ceilings['tcp_gb_per_s']:.2f} "
            f"GB/s, memcpy {ceilings['memcpy_gb_per_s']:.2f} GB/s (each row's % is against the "
            "ceiling rounds run between its own rounds)")
