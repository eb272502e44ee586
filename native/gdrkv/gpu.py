"""GPU helpers of the Python API: whether gdrkv can use a GPU here, and
gdrkv's batched GPU copy on its own (what `gdrkv bench --gpu` measures the
one-launch ceiling with). Nothing here needs torch."""
from array import array

from ._native import ffi, lib
from .errors import check

_WHY_LEN = 256
COPY_MODES = {"auto": 0, "kernel": 1, "copy_engine": 2, "per_piece": 3}


def available():
    """(True, "CUDA driver V, N GPU(s)") or (False, why not)."""
    why = ffi.new("char[]", _WHY_LEN)
    ok = lib.gdrkv_gpu_available(why, _WHY_LEN) == 1
    return ok, ffi.string(why).decode(errors="replace")


def copy(device, dsts, srcs, lens, mode="kernel", stream=0):
    """Copies pieces srcs[i] -> dsts[i] of lens[i] bytes (addresses the GPU
    reaches: device or pinned host memory) in one launch on GPU device;
    returns when done."""
    n = len(dsts)
    if len(srcs) != n or len(lens) != n:
        raise ValueError("dsts, srcs and lens must have the same length")
    d, s, z = array("Q", dsts), array("Q", srcs), array("Q", lens)
    check(lib.gdrkv_gpu_copy(device, n, ffi.from_buffer("uint64_t[]", d),
                             ffi.from_buffer("uint64_t[]", s), ffi.from_buffer("uint64_t[]", z),
                             COPY_MODES[mode], getattr(stream, "cuda_stream", stream)),
          "gpu copy")
