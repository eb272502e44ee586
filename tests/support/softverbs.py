"""softverbs, the software libibverbs built with the package, which carries
the rdma transport in every process of the suite, and its counters.

Importing this module points GDRKV_IBVERBS_LIB at it: that must happen
before any client or server loads libibverbs, which happens once per
process, so conftest.py imports it first. Servers started by the tests
inherit it and serve rdma (their default is rdma auto)."""
import ctypes
import os

try:
    import gdrkv.softverbs
    SOFTVERBS = gdrkv.softverbs.library_path()
except (ImportError, OSError, RuntimeError):
    SOFTVERBS = None
if SOFTVERBS:
    os.environ.setdefault("GDRKV_IBVERBS_LIB", SOFTVERBS)
elif os.environ.get("GDRKV_REQUIRE_RDMA") == "1":
    raise RuntimeError("GDRKV_REQUIRE_RDMA=1 but softverbs was not built "
                       "(reinstall gdrkv: setup.py's build_ext builds it)")
TRANSPORTS = ["tcp", "shm", "rdma"] if SOFTVERBS else ["tcp", "shm"]


class SoftverbsCounters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "post_send_calls", "post_recv_calls", "wrs_posted", "wrs_executed", "sges",
        "completions", "cqes_polled", "poll_calls", "error_completions", "post_failures",
        "cq_overflows")]


def softverbs():
    """This process's softverbs (the same library gdrkv loaded)."""
    lib = ctypes.CDLL(SOFTVERBS)
    lib.softverbs_inject_error.argtypes = [ctypes.c_uint64, ctypes.c_int]
    return lib


def counters():
    c = SoftverbsCounters()
    softverbs().softverbs_counters(ctypes.byref(c))
    return c
