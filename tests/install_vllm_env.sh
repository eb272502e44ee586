#!/usr/bin/env bash
# Makes the virtual environment of the LMCache-with-vLLM tests
# (tests/engines/test_lmcache_vllm.py): vLLM 0.33.0, LMCache 0.5.6 and gdrkv from this
# checkout, on a CPU-only machine. vLLM pins another transformers than SGLang,
# so it cannot share .venv-test. Safe to run again.
#
#   bash tests/install_vllm_env.sh [VENV]      # default: .venv-vllm in the checkout
#
# vLLM is installed without its declared dependencies (its CUDA stack, and
# with xgrammar's, 1 GB of triton); LMCache's chunk hashing and the engine's
# KV connector API need only the ones listed (measured: /work/shared/ENGINES.md,
# "vLLM KV connector").
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${1:-$ROOT/.venv-vllm}
PYTHON=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1

pip_install() {
    "$VENV/bin/python" -m pip install -q "$@"
}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip_install --upgrade pip setuptools wheel cffi
bash "$ROOT/tests/install_engines.sh" "$VENV/bin/python" torch

pip_install --no-deps vllm==0.33.0
pip_install --no-warn-conflicts packaging pydantic regex numpy cbor2 psutil pyzmq urllib3 \
    "transformers>=5.16.1,<5.21.0" aiohttp requests "oss-harmony>=0.0.11" "openai>=2.25.0" \
    pillow pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo prometheus_client \
    "fastapi<0.137.0" partial_json_parser "llguidance<1.8.0,>=1.7.0" einops \
    xxhash
pip_install --no-warn-conflicts --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.11

bash "$ROOT/tests/install_engines.sh" "$VENV/bin/python" lmcache

# gdrkv itself, optimised: the wheel GDRKV_WHEEL names (tests/run.sh builds
# one for both environments), else built here; build/ first, as run.sh's
# build() does.
if [ -n "${GDRKV_WHEEL:-}" ]; then
    pip_install --force-reinstall --no-deps "$GDRKV_WHEEL"
else
    rm -rf "$ROOT/build"
    pip_install --no-cache-dir --no-build-isolation --force-reinstall --no-deps "$ROOT"
    rm -rf "$ROOT/build"
fi
