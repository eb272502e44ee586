"""Helpers every area uses: threads that must finish, waits that name what
they wait for, the `gdrkv` command and Python children, preload shims."""
import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

# tests/: the folder of support/, put first on a Python child's sys.path.
TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def background(*targets, stop=None, timeout=60.0):
    """Runs each target in its own thread while the block runs; on leaving,
    sets the event stop (when given), joins them all within timeout
    seconds, fails if one is still running and re-raises the first
    exception a thread raised (pytest would only warn about it)."""
    errors = []

    def guarded(target):
        def run():
            try:
                target()
            except BaseException as e:      # re-raised in the test's thread
                errors.append(e)
        return run

    threads = [threading.Thread(target=guarded(t), daemon=True) for t in targets]
    for t in threads:
        t.start()

    def finish():
        if stop is not None:
            stop.set()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    try:
        yield threads
    except BaseException as body_error:
        finish()
        if errors:                          # usually why the body failed too
            raise errors[0] from body_error
        raise
    finish()
    hung = sum(t.is_alive() for t in threads)
    assert not hung, f"{hung} of {len(threads)} threads still running after {timeout} s"
    if errors:
        raise errors[0]


def run_threads(*targets, timeout=60.0):
    """Runs the targets in parallel threads to the end (see background)."""
    with background(*targets, timeout=timeout):
        pass


def wait_for(predicate, timeout, what):
    """Polls predicate() until truthy; fails naming what was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def cpu_seconds(pid):
    """CPU time (user + system) process pid has spent so far, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def counted(read, expected, timeout=5):
    """A worker counts an op once sendmsg has returned its answer, which
    may be just after the client read it: polls read() until it gives
    expected (or the time is up) and returns what it last gave, for the
    caller to assert on."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if value == expected or time.monotonic() > deadline:
            return value
        time.sleep(0.01)


def stat(stats, name):
    """A counter from a stats dict, failing with the names there are when
    the server does not report it."""
    assert name in stats, f"stats have no {name!r}; they have {sorted(stats)}"
    return stats[name]


def run_gdrkv(*args, env=None, timeout=60, drop=()):
    """The `gdrkv` command in a child process: its CompletedProcess (text).
    drop names variables of this environment the child must not see, env
    adds some."""
    child_env = {k: v for k, v in os.environ.items() if k not in drop}
    child_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "gdrkv", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=child_env)


CHILD_PRELUDE = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import gdrkv
from gdrkv import errors
ARGS = sys.argv[2:]
"""


def python_child(code, *args, env=None, timeout=120):
    """Runs code in a child Python (after CHILD_PRELUDE: tests/ importable
    (so is support), gdrkv, numpy, errors, ARGS = args as strings) and returns
    its stdout; it must exit 0. env adds variables: softverbs reads its
    SOFTVERBS_* settings once per process, so a test that needs other ones
    runs its client here."""
    done = subprocess.run([sys.executable, "-c", CHILD_PRELUDE + code, TESTS_DIR,
                           *map(str, args)], env=dict(os.environ, **(env or {})),
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"child exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


def build_preload(name, directory):
    """tests/native/<name>.c built as an LD_PRELOAD shim into directory;
    returns the LD_PRELOAD value that adds it to this environment's (after
    the sanitizer runtimes, which must come first)."""
    shim = os.path.join(str(directory), name + ".so")
    source = os.path.join(TESTS_DIR, "native", name + ".c")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", shim, source, "-ldl"], check=True)
    return f"{os.environ.get('LD_PRELOAD', '')} {shim}".strip()


def unique(prefix="t"):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
