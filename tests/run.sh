#!/usr/bin/env bash
# The test command (README.md; .ci/run calls it). On a fresh machine it
# installs what the tests need (Debian packages, a virtual environment with
# the package and its test extra), runs the whole suite, then runs it once
# more with the native library built under AddressSanitizer and UBSan.
#
#   bash tests/run.sh            # everything
#   bash tests/run.sh -k eviction  # extra arguments go to pytest (both passes)
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Every engine is installed below, so an engine test must run, not skip.
export GDRKV_REQUIRE_ENGINES=1
# Likewise softverbs: the rdma tests must run, not skip.
export GDRKV_REQUIRE_RDMA=1

need_apt=()
command -v gcc >/dev/null || need_apt+=(gcc)
command -v make >/dev/null || need_apt+=(make)
# rdma-core's headers, for one check alone: the build declares the verbs ABI
# itself (native/common/verbs_abi.h), and tests/native checks that declaration
# against rdma-core's <infiniband/verbs.h>.
[ -f /usr/include/infiniband/verbs.h ] || need_apt+=(libibverbs-dev)
# clang, for the coverage-guided libFuzzer run of the server connection
# target (tests/native/fuzz_server.c); it must run, not skip.
command -v clang >/dev/null || need_apt+=(clang)
# Prometheus, which scrapes `gdrkv serve --metrics-listen` in test_metrics.
command -v prometheus >/dev/null || need_apt+=(prometheus)
export GDRKV_REQUIRE_LIBFUZZER=1
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "== installing Debian packages: ${need_apt[*]}"
    SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

VENV=$ROOT/.venv-test

# build [ENV=VALUE...]: rebuilds gdrkv from this checkout into the venv.
# setuptools reuses objects in build/ by timestamp, not by flags, so build/
# goes first or a sanitized build could link optimised objects.
build() {
    rm -rf "$ROOT/build"
    env "$@" "$VENV/bin/pip" install -q --no-cache-dir --no-build-isolation --force-reinstall \
        --no-deps "$ROOT"
}

# run_pytest [pytest args...]: pytest exits 5 when it collected nothing,
# which must count as a failure here.
run_pytest() {
    rm -f "${TMPDIR:-/tmp}"/gdrkv-hang-*.log
    (cd "$ROOT" && "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@") && return 0
    local rc=$?
    [ $rc -eq 5 ] && echo "pytest collected no tests" >&2
    # A test that hung past the guard left every thread's stack here.
    cat "${TMPDIR:-/tmp}"/gdrkv-hang-*.log 2>/dev/null >&2 || true
    return $rc
}

echo "== virtual environment, engines (torch, sglang, lmcache) and test tools"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip setuptools wheel cffi
bash "$ROOT/tests/install_engines.sh" "$VENV/bin/python"
# vLLM pins another transformers than SGLang: the LMCache-with-vLLM tests
# (tests/engines/test_lmcache_vllm.py) run their workers in an environment of its
# own, with an optimised gdrkv from this checkout.
echo "== vLLM test environment"
bash "$ROOT/tests/install_vllm_env.sh" "$ROOT/.venv-vllm"

# The test extra of pyproject.toml, without reinstalling gdrkv itself.
"$VENV/bin/pip" install -q $("$VENV/bin/python" -c 'import tomllib; print(" ".join(
    tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]))')

echo "== build (optimised) and test suite"
build
run_pytest "$@"

# The tests marked pool_file again with every server on a pool file
# (--pool-file, docs/operations.md "Restarts"); those marked memfd_pool say
# why they are skipped there.
echo "== transports over a pool file"
GDRKV_TEST_POOL_FILE=1 run_pytest -m pool_file "$@"

echo "== build (ASan + UBSan) and test suite again"
build GDRKV_SANITIZE=1
# Python itself is not instrumented: preload the runtimes, and leave leak
# checking to the C unit tests (the interpreter keeps memory until exit).
# The C tests already run sanitized, so they are not repeated here.
LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    run_pytest -m "not native" "$@"
echo "== all passes green"
