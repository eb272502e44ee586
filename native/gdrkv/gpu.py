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


class Pieces:
    """Pieces srcs[i] -> dsts[i] of lens[i] bytes as the C arrays
    gdrkv_gpu_copy takes, built once (a timed loop then holds no Python
    conversion)."""

    def __init__(self, dsts, srcs, lens):
        self.n = len(dsts)
        if len(srcs) != self.n or len(lens) != self.n:
            raise ValueError("dsts, srcs and lens must have the same length")
        self._arrays = [array("Q", a) for a in (dsts, srcs, lens)]
        self.c = [ffi.from_buffer("uint64_t[]", a) for a in self._arrays]


def copy(device, pieces, mode="kernel", stream=0):
    """Copies the Pieces (addresses the GPU reaches: device or pinned host
    memory) in one launch on GPU device (mode "kernel"), one batched
    copy-engine call ("copy_engine") or one cuMemcpyAsync per piece
    ("per_piece"); returns when done."""
    check(lib.gdrkv_gpu_copy(device, pieces.n, *pieces.c, COPY_MODES[mode],
                             getattr(stream, "cuda_stream", stream)), "gpu copy")
