"""gdrkv doctor: what this machine offers gdrkv, reported plainly.

Only looks; never changes a setting. The verdicts say what this build does
with what it finds. Sections: system, RDMA devices (sysfs), the rdma
transport's own view (libibverbs through gdrkv_rdma_report()), GPUs, the
GPU<->NIC PCIe distance, then a loopback self-test over the rdma
transport. Every /sys and /proc read honours $GDRKV_SYSFS_ROOT.
"""
import ctypes
import ctypes.util
import fcntl
import json
import os
import resource

from ..sizes import format_size, parse_size
from ..sysinfo import fs, gpu as sysinfo_gpu, pci as sysinfo_pci, rdma as sysinfo_rdma
from ..sysinfo.host import cpu_model
from ..table import format_table
from . import selftest as doctor_selftest

NO_RDMA = ("no RDMA devices: /sys/class/infiniband is empty or missing; "
           "gdrkv will use shm/tcp")
NOT_BUILT = "rdma transport not built in this library"
_REPORT_FIRST_BUFFER = 16 << 10
_REPORT_LAST_BUFFER = 4 << 20
# Below this, registering a pool or an engine's buffers for RDMA fails.
_MEMLOCK_ENOUGH = 1 << 30


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    test = parser.add_mutually_exclusive_group()
    test.add_argument("--self-test", dest="self_test", action="store_const", const="on",
                      default="auto",
                      help="run the rdma loopback self-test even without RDMA devices in "
                           "sysfs (e.g. GDRKV_IBVERBS_LIB=softverbs); exit 1 when it fails")
    test.add_argument("--no-self-test", dest="self_test", action="store_const", const="off",
                      help="only report, never start a server")
    parser.add_argument("--pool-size", type=parse_size, default=None, metavar="SIZE",
                        help="the pool of the server engines here will map (or their "
                             "gpu_pin_limit, if lower): checks the locked-memory limit against "
                             "what one process may pin for GPU copies (docs/gpu.md)")
    parser.add_argument("--runs", type=int, default=5,
                        help="runs per size in the self-test's bandwidth sweep (median; default 5)")


def run(args):
    mode = getattr(args, "self_test", "auto")
    as_json = getattr(args, "json", False)
    report = collect(pool_size=getattr(args, "pool_size", None))
    if not as_json:
        print(render(report), flush=True)
    reason = _skip_reason(mode, report)
    if reason:
        report["self_test"] = {"ran": False, "reason": reason}
    else:
        report["self_test"] = {"ran": True,
                               **doctor_selftest.run(runs=getattr(args, "runs", 5))}
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print()
        print(render_self_test(report["self_test"]))
    test = report["self_test"]
    return 1 if test["ran"] and not test["ok"] else 0


def _skip_reason(mode, report):
    if mode == "on":
        return None
    if mode == "off":
        return "--no-self-test"
    if not report["rdma"]["devices"]:
        return "no RDMA devices (use --self-test to run it anyway, e.g. over softverbs)"
    verbs = report["rdma"]["verbs"]
    if not verbs.get("rdma_available"):
        return f"the rdma transport is unavailable: {verbs.get('rdma_why') or NOT_BUILT}"
    return None


# ---------------------------------------------------------------- collecting

def collect(pool_size=None):
    """Everything but the self-test, as a JSON-able dict; pool_size is
    what one process may pin for GPU copies, when known."""
    verbs = verbs_report()
    cuda = sysinfo_gpu.cuda_devices()
    devices = sysinfo_rdma.devices()
    gpus = sysinfo_gpu.gpus(cuda=cuda)
    return {
        "sysfs_root": fs.root(),
        "system": {
            "cpus": _cpus(),
            "memory": _memory(),
            "hugepages": _hugepages(),
            "transparent hugepages": _thp_mode(),
            "memfd_create": _memfd(),
            "locked memory": _memlock(pool_size),
            "libibverbs": _ibverbs(),
            "cuda driver": _cuda_verdict(cuda),
            "nvidia-peermem": _peermem(),
            "transports": _transports(verbs),
        },
        "rdma": {"devices": devices, "verbs": verbs},
        "gpus": gpus,
        "topology": topology(gpus, devices),
    }


