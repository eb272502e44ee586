#!/usr/bin/env bash
# Installs the peers that `gdrkv bench --compare` measures gdrkv against, on
# a CPU-only Debian machine, into the virtual environment whose python is $1.
# Safe to run again: apt-get and pip leave what is already there alone.
#
#   bash tests/install_peers.sh .venv-test/bin/python
#
# The SGLang and LMCache shootouts also need the engines:
# tests/install_engines.sh installs them.
set -euo pipefail

PYTHON=${1:?usage: install_peers.sh PYTHON}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

# redis-server is the Redis peer; Mooncake's wheel links against the verbs,
# NUMA and curl libraries even when it only speaks TCP.
install_debian_packages() {
    local missing=()
    for pkg in redis-server libibverbs1 libnuma1 libcurl4; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return
    local sudo=
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    # The package starts a system-wide Redis on port 6379; the benchmark
    # starts its own private one, so that service is left stopped.
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
    if command -v systemctl >/dev/null && systemctl is-active -q redis-server 2>/dev/null; then
        $sudo systemctl disable --now -q redis-server
    fi
}

# The bench extra of pyproject.toml, without gdrkv itself: redis[hiredis]
# (hiredis is redis-py's C parser, without which Redis would be measured
# through a pure-Python one), the non-CUDA Mooncake wheel (the plain one
# needs the CUDA libraries; this is the same Store over TCP) and matplotlib
# for the plot.
install_python_packages() {
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-warn-conflicts $("$PYTHON" -c 'import tomllib; print(" ".join(
        tomllib.load(open("'"$ROOT"'/pyproject.toml", "rb"))["project"]["optional-dependencies"]["bench"]))')
}

install_debian_packages
install_python_packages
