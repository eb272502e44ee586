"""The systems `gdrkv bench --compare` measures, behind one small interface,
and the peer servers it starts for them.

A store is given one size's source and destination buffers by attach(),
then moves whole batches: put(keys) from the source, get(keys) into the
destination, exists(keys), delete(keys). Each call checks every key's
outcome and raises RuntimeError on any failure, so a fast wrong answer can
never be reported as throughput. open_stores() yields every system of the
comparison, each either a store or the reason it cannot be measured here.
"""
import contextlib
import ctypes
import os
import select
import shutil
import socket
import subprocess
import sys
import time

from ..client import Client
from ..errors import GdrkvError

START_TIMEOUT_S = 60
# Mooncake's master listens on these fixed ports; the comparison runs it
# inside a private network namespace, where nothing else can hold them.
MOONCAKE_MASTER = "127.0.0.1:50051"
MOONCAKE_METADATA = "http://127.0.0.1:8080/metadata"
MOONCAKE_METADATA_PORT = 8080
# Mooncake's own staging buffer; transfers here go from registered memory.
MOONCAKE_LOCAL_BUFFER = 16 << 20
NETNS_ENV = "GDRKV_BENCH_NETNS"


def _address(buf):
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def _check(what, outcomes, ok):
    """Raises unless ok(outcome) holds for every key's outcome."""
    failed = [o for o in outcomes if not ok(o)]
    if failed:
        raise RuntimeError(f"{what}: {len(failed)} of {len(outcomes)} keys failed "
                           f"(first outcome {failed[0]!r})")


class _PointerStore:
    """A store whose batch calls take raw (pointer, size) lists into
    memory registered with it beforehand: gdrkv and Mooncake."""

    def attach(self, src, dst, size, count):
        self._buffers = [_address(src), _address(dst)]
        for ptr, buf in zip(self._buffers, (src, dst)):
            self._register(ptr, len(buf))
        self.size, self._sizes = size, [size] * count
        self._src = [self._buffers[0] + i * size for i in range(count)]
        self._dst = [self._buffers[1] + i * size for i in range(count)]

    def detach(self):
        for ptr in self._buffers:
            self._unregister(ptr)


class GdrkvStore(_PointerStore):
    def __init__(self, url, transport, namespace):
        self.client = Client(url, transport=transport, namespace=namespace)

    def _register(self, ptr, nbytes):
        self.client.register(ptr, nbytes)

    def _unregister(self, ptr):
        self.client.unregister(ptr)

    def put(self, keys):
        _check("gdrkv put", self.client.batch_put(keys, self._src, self._sizes), _is(0))

    def get(self, keys):
        _check("gdrkv get", self.client.batch_get(keys, self._dst, self._sizes), _is(self.size))

    def exists(self, keys):
        _check("gdrkv exists", self.client.batch_exists(keys), _is(True))

    def delete(self, keys):
        _check("gdrkv delete", self.client.batch_delete(keys), _is(0))

    def close(self):
        self.client.close()


class MooncakeStore(_PointerStore):
    """A Mooncake Store client that holds no segment: every object lives in
    the segment of another process (mooncake_segment_holder), as gdrkv's
    objects live in the server process."""

    def __init__(self, store):
        self.store = store

    def _register(self, ptr, nbytes):
        _check("mooncake register_buffer", [self.store.register_buffer(ptr, nbytes)], _is(0))

    def _unregister(self, ptr):
        self.store.unregister_buffer(ptr)

    def put(self, keys):
        _check("mooncake put", self.store.batch_put_from(keys, self._src, self._sizes), _is(0))

    def get(self, keys):
        _check("mooncake get", self.store.batch_get_into(keys, self._dst, self._sizes),
               _is(self.size))

    def exists(self, keys):
        _check("mooncake exists", self.store.batch_is_exist(keys), _is(1))

    def delete(self, keys):
        # force: a read leaves a lease on the object that would refuse it.
        _check("mooncake delete", self.store.batch_remove(keys, True), _is(0))

    def close(self):
        self.store.close()


