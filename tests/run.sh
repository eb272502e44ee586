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

need_apt=()
command -v gcc >/dev/null || need_apt+=(gcc)
command -v make >/dev/null || need_apt+=(make)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "== installing Debian packages: ${need_apt[*]}"
    SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

# venv DIR [ENV=VALUE...]: a virtual environment with gdrkv[test] built from
# this checkout (a clean build each time, so stale objects never leak in).
make_venv() {
    local dir=$1; shift
    [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir"
    "$dir/bin/pip" install -q --upgrade pip setuptools wheel cffi
    env "$@" "$dir/bin/pip" install -q --no-cache-dir --no-build-isolation --force-reinstall --no-deps "$ROOT"
    "$dir/bin/pip" install -q "$ROOT[test]"
}

# run_pytest VENV [pytest args...]: pytest exits 5 when it collected
# nothing, which must count as a failure here.
run_pytest() {
    local dir=$1; shift
    (cd "$ROOT" && "$dir/bin/python" -m pytest -q -p no:cacheprovider "$@") && return 0
    local rc=$?
    [ $rc -eq 5 ] && echo "pytest collected no tests" >&2
    return $rc
}

echo "== build and install (optimised)"
make_venv "$ROOT/.venv-test"
echo "== test suite"
run_pytest "$ROOT/.venv-test" "$@"

echo "== build and install (ASan + UBSan)"
make_venv "$ROOT/.venv-asan" GDRKV_SANITIZE=1
echo "== test suite under ASan + UBSan"
# Python itself is not instrumented: preload the runtimes, and leave leak
# checking to the C unit tests (the interpreter keeps memory until exit).
# The C tests already run sanitized, so they are not repeated here.
LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
GDRKV_UNDER_SANITIZER=1 \
    run_pytest "$ROOT/.venv-asan" -k "not test_native" "$@"
echo "== all passes green"
