"""`gdrkv stat --nic`: each RDMA port's hardware counters (sysfs counters/
and hw_counters/) next to the servers' own counters, so an operator sees
how many bytes really crossed each port. With --interval S: per-second
rates from two samples S seconds apart.
"""
import json
import time

from ..client import Client
from ..sizes import format_size
from ..sysinfo import rdma as sysinfo_rdma
from ..table import format_table

# Tests replace these to step time and change the fake counters between samples.
_sleep = time.sleep
_clock = time.monotonic

# Server counters that are levels, not running totals: no rate for them.
_SERVER_GAUGES = {"pool_bytes", "pool_used_bytes", "objects", "object_bytes",
                  "reserved_objects", "pinned_objects", "namespaces", "hugepages",
                  "uptime_seconds", "workers", "connections_current", "shm_enabled"}


def run(args, server_table):
    """server_table(servers) renders the servers' counters as `gdrkv stat` does."""
    first = _sample(args.url)
    if not args.interval:
        return _show(args, first, None, server_table)
    _sleep(args.interval)
    second = _sample(args.url)
    return _show(args, second, _rates(first, second), server_table)


def _sample(url):
    servers = None
    if url:
        with Client(url) as client:
            servers = client.stats()["servers"]
    return {"at": _clock(), "nic": sysinfo_rdma.all_port_counters(), "servers": servers}


def _nic_flat(sample):
    """{"dev/port": {row name: value}}, the data counters already in bytes."""
    flat = {}
    for port, counters in sample["nic"].items():
        row = {}
        for name, value in counters["counters"].items():
            if name.endswith("_data"):
                row[name.replace("_data", "_bytes")] = value * sysinfo_rdma.DATA_UNIT
            else:
                row[name] = value
        row.update(counters["hw_counters"])
        flat[port] = row
    return flat


def _rates(first, second):
    seconds = second["at"] - first["at"]
    nic = {port: _per_second(_nic_flat(first).get(port, {}), row, seconds, set())
           for port, row in _nic_flat(second).items()}
    servers = None
    if second["servers"] is not None:
        servers = {name: _per_second(first["servers"].get(name, {}), counters, seconds,
                                     _SERVER_GAUGES)
                   for name, counters in second["servers"].items()}
    return {"seconds": seconds, "nic": nic, "servers": servers}


def _per_second(before, after, seconds, gauges):
    """{name: rate} for running totals; gauges, floats and latency
    percentiles are left out, and a counter that went down (a reset, a
    restarted server) is None."""
    rates = {}
    for name, value in after.items():
        if name in gauges or name.startswith("latency_") or name.endswith("_current") \
                or not isinstance(value, int) or not isinstance(before.get(name), int):
            continue
        delta = value - before[name]
        rates[name] = None if delta < 0 or seconds <= 0 else delta / seconds
    return rates


def _show(args, sample, rates, server_table):
    if args.json:
        out = {"nic": sample["nic"], "servers": sample["servers"]}
        if rates:
            out["seconds"] = rates["seconds"]
            out["nic_per_second"] = rates["nic"]
            out["servers_per_second"] = rates["servers"]
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print(_nic_text(sample, rates))
        if sample["servers"] is not None:
            print()
            print(_servers_text(sample, rates, server_table))
    servers = sample["servers"] or {}
    return 1 if any("error" in counters for counters in servers.values()) else 0


def _nic_text(sample, rates):
    flat = _nic_flat(sample)
    if not flat:
        return ("nic ports: no RDMA devices: /sys/class/infiniband is empty or missing; "
                "gdrkv will use shm/tcp")
    if rates:
        title = f"nic ports, per second over {rates['seconds']:.2f}s"
        cells = {port: {name: _rate_cell(name, r) for name, r in row.items()}
                 for port, row in rates["nic"].items()}
    else:
        title = "nic ports"
        cells = {port: {name: _count_cell(name, v) for name, v in row.items()}
                 for port, row in flat.items()}
    title += " (sysfs counters/ and hw_counters/; port_*_data counts 4-byte words, shown as bytes)"
    return title + "\n" + _grid(cells)


def _servers_text(sample, rates, server_table):
    if not rates:
        return "gdrkv servers\n" + server_table(sample["servers"])
    cells = {}
    for name, counters in sample["servers"].items():
        per_second = rates["servers"].get(name, {})
        cells[name] = {counter: (_rate_cell(counter, per_second[counter])
                                 if counter in per_second else _plain(value))
                       for counter, value in counters.items()}
    return (f"gdrkv servers, per second over {rates['seconds']:.2f}s "
            "(levels such as pool_used_bytes as they are now)\n" + _grid(cells))


def _grid(cells):
    """{column: {row: text}} as a table: rows down, columns across."""
    names = dict.fromkeys(name for column in cells.values() for name in column)
    rows = [["counter", *cells]]
    rows += [[name, *(column.get(name, "-") for column in cells.values())] for name in names]
    return format_table(rows)


def _is_bytes(name):
    return name.endswith("_bytes") or name in ("bytes_in", "bytes_out")


def _count_cell(name, value):
    return format_size(value) if _is_bytes(name) else str(value)


def _rate_cell(name, rate):
    if rate is None:
        return "reset"
    if _is_bytes(name):
        return format_size(round(rate)) + "/s"
    return f"{rate:.0f}/s" if rate >= 100 else f"{rate:.3g}/s"


def _plain(value):
    return f"{value:.6g}" if isinstance(value, float) else str(value)
