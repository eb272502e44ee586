#!/usr/bin/env bash
# The test command (README.md; .ci/run calls it). On a fresh machine it
# installs what the tests need (Debian packages, virtual environments with
# the engines and the test extra), then runs three passes: the whole suite
# on an optimised build, the transports' suites again with every server on
# a pool file, and the whole suite once more on a build under AddressSanitizer
# and UBSan. Each pass spreads its test files over GDRKV_TEST_JOBS
# pytest-xdist workers and prints its 20 slowest tests.
#
#   bash tests/run.sh              # everything
#   bash tests/run.sh -k eviction  # extra arguments go to pytest (every pass)
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Every engine is installed below, so an engine test must run, not skip.
export GDRKV_REQUIRE_ENGINES=1
# Likewise softverbs: the rdma tests must run, not skip.
export GDRKV_REQUIRE_RDMA=1
# Workers per pass. The tests mostly wait on servers, children and
# timeouts, so more workers than this machine's 2 cores still pay.
JOBS=${GDRKV_TEST_JOBS:-4}
START=$SECONDS
phase() { echo "== [$(( (SECONDS - START) / 60 ))m$(( (SECONDS - START) % 60 ))s] $*"; }

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
# etcd, where the tests of tests/cluster keep the members of their clusters
# (tests/support/etcd.py starts it; etcdctl is not needed).
command -v etcd >/dev/null || need_apt+=(etcd-server)
# openssl, which the docs' token snippet runs (tests/tools/test_snippets.py).
command -v openssl >/dev/null || need_apt+=(openssl)
export GDRKV_REQUIRE_LIBFUZZER=1
if [ ${#need_apt[@]} -gt 0 ]; then
    phase "installing Debian packages: ${need_apt[*]}"
    SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

VENV=$ROOT/.venv-test           # the engines, the test tools and an optimised gdrkv
ASAN_VENV=$ROOT/.venv-asan      # gdrkv under ASan + UBSan; every other package is .venv-test's
VLLM_VENV=$ROOT/.venv-vllm      # vLLM pins another transformers than SGLang
WHEELS=$VENV/wheels

# build DEST_VENV [ENV=VALUE...]: gdrkv from this checkout into DEST_VENV.
# setuptools reuses objects in build/ by timestamp, not by flags, so build/
# goes first or a sanitized build could link optimised objects.
build() {
    local dest=$1; shift
    rm -rf "$ROOT/build"
    env "$@" "$dest/bin/python" -m pip install -q --no-cache-dir --no-build-isolation \
        --force-reinstall --no-deps "$ROOT"
    rm -rf "$ROOT/build"
}

# in_background LOG COMMAND...: runs it with its output in LOG; `finish`
# waits for it and shows LOG if it failed.
in_background() {
    local log=$1; shift
    "$@" >"$log" 2>&1 &
    BG_PIDS+=($!) BG_LOGS+=("$log")
}
finish() {
    local i rc=0
    for i in "${!BG_PIDS[@]}"; do
        wait "${BG_PIDS[$i]}" || { rc=$?; echo "failed ($rc), its log:"; cat "${BG_LOGS[$i]}"; }
    done
    BG_PIDS=() BG_LOGS=()
    return $rc
}
BG_PIDS=() BG_LOGS=()

phase "virtual environments, engines (torch, sglang, lmcache), vLLM's and the test tools"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip setuptools wheel cffi
# gdrkv, optimised, built once as a wheel for .venv-test and .venv-vllm.
rm -rf "$ROOT/build" "$WHEELS"
"$VENV/bin/pip" wheel -q --no-cache-dir --no-build-isolation --no-deps -w "$WHEELS" "$ROOT"
rm -rf "$ROOT/build"
# .venv-test: the engines, then the test extra of pyproject.toml.
install_test_env() {
    bash "$ROOT/tests/install_engines.sh" "$VENV/bin/python" &&
    "$VENV/bin/pip" install -q $("$VENV/bin/python" -c 'import tomllib; print(" ".join(
        tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]))')
}
# The two environments share nothing: they install side by side, while the
# sanitized build below compiles.
in_background "$VENV/install-vllm.log" \
    env GDRKV_WHEEL="$(ls "$WHEELS"/gdrkv-*.whl)" bash "$ROOT/tests/install_vllm_env.sh" "$VLLM_VENV"
