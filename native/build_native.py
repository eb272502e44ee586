"""cffi builder (API, out-of-line mode) for gdrkv's native library.

Compiles the C files of the library's wings (native/common, store, server,
client, rdma, gpu: LAYOUT in README.md) into the extension module
gdrkv._native. The cdef is native/include/gdrkv.h itself with preprocessor
lines removed, so the public header is the single source of truth for the
binding. native/softverbs stands apart: setup.py builds it as its own
shared library.

GDRKV_SANITIZE=1 builds with AddressSanitizer and UBSan (the test suite runs
once that way); GDRKV_DEBUG=1 builds without optimisation.
"""
import glob
import os
import re
import shutil
import subprocess

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))


def _cdef_from_header(path):
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    return "\n".join(lines)


# The library's wings, bottom up; softverbs is not one of them.
WINGS = ("common", "store", "server", "rdma", "gpu", "client")
FATBIN = "gpu_kernels_fatbin.c"


def _fresh_fatbin(root):
    """The copy kernel compiled now (sm_80, sm_90, PTX) where nvcc exists,
    into build/; None (use the committed native/gpu/gpu_kernels_fatbin.c) when
    there is no nvcc, GDRKV_NVCC=0, or it fails."""
    nvcc = os.environ.get("NVCC", "nvcc")
    if os.environ.get("GDRKV_NVCC") == "0" or not shutil.which(nvcc):
        return None
    out = os.path.join(root, "build", "gdrkv-kernels", FATBIN)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    script = os.path.join(HERE, "gpu", "build_cuda_kernels.sh")
    if subprocess.call(["sh", script, out], stdout=subprocess.DEVNULL) != 0:
        print(f"gdrkv: {nvcc} failed on the copy kernel: using the committed {FATBIN}")
        return None
    return out


def _sources():
    # Relative paths: setuptools wants them relative to the project root.
    root = os.path.dirname(HERE)
    sources = sorted(os.path.relpath(p, root)
                     for wing in WINGS for p in glob.glob(os.path.join(HERE, wing, "*.c")))
    fresh = _fresh_fatbin(root)
    if fresh:
        sources = [os.path.relpath(fresh, root) if os.path.basename(s) == FATBIN else s
                   for s in sources]
    return sources


def compile_flags():
    """Warnings, visibility and the GDRKV_SANITIZE/GDRKV_DEBUG modes, shared
    by the extension and libsoftverbs.so (setup.py)."""
    cflags = ["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror",
              "-Wno-unused-parameter", "-fvisibility=hidden", "-pthread"]
    ldflags = ["-pthread"]
    if os.environ.get("GDRKV_SANITIZE") == "1":
        san = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer",
               "-fno-sanitize-recover=undefined"]
        cflags += san + ["-O1", "-g"]
        ldflags += san
    elif os.environ.get("GDRKV_DEBUG") == "1":
        cflags += ["-O0", "-g"]
    else:
        cflags += ["-O2", "-g"]
    return cflags, ldflags


ffibuilder = FFI()
ffibuilder.cdef(_cdef_from_header(os.path.join(HERE, "include", "gdrkv.h")))
_cflags, _ldflags = compile_flags()
ffibuilder.set_source(
    "gdrkv._native",
    '#include "gdrkv.h"\n',
    sources=_sources(),
    include_dirs=[os.path.relpath(d, os.path.dirname(HERE)) for d in (HERE, os.path.join(HERE, "include"))],
    libraries=["dl"],
    extra_compile_args=_cflags,
    extra_link_args=_ldflags,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
