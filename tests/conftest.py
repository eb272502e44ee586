"""Shared fixtures and helpers: real `gdrkv serve` processes, clients, and
content that is a pure function of its key so any read can be checked
without remembering what was written."""
import contextlib
import faulthandler
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import gdrkv
import wire

# The rdma transport runs over softverbs (the software libibverbs built with
# the package) in every process of the suite: set before any client or
# server loads libibverbs, which happens once per process. Servers started
# by the tests inherit it and serve rdma (their default is rdma auto).
try:
    import gdrkv.softverbs
    SOFTVERBS = gdrkv.softverbs.library_path()
except (ImportError, OSError, RuntimeError):
    SOFTVERBS = None
if SOFTVERBS:
    os.environ.setdefault("GDRKV_IBVERBS_LIB", SOFTVERBS)
elif os.environ.get("GDRKV_REQUIRE_RDMA") == "1":
    raise RuntimeError("GDRKV_REQUIRE_RDMA=1 but softverbs was not built "
                       "(reinstall gdrkv: setup.py's build_ext builds it)")
TRANSPORTS = ["tcp", "shm", "rdma"] if SOFTVERBS else ["tcp", "shm"]

settings.register_profile(
    "gdrkv",
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture],
)
settings.load_profile("gdrkv")

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
TEST_TIMEOUT_S = 400.0          # above the slowest test (the native suite's 300 s)
LISTEN_LINE = re.compile(rb"^gdrkv listening on (\S+)", re.M)
SHM_LINE = re.compile(rb"^gdrkv listening on .*shm on ([^,\s)]+)", re.M)
PR_SET_PDEATHSIG = 1


# Where the hang guard writes the stacks: pytest captures fd 2, and a
# process that exits from the guard never hands the capture back, so
# tests/run.sh prints this file when a pass fails.
HANG_LOG = open(os.path.join(tempfile.gettempdir(), f"gdrkv-hang-{os.getpid()}.log"), "w")


@pytest.fixture(autouse=True)
def hang_guard():
    """A call that never returns ends the run with every thread's stack
    instead of blocking CI forever (the servers die with it: see
    DIE_WITH_PARENT)."""
    faulthandler.dump_traceback_later(TEST_TIMEOUT_S, exit=True, file=HANG_LOG)
    yield
    faulthandler.cancel_dump_traceback_later()


# ---------------------------------------------------------------- content

def as_key_bytes(key):
    return key.encode() if isinstance(key, str) else bytes(key)


def content(key, size):
    """The bytes a test stores under key: deterministic in (key, size), so a
    wrong object, a stale object or a torn write can never look right."""
    digest = hashlib.blake2b(as_key_bytes(key) + size.to_bytes(8, "little"), digest_size=8)
    return np.random.default_rng(int.from_bytes(digest.digest(), "little")).bytes(size)


def batch_put_bytes(client, keys, values):
    """batch_put of in-memory values staged in one registered buffer."""
    staging = np.empty(max(1, sum(len(v) for v in values)), np.uint8)
    base, _ = client.register(staging)
    try:
        ptrs, sizes, off = [], [], 0
        for value in values:
            staging[off:off + len(value)] = np.frombuffer(value, np.uint8)
            ptrs.append(base + off)
            sizes.append(len(value))
            off += len(value)
        return client.batch_put(keys, ptrs, sizes)
    finally:
        client.unregister(base)


def batch_get_bytes(client, keys, capacities):
    """batch_get into a fresh registered buffer: (results, values), where
    values[i] holds the bytes read, or None when results[i] is an error."""
    dest = np.zeros(max(1, sum(capacities)), np.uint8)
    base, _ = client.register(dest)
    try:
        offsets = np.concatenate(([0], np.cumsum(capacities)[:-1])).astype(int).tolist()
        results = client.batch_get(keys, [base + off for off in offsets], list(capacities))
        values = [dest[off:off + r].tobytes() if r >= 0 else None
                  for off, r in zip(offsets, results)]
        return results, values
    finally:
        client.unregister(base)