class RedisStore:
    """Redis as its users batch it: pipelined SET and EXISTS, one MGET."""

    def __init__(self, port):
        import redis
        self.redis = redis.Redis(host="127.0.0.1", port=port)

    def attach(self, src, dst, size, count):
        # redis-py sends a memoryview without copying it into the command.
        source = memoryview(src)
        self.values = [source[i * size:(i + 1) * size] for i in range(count)]
        self.dst, self.size = memoryview(dst), size

    def detach(self):
        self.values = self.dst = None

    def put(self, keys):
        pipe = self.redis.pipeline(transaction=False)
        for key, value in zip(keys, self.values):
            pipe.set(key, value)
        _check("redis put", pipe.execute(), _is(True))

    def get(self, keys):
        # redis-py returns each value as new bytes: they still have to land
        # in the caller's buffer, where the other systems put them.
        values = self.redis.mget(keys)
        _check("redis get", values, lambda v: v is not None and len(v) == self.size)
        for i, value in enumerate(values):
            self.dst[i * self.size:(i + 1) * self.size] = value

    def exists(self, keys):
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.exists(key)
        _check("redis exists", pipe.execute(), _is(1))

    def delete(self, keys):
        _check("redis delete", [self.redis.delete(*keys)], _is(len(keys)))

    def close(self):
        self.redis.close()


def _is(expected):
    return lambda outcome: outcome == expected


# ---------------------------------------------------------------- systems

@contextlib.contextmanager
def open_stores(url, capacity, logs):
    """Yields {system: store or the reason it is not measured}. url is the
    gdrkv server's; capacity is the most bytes a peer must hold at once;
    the peers' logs go to the folder logs."""
    with contextlib.ExitStack() as stack:
        systems = {}
        for transport in ("tcp", "shm"):
            systems[f"gdrkv {transport}"] = _try(stack, lambda t=transport: _gdrkv(url, t))
        systems["mooncake tcp"] = _try(stack, lambda: _mooncake(stack, capacity, logs))
        systems["redis"] = _try(stack, lambda: _redis(stack, logs))
        yield systems


def _try(stack, open_store):
    """The store open_store() returns, closed with the stack, or the reason
    it could not be opened (a str): a peer that fails to start costs its own
    rows, not the whole comparison."""
    try:
        store = open_store()
    except _Unavailable as e:
        return str(e)
    except RuntimeError as e:
        return f"failed: {e}"
    stack.callback(store.close)
    return store


class _Unavailable(Exception):
    """A system this machine cannot measure; the message says why."""


def _gdrkv(url, transport):
    try:
        return GdrkvStore(url, transport, f"gdrkv-compare-{os.getpid()}-{transport}")
    except (ValueError, GdrkvError) as e:
        raise _Unavailable(f"not available: {e}") from None


def _redis(stack, logs):
    server = shutil.which("redis-server")
    try:
        import redis  # noqa: F401  (only whether it imports)
    except ImportError:
        server = None
    if server is None:
        raise _Unavailable("not installed (tests/install_peers.sh)")
    port = _free_port()
    _start(stack, [server, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                   "--appendonly", "no", "--protected-mode", "yes"],
           os.path.join(logs, "redis.log"), port)
    return RedisStore(port)


def lmcache_server(stack, logs):
    """Starts LMCache's own remote store, its `lm://` server
    (python -m lmcache.v1.server), stopped with the stack: its port."""
    try:
        import lmcache.v1.server  # noqa: F401  (only whether it imports)
    except ImportError:
        raise _Unavailable("not installed (tests/install_engines.sh)") from None
    port = _free_port()
    _start(stack, [sys.executable, "-m", "lmcache.v1.server", "127.0.0.1", str(port), "cpu"],
           os.path.join(logs, "lmcache_server.log"), port)
    return port