in_background "$VENV/install-engines.log" install_test_env

phase "build (ASan + UBSan)"
# A light environment that adds .venv-test's site-packages (and its .pth
# files) after its own, so its gdrkv is the one imported; pip, setuptools
# and cffi come from there (installed above, before the engines).
[ -x "$ASAN_VENV/bin/python" ] || "$PYTHON" -m venv --without-pip "$ASAN_VENV"
"$ASAN_VENV/bin/python" -c 'import site, sys; open(site.getsitepackages()[0] + "/zz_venv_test.pth",
    "w").write(f"import site; site.addsitedir({sys.argv[1]!r})\n")' \
    "$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
build "$ASAN_VENV" GDRKV_SANITIZE=1
finish
# gdrkv itself into .venv-test, from the wheel.
"$VENV/bin/pip" install -q --force-reinstall --no-deps "$WHEELS"/gdrkv-*.whl

# run_pytest PYTHON SELECT [pytest args...]: the tests the -m expression
# SELECT picks ("" for all), over pytest-xdist's workers, then those of them
# marked alone by themselves. pytest exits 5 when it collected nothing,
# which must count as a failure here (but for the alone ones: a pass may
# have none). Each pass has a TMPDIR of its own (its servers' files, the
# hang guard's logs).
PASS_TMP=${TMPDIR:-/tmp}
# files_marked MARK: the test files that name pytest.mark.MARK. A run that
# selects by a marker collects only them: collecting tests/ imports every
# engine, ~25 s of CPU in each xdist worker, to deselect nearly all of it.
files_marked() { grep -rlE --include='test_*.py' "mark\.$1\b" tests | sort; }
run_pytest() {
    local python=$1 select=$2; shift 2
    local -x TMPDIR
    TMPDIR=$(mktemp -d "$PASS_TMP/gdrkv-XXXX")     # short: unix socket paths live under it
    chmod 1777 "$TMPDIR"        # as /tmp: test_shm_trust's children run as nobody
    local rc=0
    (cd "$ROOT" && "$python" -m pytest -q -p no:cacheprovider -n "$JOBS" --dist loadfile \
        --durations=20 -m "${select:+($select) and }not alone" "$@") || rc=$?
    if [ $rc -eq 0 ] && [ -n "$(files_marked alone)" ]; then
        (cd "$ROOT" && "$python" -m pytest -q -p no:cacheprovider \
            -m "${select:+($select) and }alone" $(files_marked alone) "$@") || rc=$?
        [ $rc -eq 5 ] && rc=0
    fi
    [ $rc -eq 0 ] && { rm -rf "$TMPDIR"; return 0; }
    [ $rc -eq 5 ] && echo "pytest collected no tests" >&2
    # A test that hung past the guard left every thread's stack here.
    cat "$TMPDIR"/gdrkv-hang-*.log 2>/dev/null >&2 || true
    return $rc
}

phase "test suite (optimised build)"
run_pytest "$VENV/bin/python" "" "$@"

# The tests marked pool_file again with every server on a pool file
# (--pool-file, docs/operations.md "Restarts"); those marked memfd_pool say
# why they are skipped there.
phase "transports over a pool file"
GDRKV_TEST_POOL_FILE=1 run_pytest "$VENV/bin/python" pool_file $(files_marked pool_file) "$@"

phase "test suite again (ASan + UBSan build)"
# Python itself is not instrumented: preload the runtimes, and leave leak
# checking to the C unit tests (the interpreter keeps memory until exit).
# The C tests already run sanitized, so they are not repeated here; nor are
# the tests whose engine runs in the vLLM environment, which loads that
# environment's optimised gdrkv, not this build (support/vllm_env.py), nor
# those marked no_asan (no C code of gdrkv, none that others miss here, or
# a gdrkv of their own: README's Try it).
LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    run_pytest "$ASAN_VENV/bin/python" "not native and not vllm_env and not no_asan" "$@"
phase "all passes green"