def verbs_report():
    """The rdma transport's own view, parsed from gdrkv_rdma_report()."""
    from .._native import ffi, lib
    if not hasattr(lib, "gdrkv_rdma_report"):
        return {"rdma_built": 0, "rdma_available": 0, "rdma_why": NOT_BUILT, "devices": {}}
    size = _REPORT_FIRST_BUFFER
    while True:
        buf = ffi.new("char[]", size)
        n = lib.gdrkv_rdma_report(buf, size)
        if n < 0:
            from .errors import strerror
            return {"rdma_built": 0, "rdma_available": 0, "devices": {},
                    "rdma_why": f"gdrkv_rdma_report failed: {strerror(n)}"}
        if n < size - 1 or size >= _REPORT_LAST_BUFFER:
            return parse_verbs_report(ffi.string(buf, min(n, size - 1)).decode(errors="replace"))
        size *= 4


def parse_verbs_report(text):
    """"name value" lines -> {"rdma_built": 1, ..., "devices": {name: {"max_mr_size":
    N, ..., "ports": {P: {"state": ..., "gid_index": N}}}}}."""
    report = {"devices": {}}
    for line in text.splitlines():
        name, _, value = line.strip().partition(" ")
        value = _number_or_text(value.strip())
        if name == "device":
            report["devices"].setdefault(str(value), {"ports": {}})
        elif name.startswith("device."):
            dev, _, rest = name[len("device."):].partition(".")
            entry = report["devices"].setdefault(dev, {"ports": {}})
            if rest.startswith("port."):
                number, _, field = rest[len("port."):].partition(".")
                entry["ports"].setdefault(number, {})[field] = value
            elif rest:
                entry[rest] = value
        elif name:
            report[name] = value
    return report


def _number_or_text(text):
    try:
        return int(text)
    except ValueError:
        return text


def topology(gpus, devices):
    """[{"gpu": label, "pci", "distances": {nic: PIX|...}, "closest": [nic]}]."""
    rows = []
    for gpu in gpus:
        distances = {dev["name"]: sysinfo_pci.distance(gpu.get("sys_path"), gpu.get("numa_node"),
                                                       dev["sys_path"], dev["numa_node"])
                     for dev in devices}
        known = {nic: d for nic, d in distances.items() if d}
        best = min((sysinfo_pci.rank(d) for d in known.values()), default=None)
        rows.append({"gpu": gpu_label(gpu), "pci": gpu["pci"], "distances": distances,
                     "closest": [nic for nic, d in known.items()
                                 if sysinfo_pci.rank(d) == best]})
    return rows


def gpu_label(gpu):
    return f"gpu{gpu['ordinal']}" if gpu.get("ordinal") is not None else f"gpu@{gpu['pci']}"


# ---------------------------------------------------------------- system checks

def _meminfo():
    """/proc/meminfo as {"Field": number}; sizes there are in KiB."""
    info = {}
    for line in fs.lines("/proc/meminfo"):
        name, _, value = line.partition(":")
        fields = value.split()
        if fields and fields[0].isdigit():
            info[name] = int(fields[0])
    return info


def _cpus():
    usable = len(os.sched_getaffinity(0))
    return f"{usable} usable of {os.cpu_count()}, {cpu_model()}"


def _memory():
    info = _meminfo()
    if "MemTotal" not in info:
        return "unknown (no /proc/meminfo)"
    total, available = info["MemTotal"] << 10, info.get("MemAvailable", 0) << 10
    return f"{format_size(total)} total, {format_size(available)} available"


def _hugepages():
    info = _meminfo()
    total, free = info.get("HugePages_Total", 0), info.get("HugePages_Free", 0)
    page = format_size(info.get("Hugepagesize", 0) << 10)
    if total == 0:
        return f"none reserved (page size {page}); --hugepages auto falls back to normal pages"
    return f"{free} free of {total} x {page}; --hugepages auto uses them when the pool fits"


# Not every Python names it (Linux 5.1+).
_F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x10)


def _memfd():
    """The shm transport shares the pool as a memfd sealed against writes
    (docs/transports.md)."""
    try:
        fd = os.memfd_create("gdrkv-doctor", os.MFD_ALLOW_SEALING)
    except (AttributeError, OSError) as e:
        return f"unavailable ({e}); servers will serve tcp only"
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | _F_SEAL_FUTURE_WRITE)
    except OSError as e:
        return f"available, but it can't be sealed ({e}); servers will serve tcp only"
    finally:
        os.close(fd)
    return "available and sealable: the shm transport works here"