def check_read(key, size, result, value, allowed_errors=(gdrkv.errors.E_NOT_FOUND,)):
    """A read is either one of the allowed errors or exactly content(key, size)."""
    if result < 0:
        assert result in allowed_errors, (
            f"{key!r}: unexpected error {result} ({gdrkv.errors.strerror(result)})")
        return False
    assert result == size, f"{key!r}: read {result} bytes, stored {size}"
    assert value == content(key, size), f"{key!r}: wrong bytes"
    return True


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
    """Runs code in a child Python (after CHILD_PRELUDE: the tests folder
    importable, gdrkv, numpy, errors, ARGS = args as strings) and returns
    its stdout; it must exit 0. env adds variables: softverbs reads its
    SOFTVERBS_* settings once per process, so a test that needs other ones
    runs its client here."""
    done = subprocess.run([sys.executable, "-c", CHILD_PRELUDE + code, os.path.dirname(__file__),
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
    source = os.path.join(os.path.dirname(__file__), "native", name + ".c")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", shim, source, "-ldl"], check=True)
    return f"{os.environ.get('LD_PRELOAD', '')} {shim}".strip()


def unique(prefix="t"):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# ---------------------------------------------------------------- servers

# Started in front of a server's command: the kernel SIGKILLs the server when
# pytest dies, so none outlives an aborted run (the setting survives exec).
# Not a preexec_fn: Python code between fork and exec can deadlock in a
# process with threads (the suite has many, ASan more), and Popen then waits
# for that child forever.
DIE_WITH_PARENT = [sys.executable, "-c",
                   "import ctypes, os, sys; "
                   f"ctypes.CDLL(None).prctl({PR_SET_PDEATHSIG}, {int(signal.SIGKILL)}); "
                   "os.execv(sys.argv[1], sys.argv[1:])"]


class ServerProcess:
    """One `gdrkv serve` child. stdout and stderr go to files, never pipes,
    so a chatty server can never block on a full pipe."""

    def __init__(self, workdir, memory, args):
        self.workdir, self.memory, self.args = workdir, memory, list(args)
        self.name = unique("server")
        # GDRKV_TEST_POOL_FILE=1 runs every server on a pool file (tmpfs),
        # so that a suite proves the transports over a file-backed pool.
        self.pool_file = None
        if os.environ.get("GDRKV_TEST_POOL_FILE") == "1" and "--pool-file" not in self.args:
            self.pool_file = f"/dev/shm/gdrkv-test-{os.getpid()}-{self.name}.pool"
            self.args += ["--pool-file", self.pool_file]
        self.proc = None
        self.address = None
        self.must_exit_cleanly = False

    @property
    def url(self):
        return f"gdrkv://{self.address}"

    @property
    def unix_path(self):
        """The shm socket it announced, or None."""
        match = SHM_LINE.search(self.stdout())
        return match.group(1).decode() if match else None

    @property
    def port(self):
        return int(self.address.rsplit(":", 1)[1])

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self, listen="127.0.0.1:0"):
        cmd = [sys.executable, "-m", "gdrkv", "serve", "--listen", listen,
               "--memory", str(self.memory), "--no-pretouch", *self.args]
        with open(self.out_path, "wb") as out, open(self.log_path, "ab") as err:
            self.proc = subprocess.Popen(DIE_WITH_PARENT + cmd, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=err)
        self.must_exit_cleanly = True
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            match = LISTEN_LINE.search(self.stdout())
            if match:
                self.address = match.group(1).decode()
                return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{' '.join(cmd)} did not start:\n{self.log_tail()}")
            time.sleep(0.02)

    @property
    def out_path(self):
        return os.path.join(self.workdir, self.name + ".out")

    def stdout(self):
        with open(self.out_path, "rb") as f:
            return f.read()

    @property
    def log_path(self):
        return os.path.join(self.workdir, self.name + ".log")

    def log_tail(self, nbytes=4000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-nbytes:].decode(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def token(self):
        """The bytes of its --auth-token-file, or None."""
        args = list(self.args)
        if "--auth-token-file" not in args:
            return None
        with open(args[args.index("--auth-token-file") + 1], "rb") as f:
            return f.read().rstrip()

    def stats(self):
        return wire.server_stats(self.address, token=self.token)

    def kill(self):
        """SIGKILL, as a crash would; teardown then expects it dead."""
        self.must_exit_cleanly = False
        if self.alive:
            self.proc.kill()
        if self.proc:
            self.proc.wait(STOP_TIMEOUT_S)

    def restart(self):
        """Starts again on the same address (after kill() or stop())."""
        if self.alive:
            self.stop()
        return self.start(self.address)

    def stop(self, sig=signal.SIGTERM):
        """Sends sig and waits; returns the exit code, or None when it had
        to be SIGKILLed. Teardown then expects it stopped."""
        self.must_exit_cleanly = False
        if not self.alive:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGCONT)   # in case a test left it stopped
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def shutdown_problem(self):
        """Stops the server; what went wrong, or None."""
        if not self.must_exit_cleanly:      # the test killed or stopped it
            self.stop()
            return None
        if not self.alive:
            return f"{self.address} died during the test (exit {self.proc.returncode}):\n" \
                   f"{self.log_tail()}"
        rc = self.stop()
        if rc != 0:
            return f"{self.address} exited {rc} on SIGTERM:\n{self.log_tail()}"
        return None


def remove_stale_socket(path):
    """A killed server leaves its socket file behind; a live one (its port
    may have gone to another server since) is left alone."""
    if not path:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)
        except OSError:
            pass                        # already gone


