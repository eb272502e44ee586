"""softverbs, the software libibverbs installed with the package: its path,
its exported ABI, its counters through ctypes, and the native strictness
suite (tests/native/test_softverbs.c) run against the installed library
itself, the one the rdma transport loads through GDRKV_IBVERBS_LIB."""
import ctypes
import os
import shutil
import subprocess

import pytest

import gdrkv.softverbs

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # tests/
ROOT = os.path.dirname(HERE)

# The libibverbs symbols the transport resolves with dlsym (the contract).
VERBS = [
    "ibv_get_device_list", "ibv_free_device_list", "ibv_get_device_name", "ibv_get_device_guid",
    "ibv_open_device", "ibv_close_device", "ibv_query_device", "ibv_query_port", "ibv_query_gid",
    "ibv_alloc_pd", "ibv_dealloc_pd", "ibv_reg_mr", "ibv_reg_mr_iova2", "ibv_reg_dmabuf_mr",
    "ibv_dereg_mr", "ibv_create_cq", "ibv_destroy_cq", "ibv_create_qp", "ibv_modify_qp",
    "ibv_query_qp", "ibv_destroy_qp", "ibv_wc_status_str",
]
EXTRAS = ["softverbs_counters", "softverbs_reset_counters", "softverbs_inject_error"]
COUNTERS = ["post_send_calls", "post_recv_calls", "wrs_posted", "wrs_executed", "sges",
            "completions", "cqes_polled", "poll_calls", "error_completions", "post_failures",
            "cq_overflows"]


class Counters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in COUNTERS]


def library():
    try:
        return gdrkv.softverbs.library_path()
    except RuntimeError as e:
        pytest.skip(str(e))


@pytest.fixture
def lib():
    # The registry directory is the environment's (SOFTVERBS_DIR or
    # /dev/shm): a process maps it once, and the rdma tests that may run in
    # this process later must share it with their server processes.
    return ctypes.CDLL(library())


def test_library_path_is_in_the_package():
    path = library()
    assert os.path.isabs(path)
    assert os.path.dirname(path) == os.path.dirname(os.path.abspath(gdrkv.__file__))
    assert os.path.basename(path) == "libsoftverbs.so"


def test_exports_exactly_the_verbs_and_softverbs_symbols():
    path = library()
    lib = ctypes.CDLL(path)
    for name in VERBS + EXTRAS:
        assert getattr(lib, name), name
    for hidden in ("sv_post_send", "sv_poll_cq", "sv_registry_open", "sv_copy"):
        with pytest.raises(AttributeError):
            getattr(lib, hidden)
    nm = shutil.which("nm")
    if nm:
        out = subprocess.run([nm, "-D", "--defined-only", path], capture_output=True, text=True,
                             check=True).stdout
        names = {line.split()[-1] for line in out.splitlines() if line.split()[1:2] == ["T"]}
        assert set(VERBS + EXTRAS) <= names
        assert all(n.startswith(("ibv_", "softverbs_")) for n in names), sorted(names)


def test_device_and_counters_through_ctypes(lib):
    lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
    lib.ibv_get_device_name.restype = ctypes.c_char_p
    lib.ibv_get_device_name.argtypes = [ctypes.c_void_p]
    lib.ibv_open_device.restype = ctypes.c_void_p
    lib.ibv_open_device.argtypes = [ctypes.c_void_p]
    lib.ibv_close_device.argtypes = [ctypes.c_void_p]
    lib.ibv_free_device_list.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.ibv_wc_status_str.restype = ctypes.c_char_p

    n = ctypes.c_int(-1)
    devices = lib.ibv_get_device_list(ctypes.byref(n))
    assert n.value == 1 and devices[1] is None
    assert lib.ibv_get_device_name(devices[0]) == b"softverbs0"
    ctx = lib.ibv_open_device(devices[0])
    assert ctx
    lib.ibv_free_device_list(devices)
    assert lib.ibv_close_device(ctx) == 0
    assert lib.ibv_wc_status_str(12) == b"transport retry counter exceeded"

    lib.softverbs_reset_counters()
    c = Counters()
    lib.softverbs_counters(ctypes.byref(c))
    assert all(getattr(c, name) == 0 for name in COUNTERS)
    lib.softverbs_inject_error(ctypes.c_uint64(0), 0)     # arming with success is harmless


def test_strictness_suite_against_the_installed_library(tmp_path):
    """The native suite, built without sanitizers and linked to the library
    pip installed (optimised, or sanitized in run.sh's second pass)."""
    path = library()
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    exe = tmp_path / "test_softverbs"
    libdir = os.path.dirname(path)
    subprocess.run([cc, "-std=c11", "-D_GNU_SOURCE", "-O1", "-g", "-pthread",
                    "-I", os.path.join(ROOT, "native"), "-I", os.path.join(HERE, "native"),
                    "-o", str(exe), os.path.join(HERE, "native", "test_softverbs.c"),
                    "-L", libdir, "-l:libsoftverbs.so", "-Wl,-rpath," + libdir],
                   check=True, capture_output=True, text=True)
    env = dict(os.environ)
    env.pop("SOFTVERBS_LINK_LAYER", None)
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"{result.stdout[-10000:]}\n{result.stderr[-10000:]}"
    assert "0 failed" in result.stdout