def _memlock(plan=None):
    """RDMA registration pins memory, counted against RLIMIT_MEMLOCK
    (unless the process has CAP_IPC_LOCK); so may CUDA's registration of
    the slices of a pool a process copies GPU values with, up to plan
    bytes (docs/gpu.md, "What each process pins")."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return "unlimited"
    if plan and soft < plan and not _can_lock():
        return (f"{format_size(soft)}: below the {format_size(plan)} of the pool one process "
                "may pin for GPU copies (set gpu_pin_limit below it, or ulimit -l unlimited, "
                "LimitMEMLOCK=infinity for systemd, or CAP_IPC_LOCK)")
    if soft >= _MEMLOCK_ENOUGH:
        return format_size(soft)
    return (f"{format_size(soft)}: too small to register a pool or GPU buffers for RDMA "
            "(ulimit -l unlimited, LimitMEMLOCK=infinity for systemd, or CAP_IPC_LOCK)")


def _can_lock():
    """Whether this process has CAP_IPC_LOCK (bit 14 of CapEff), which
    lifts RLIMIT_MEMLOCK."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> 14 & 1)
    except OSError:
        pass
    return False


def _ibverbs():
    configured = os.environ.get("GDRKV_IBVERBS_LIB")
    verdict = _try_load(configured or "libibverbs.so.1")
    if configured:
        return f"{verdict} (GDRKV_IBVERBS_LIB={configured})"
    found = ctypes.util.find_library("ibverbs")
    return f"{verdict} ({'the linker cache has ' + found if found else 'not in the linker cache'})"


def _try_load(library):
    try:
        ctypes.CDLL(library)
    except OSError as e:
        return f"not loadable ({e})"
    return "loads"


def _thp_mode():
    # The file lists every mode with the active one in brackets.
    modes = "".join(fs.lines("/sys/kernel/mm/transparent_hugepage/enabled"))
    active = modes.partition("[")[2].partition("]")[0]
    return active or "unknown (no /sys/kernel/mm/transparent_hugepage)"


def _cuda_verdict(cuda):
    if "error" in cuda:
        return cuda["error"]
    version = cuda["driver_version"]
    return (f"loads, CUDA {version // 1000}.{version % 1000 // 10}, "
            f"{len(cuda['devices'])} device(s)")


def _peermem():
    module = sysinfo_gpu.peermem()
    if module:
        return f"{module} loaded (plain ibv_reg_mr on GPU memory works)"
    return "not loaded (GPU memory is registered through dma-buf, which doesn't need it)"


def _transports(verbs):
    base = "tcp and shm are built"
    if not verbs.get("rdma_built"):
        return f"{base}; rdma: {verbs.get('rdma_why') or NOT_BUILT}"
    if verbs.get("rdma_available"):
        return f"{base}; rdma: available through {verbs.get('rdma_library', '?')}"
    return f"{base}; rdma: built but unavailable ({verbs.get('rdma_why', 'no reason given')})"


# ---------------------------------------------------------------- rendering

def render(report):
    out = [_section("system", _pairs(report["system"]))]
    if fs.root() != "/":
        out[0] += f"\n  (sysfs and proc read under GDRKV_SYSFS_ROOT={fs.root()})"
    out.append(_section("rdma devices (sysfs)", render_devices(report["rdma"]["devices"])))
    out.append(_section("rdma transport (libibverbs as gdrkv sees it)",
                        render_verbs(report["rdma"]["verbs"])))
    out.append(_section("gpus", render_gpus(report["gpus"])))
    if report["gpus"] and report["rdma"]["devices"]:
        out.append(_section("gpu <-> nic pcie distance", render_topology(report["topology"])))
    return "\n\n".join(out)


def _section(title, body):
    return title + "\n" + "\n".join("  " + line if line else "" for line in body.splitlines())


def _pairs(items):
    width = max(len(name) for name in items)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in items.items())


def _dash(value):
    return "-" if value is None or value == "" else str(value)


def render_devices(devices):
    if not devices:
        return NO_RDMA
    rows = [["device/port", "state", "phys", "link layer", "rate", "lid", "numa", "pci",
             "netdev", "gid gdrkv picks"]]
    gid_rows = [["device/port", "index", "gid", "type", "netdev"]]
    for dev in devices:
        if not dev["ports"]:
            rows.append([dev["name"], "no ports", *["-"] * 8])
        for port in dev["ports"]:
            name = f"{dev['name']}/{port['port']}"
            rows.append([name, _dash(port["state"]), _dash(port["phys_state"]),
                         _dash(port["link_layer"]), _dash(port["rate"]),
                         _dash(port["lid"]) if port["link_layer"] == "InfiniBand" else "-",
                         _dash(dev["numa_node"]), _dash(dev["pci"]),
                         ",".join(dev["netdevs"]) or "-", _chosen(port)])
            for gid in port["gids"]:
                gid_rows.append([name, str(gid["index"]), gid["gid"], _dash(gid["type"]),
                                 _dash(gid["ndev"])])
    text = _left_table(rows)
    if len(gid_rows) > 1:
        text += "\n\n" + _left_table(gid_rows)
    return text