def redis_port(store):
    """The port of the Redis server open_stores() started (the LMCache
    shootout points LMCache's redis:// backend at it)."""
    return store.redis.connection_pool.connection_kwargs["port"]


def _mooncake(stack, capacity, logs):
    # Its transfer engine looks for a LAN address unless told to use
    # loopback; glog's INFO lines would bury the progress bar.
    os.environ["MC_TCP_BIND_ADDRESS"] = "127.0.0.1"
    os.environ.setdefault("GLOG_minloglevel", "2")
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError:
        raise _Unavailable("not installed (tests/install_peers.sh)") from None
    if os.environ.get(NETNS_ENV) != "1":
        # Its master and transfer engine bind 0.0.0.0 whatever they are told.
        raise _Unavailable("skipped: Mooncake binds 0.0.0.0, so it runs only inside a private "
                           "network namespace (unshare --net), which this run could not create")
    master = os.path.join(os.path.dirname(sys.executable), "mooncake_master")
    _start(stack, [master, f"--rpc_address={MOONCAKE_MASTER.split(':')[0]}",
                   "--enable_http_metadata_server=true",
                   "--http_metadata_server_host=127.0.0.1"],
           os.path.join(logs, "mooncake_master.log"), MOONCAKE_METADATA_PORT)
    holder_code = ("from gdrkv.bench.peers import mooncake_segment_holder; "
                   f"mooncake_segment_holder({capacity})")
    holder = _start(stack, [sys.executable, "-c", holder_code],
                    os.path.join(logs, "mooncake_holder.log"), None, stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE)
    ready, _, _ = select.select([holder.stdout], [], [], START_TIMEOUT_S)
    if not ready or holder.stdout.readline().strip() != b"ready":
        raise RuntimeError(f"the Mooncake segment holder did not start (see {logs})")
    store = MooncakeDistributedStore()
    _check("mooncake setup", [_mooncake_setup(store, 0)], _is(0))
    return MooncakeStore(store)


def _mooncake_setup(store, segment_bytes):
    return store.setup("127.0.0.1", MOONCAKE_METADATA, segment_bytes, MOONCAKE_LOCAL_BUFFER,
                       "tcp", "", MOONCAKE_MASTER)


def mooncake_segment_holder(segment_bytes):
    """Runs in its own process: mounts a segment of segment_bytes in the
    Mooncake cluster, says "ready", and holds it until stdin closes."""
    from mooncake.store import MooncakeDistributedStore
    store = MooncakeDistributedStore()
    if _mooncake_setup(store, segment_bytes) != 0:
        sys.exit("mooncake setup failed")
    print("ready", flush=True)
    sys.stdin.read()
    store.close()


def _start(stack, command, log_path, port, **popen):
    """Starts command (its output to log_path), stopped with the stack;
    waits until it accepts connections on port (when given)."""
    with open(log_path, "ab") as log:
        popen.setdefault("stdout", log)
        proc = subprocess.Popen(command, stderr=log, **popen)
    stack.callback(_stop, proc)
    deadline = time.monotonic() + START_TIMEOUT_S
    while port is not None and not _accepts(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{os.path.basename(command[0])} did not start (see {log_path})")
        time.sleep(0.05)
    return proc


def _stop(proc):
    if proc.stdin:
        proc.stdin.close()      # the segment holder's signal to quit
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout:
        proc.stdout.close()


def _accepts(port):
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def private_netns_command(argv):
    """argv run inside a new network namespace holding only loopback (with
    NETNS_ENV set), or None when this machine cannot make one."""
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("ip") is None:
        return None
    # Without root, a user namespace grants the right to make the net one.
    command = [unshare, "--net"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    probe = subprocess.run(command + ["ip", "link", "set", "lo", "up"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    if probe.returncode != 0:
        return None
    return command + ["sh", "-c", f'ip link set lo up && {NETNS_ENV}=1 exec "$@"', "sh", *argv]