class ServerSet:
    def __init__(self, workdir):
        self.workdir = workdir
        self.servers = []

    def start(self, memory="64MiB", args=(), listen="127.0.0.1:0"):
        server = ServerProcess(self.workdir, memory, args)
        self.servers.append(server)
        return server.start(listen)

    def stop_all(self):
        problems = [p for p in (s.shutdown_problem() for s in self.servers) if p]
        for server in self.servers:
            remove_stale_socket(server.unix_path)
            if server.pool_file and os.path.exists(server.pool_file):
                os.unlink(server.pool_file)
        assert not problems, "\n\n".join(problems)


@pytest.fixture
def server_factory(tmp_path):
    """start(memory=..., args=[...]) -> ServerProcess; all are stopped with
    SIGTERM at teardown and must exit 0 (unless the test killed them)."""
    servers = ServerSet(str(tmp_path))
    yield servers.start
    servers.stop_all()


@pytest.fixture(scope="module")
def server(tmp_path_factory, request):
    """One server process per module; a module sets SERVER_MEMORY and
    SERVER_ARGS to change how it is started."""
    servers = ServerSet(str(tmp_path_factory.mktemp("servers")))
    memory = getattr(request.module, "SERVER_MEMORY", "128MiB")
    yield servers.start(memory, getattr(request.module, "SERVER_ARGS", ()))
    servers.stop_all()


@pytest.fixture
def make_client():
    """Client factory; every client is closed at teardown."""
    clients = []

    def make(url, **options):
        client = gdrkv.Client(url, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def make_backend(server):
    """make_backend(options=..., **storage config fields) -> gdrkv's SGLang
    HiCache backend on the module's server in this test's namespace, closed
    at teardown (the SGLang tests; imports SGLang on first use)."""
    import sglang_pools as sp
    from gdrkv.adapters.sglang_hicache import GdrkvHiCacheStorage

    namespace = unique("ns")
    backends = []

    def make(options=None, **fields):
        extra = sp.extra_config(server.url, namespace=namespace, **(options or {}))
        backends.append(GdrkvHiCacheStorage(sp.storage_config(extra=extra, **fields), {}))
        return backends[-1]

    yield make
    for backend in backends:
        backend.close()


@pytest.fixture
def client(server, make_client):
    """A client of the module's server in a namespace of its own, so tests
    sharing the server never see each other's keys."""
    return make_client(server.url, namespace=unique("ns"))


# ---------------------------------------------------------------- fake servers

class FakeServer:
    """A listening socket whose connections are each handed to behaviour(conn)
    in a thread: the misbehaving servers of the fail-soft tests. The client
    going away ends a behaviour quietly; anything else it raises (a request
    it could not parse, a broken fake) fails the test at teardown."""

    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.url = "gdrkv://" + self.address
        self.conns = []
        self.errors = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return                      # listener closed
            conn = wire.Conn(sock, timeout=30)
            self.conns.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, conn):
        try:
            self.behaviour(conn)
        except (OSError, wire.PeerClosed):
            pass                            # the client went away
        except BaseException as e:          # re-raised by close()
            self.errors.append(e)

    def close(self):
        # shutdown() wakes the accept() blocked in the other thread; close() alone does not.
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for conn in self.conns:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        for thread in self.threads:
            thread.join(5)
        if self.errors:
            raise self.errors[0]


def drain(conn):
    """Reads and discards until the peer closes."""
    while conn.sock.recv(1 << 16):
        pass


@pytest.fixture
def fake_server():
    """fake_server(behaviour) -> FakeServer, closed at teardown."""
    servers = []

    def start(behaviour):
        servers.append(FakeServer(behaviour))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


# ---------------------------------------------------------------- the vLLM environment

# vLLM pins another transformers than SGLang, so it has a virtual environment
# of its own (tests/install_vllm_env.sh; tests/run.sh makes it): tests run
# scripts there as fresh processes against real `gdrkv serve` processes.
VLLM_PYTHON = Path(os.environ.get("GDRKV_VLLM_PYTHON",
                                  Path(__file__).resolve().parent.parent / ".venv-vllm/bin/python"))


@pytest.fixture(scope="module")
def vllm_python():
    if not VLLM_PYTHON.exists():
        message = f"no vLLM test environment at {VLLM_PYTHON}: run tests/install_vllm_env.sh"
        if os.environ.get("GDRKV_REQUIRE_ENGINES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return str(VLLM_PYTHON)


def vllm_env(**extra):
    """The environment of a script in the vLLM environment: CPU, offline, no
    PYTHONHASHSEED unless given. The sanitized pass of tests/run.sh
    instruments .venv-test's gdrkv and softverbs, not that environment's
    gdrkv: neither its runtime nor that softverbs may be loaded there (the
    client picks shm on this host anyway)."""
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1")
    for name in ("PYTHONHASHSEED", "LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS",
                 "GDRKV_IBVERBS_LIB"):
        env.pop(name, None)
    env.update(extra)
    return env


def run_vllm_script(python, args, env, timeout=300):
    """Runs a script of tests/ in the vLLM environment; its last stdout line
    (JSON) as a dict."""
    done = subprocess.run([python, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