def _chosen(port):
    index = port["chosen_gid"]
    if index is None:
        return f"none: {port['chosen_gid_why']}"
    gid = next(g for g in port["gids"] if g["index"] == index)
    return f"{index} {gid['gid']} ({port['chosen_gid_why']})"


def render_verbs(verbs):
    if not verbs.get("rdma_built"):
        return verbs.get("rdma_why") or NOT_BUILT
    lines = [f"library    {verbs.get('rdma_library', '-')}",
             "available  " + ("yes" if verbs.get("rdma_available")
                              else f"no: {verbs.get('rdma_why', 'no reason given')}")]
    rows = [["device/port", "state", "link layer", "mtu", "lid", "gid index", "max mr",
             "max qp wr", "max sge", "max rd atom"]]
    for name, dev in verbs["devices"].items():
        for number, port in (dev["ports"] or {"-": {}}).items():
            rows.append([f"{name}/{number}", _dash(port.get("state")),
                         _dash(port.get("link_layer")), _dash(port.get("active_mtu")),
                         _dash(port.get("lid")), _dash(port.get("gid_index")),
                         _size_or_dash(dev.get("max_mr_size")), _dash(dev.get("max_qp_wr")),
                         _dash(dev.get("max_sge")), _dash(dev.get("max_qp_rd_atom"))])
    if len(rows) > 1:
        lines += ["", _left_table(rows)]
    return "\n".join(lines)


def _size_or_dash(value):
    return format_size(value) if isinstance(value, int) else _dash(value)


def render_gpus(gpus):
    if not gpus:
        return "none (no NVIDIA GPU in /sys/bus/pci/devices and none from the CUDA driver)"
    rows = [["gpu", "name", "pci", "numa", "cc", "memory", "bar1", "dma-buf", "gpudirect rdma"]]
    for gpu in gpus:
        memory = gpu.get("memory_bytes")
        rows.append([gpu_label(gpu), _dash(gpu.get("name")), gpu["pci"],
                     _dash(gpu.get("numa_node")), _dash(gpu.get("compute_capability")),
                     format_size(memory) if memory else "-",
                     _size_or_dash(gpu.get("bar1_bytes")),
                     _yes_no(gpu.get("dma_buf")), _yes_no(gpu.get("gpudirect_rdma"))])
    text = _left_table(rows)
    if any(g.get("needs_flush_read") for g in gpus):
        text += ("\nbefore Hopper: the rdma transport adds one flush READ per batch landing "
                 "in GPU memory")
    return text


def _yes_no(flag):
    return "-" if flag is None else "yes" if flag else "no"


def render_topology(rows):
    nics = list(rows[0]["distances"]) if rows else []
    table = [["", *nics, "closest"]]
    for row in rows:
        table.append([row["gpu"], *(_dash(row["distances"][n]) for n in nics),
                      ",".join(row["closest"]) or "-"])
    legend = "\n".join(f"{k:4}  {v}" for k, v in sysinfo_pci.LEGEND.items())
    return (_left_table(table) + "\n" + legend +
            "\ngdrkv uses the closest NIC unless GDRKV_IB_HCA names one")


def render_self_test(test):
    if not test["ran"]:
        return _section("self-test", f"skipped: {test['reason']}")
    rows = [["check", "result", "detail"]]
    rows += [[c["name"], "ok" if c["ok"] else "FAILED", c["detail"]] for c in test["checks"]]
    body = _left_table(rows)
    if test["sweep"]:
        sweep = [["memory", "object", "objects/batch", "runs", "WRITE (put) GB/s",
                  "READ (get) GB/s"]]
        sweep += [[r["memory"], format_size(r["size"]), str(r["objects"]), str(r["runs"]),
                   f"{r['put_gbps']:.2f}", f"{r['get_gbps']:.2f}"] for r in test["sweep"]]
        body += "\n\nbandwidth, median of runs (one batch each way per run)\n"
        body += format_table(sweep)
    counters = test.get("client_counters")
    if counters:
        body += "\n\nthe client's rdma counters after the test\n" + _left_table(
            [["counter", "value"]] + [[name, str(value)] for name, value in counters.items()])
    body += "\n\n" + ("passed" if test["ok"] else "FAILED")
    return _section(f"self-test (transport={test['transport']}, loopback)", body)


def _left_table(rows):
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in rows)

