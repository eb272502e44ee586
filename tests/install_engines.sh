#!/usr/bin/env bash
# Installs the serving engines that the adapter tests import into the virtual
# environment whose python is $1, on a CPU-only machine. Safe to run again:
# pip leaves what is already satisfied alone.
#
#   bash tests/install_engines.sh .venv-test/bin/python            # all of them
#   bash tests/install_engines.sh .venv-vllm/bin/python torch lmcache
#
# One function per engine; add an engine by adding a function and naming it
# in the default list at the bottom.
set -euo pipefail

PYTHON=${1:?usage: install_engines.sh PYTHON [torch|sglang|lmcache...]}
shift

pip_install() {
    "$PYTHON" -m pip install -q --disable-pip-version-check "$@"
}

# torch: the exact version pins the CPU wheel in pip's find-links folder
# (/opt/wheels); "2.13.0+cpu" sorts above PyPI's CUDA "2.13.0", so pip takes
# it, and nothing later may ask for another torch or it pulls ~3 GB of CUDA.
install_torch() {
    pip_install torch==2.13.0
}

# sglang's declared dependencies are the GPU serving stack (flashinfer, CUDA
# kernels, another torch); the HiCache storage API needs only what importing
# sglang needs, listed here (pyyaml reads "@file.yaml" extra configs). Its
# real host pools (MHATokenToKVPoolHost, MLATokenToKVPoolHost) and
# HiCacheController import its model configs and quantization modules too,
# which need dill, apache-tvm-ffi, sentencepiece, compressed-tensors and gguf
# (at sglang's pins where it has one) and torchvision, whose PyPI wheel is a
# CUDA build: the tests use an import-only stand-in (tests/stand_ins).
# sglang goes in last: pip checks declared dependencies only when it installs
# with them, so this order keeps its report of the skipped ones out of the log.
install_sglang() {
    pip_install numpy orjson psutil pybase64 requests triton packaging pillow starlette \
        typing_extensions msgspec pydantic IPython tqdm aiohttp pyzmq pyyaml
    pip_install dill apache-tvm-ffi==0.1.11 sentencepiece==0.2.1 compressed-tensors==0.18.0 gguf
    pip_install --no-deps sglang==0.5.23
}

# lmcache declares GPU packages (cupy-cuda13x, cuda-python, cufile-python,
# nvtx) and cloud clients (awscrt, Bigtable, OpenTelemetry) that its
# LocalCPUBackend and RemoteBackend never import; its native module loads
# with the CPU torch above. Listed here is what those backends, its config
# and its token database import, within lmcache's own version bounds.
# --no-warn-conflicts: pip would otherwise list every dependency that sglang,
# installed before without its own, declares.
install_lmcache() {
    pip_install --no-warn-conflicts "numpy<=2.2.6" numba pyyaml requests cachetools \
        sortedcontainers "prometheus_client>=0.18.0,<=0.24.1" py-cpuinfo psutil aiohttp aiofile \
        msgspec "pyzmq>=25.0.0" "transformers>=5.4" cryptography
    pip_install --no-deps lmcache==0.5.6
}

for engine in "${@:-torch sglang lmcache}"; do
    for name in $engine; do "install_$name"; done
done
