"""gdrkv doctor: what this machine offers gdrkv, reported plainly.

Only looks; never changes a setting. The verdicts say what this build does
with what it finds.
"""
import ctypes
import ctypes.util
import fcntl
import os

from .sizes import format_size


def run(args):
    checks = [
        ("cpus", _cpus()),
        ("memory", _memory()),
        ("hugepages", _hugepages()),
        ("transparent hugepages", _thp_mode()),
        ("memfd_create", _memfd()),
        ("libibverbs", _ibverbs()),
        ("rdma devices", _rdma_devices()),
        ("cuda driver", _try_load("libcuda.so.1")),
        ("transports", ("tcp and shm are built, rdma is not yet (transport=auto uses shm for "
                        "servers on this host when their unix socket answers, else tcp)")),
    ]
    width = max(len(name) for name, _ in checks)
    for name, verdict in checks:
        print(f"{name.ljust(width)}  {verdict}")
    return 0


def cpu_model():
    for line in _lines("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return "unknown"


def _meminfo():
    """/proc/meminfo as {"Field": number}; sizes there are in KiB."""
    info = {}
    for line in _lines("/proc/meminfo"):
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


def _ibverbs():
    configured = os.environ.get("GDRKV_IBVERBS_LIB")
    verdict = _try_load(configured or "libibverbs.so.1")
    if configured:
        return f"{verdict} (GDRKV_IBVERBS_LIB={configured})"
    found = ctypes.util.find_library("ibverbs")
    return f"{verdict} ({'the linker cache has ' + found if found else 'not in the linker cache'})"


def _rdma_devices():
    try:
        devices = sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return "none (/sys/class/infiniband is absent)"
    return ", ".join(devices) if devices else "none"


def _try_load(library):
    try:
        ctypes.CDLL(library)
    except OSError as e:
        return f"not loadable ({e})"
    return "loads"


def _thp_mode():
    # The file lists every mode with the active one in brackets.
    modes = "".join(_lines("/sys/kernel/mm/transparent_hugepage/enabled"))
    active = modes.partition("[")[2].partition("]")[0]
    return active or "unknown (no /sys/kernel/mm/transparent_hugepage)"


def _lines(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []
