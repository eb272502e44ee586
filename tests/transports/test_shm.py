"""The shm transport: a local client maps the pool read-only and copies
objects out of it under a lease. These tests check that the path is really
taken, what a client can and cannot do with the pool, that leases end
whatever the reader does (release, die, stall), and that readers of an
expired lease report failures, never wrong bytes.

Run as a script (`test_shm.py URL NAMESPACE SEED`) it is one of the worker
processes of test_processes_read_and_write_while_eviction_runs."""
import itertools
import mmap
import os
import random
import signal
import socket
import stat as stat_mode
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import gdrkv
from support import wire
from support.content import batch_get_bytes, batch_put_bytes, check_read, content
from support.util import background, stat, unique, wait_for
from gdrkv import errors

pytestmark = pytest.mark.pool_file

SERVER_MEMORY = "64MiB"


def shm_client(make_client, server, **options):
    return make_client(server.url, namespace=unique("shm"), transport="shm", **options)


def lease(conn, keys, ns, capacity=1 << 30):
    """A raw LEASE on a unix Conn: [(status, size, chunks)]."""
    conn.send(wire.request(wire.OP_LEASE, [(k.encode(), capacity) for k in keys], ns=ns.encode()))
    hdr, body, payload = conn.read_frame()
    assert (hdr.opcode, hdr.status, hdr.count, payload) == \
        (wire.OP_LEASE | wire.OP_RESPONSE, 0, len(keys), b"")
    return wire.decode_lease(body, len(keys))


def release(conn):
    """RELEASE on a unix Conn: the frame status."""
    hdr, _, _ = conn.call(wire.OP_RELEASE)
    assert hdr.opcode == wire.OP_RELEASE | wire.OP_RESPONSE
    return hdr.status


def pinned(server):
    return stat(server.stats(), "pinned_objects")


# ---------------------------------------------------------------- the path

def test_socket_and_directory_are_owner_only(server):
    path = server.unix_path
    assert path, f"the server announced no shm socket:\n{server.stdout()!r}"
    sock_stat, dir_stat = os.stat(path), os.stat(os.path.dirname(path))
    assert stat_mode.S_ISSOCK(sock_stat.st_mode)
    assert stat_mode.S_IMODE(sock_stat.st_mode) == 0o600
    assert stat_mode.S_IMODE(dir_stat.st_mode) & 0o077 == 0
    assert sock_stat.st_uid == dir_stat.st_uid == os.geteuid()


def test_gets_copy_from_the_pool_and_no_value_crosses_a_socket(server, make_client):
    client = shm_client(make_client, server)
    keys = [f"path-{i}" for i in range(32)]
    sizes = [1 + 4099 * i for i in range(32)]
    assert batch_put_bytes(client, keys, [content(k, s) for k, s in zip(keys, sizes)]) == \
        [0] * len(keys)
    before = server.stats()
    results, values = batch_get_bytes(client, keys, sizes)
    for key, size, result, value in zip(keys, sizes, results, values):
        check_read(key, size, result, value, allowed_errors=())
    after = server.stats()
    assert stat(after, "bytes_out") == stat(before, "bytes_out"), "GET values went over a socket"
    assert stat(after, "shm_lease_bytes") - stat(before, "shm_lease_bytes") == sum(sizes)
    counters = client.stats()["client"]
    assert counters["shm_connects"] == counters["connects"] >= 1
    assert counters["shm_bytes_copied"] == sum(sizes)
    wait_for(lambda: pinned(server) == 0, 5, "the leases to be released")


def test_unix_url_reaches_the_server(server, make_client):
    writer = shm_client(make_client, server)
    writer.put("by-path", b"v" * 1000)
    client = make_client(f"gdrkv://unix:{server.unix_path}?namespace={writer.namespace}")
    assert client.get("by-path") == b"v" * 1000
    assert client.stats()["client"]["shm_bytes_copied"] == 1000


def test_auto_picks_shm_on_loopback_and_tcp_stays_tcp(server, make_client):
    auto = make_client(server.url, namespace=unique())
    tcp = make_client(server.url, namespace=auto.namespace, transport="tcp")
    auto.put("k", b"x" * 5000)
    assert auto.get("k") == tcp.get("k") == b"x" * 5000
    assert auto.stats()["client"]["shm_bytes_copied"] == 5000
    assert tcp.stats()["client"]["shm_connects"] == 0


def test_shm_needs_a_local_server():
    with pytest.raises(ValueError, match="shm"):
        gdrkv.Client("gdrkv://10.255.255.1:7480", transport="shm")
    with pytest.raises(ValueError, match="tcp"):
        gdrkv.Client("gdrkv://unix:/tmp/nowhere.sock", transport="tcp")


def test_shm_off_makes_auto_use_tcp_and_shm_unavailable(server_factory, make_client):
    server = server_factory(args=["--unix-path", ""])
    assert server.unix_path is None
    auto = make_client(server.url, namespace=unique())
    auto.put("k", b"y" * 100)
    assert auto.get("k") == b"y" * 100
    assert auto.stats()["client"]["shm_connects"] == 0
    shm = make_client(server.url, namespace=auto.namespace, transport="shm", timeout_ms=500)
    assert shm.batch_exists(["k"]) == [False]
    assert shm.batch_sizes(["k"]) == [errors.E_UNAVAILABLE]


# ---------------------------------------------------------------- what a client can do

@pytest.mark.memfd_pool("a pool file has no seals: test_restart checks what clients get instead")
def test_pool_is_shared_read_only_and_sealed(server):
    with wire.connect_unix(server.unix_path) as conn:
        hdr, results, fd = wire.hello(conn)
    assert hdr.status == 0 and fd is not None
    try:
        (status, size), = results
        assert status == 0 and size == stat(server.stats(), "pool_bytes")
        assert os.fstat(fd).st_size >= size
        view = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        view.close()
        with pytest.raises(PermissionError):
            mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        with pytest.raises(OSError):
            os.ftruncate(fd, 0)
        # Reopening the memfd read-write is possible for its owner, but the
        # seals still refuse writes, writable mappings and resizing.
        rw = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
        try:
            with pytest.raises(PermissionError):
                mmap.mmap(rw, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            with pytest.raises(PermissionError):
                os.pwrite(rw, b"corrupt", 0)
            with pytest.raises(PermissionError):
                os.ftruncate(rw, 2 * size)
        finally:
            os.close(rw)
    finally:
        os.close(fd)


def test_shm_ops_are_refused_over_tcp(server):
    with wire.connect(server.address) as conn:
        for op in (wire.OP_HELLO, wire.OP_RELEASE):
            hdr, _, _ = conn.call(op)
            assert hdr.status == errors.E_UNSUPPORTED
        hdr, _, _ = conn.call(wire.OP_LEASE, [(b"k", 10)])
        assert hdr.status == errors.E_UNSUPPORTED
        hdr, _, _ = conn.call(wire.OP_PING)
        assert hdr.status == 0, "the connection did not survive the refusals"


def test_release_without_lease_is_invalid(server):
    with wire.connect_unix(server.unix_path) as conn:
        assert release(conn) == errors.E_INVALID
        hdr, _, _ = conn.call(wire.OP_PING)
        assert hdr.status == 0


# ---------------------------------------------------------------- leases

def test_lease_pins_until_release(server, make_client):
    client = shm_client(make_client, server)
    client.put("leased", content("leased", 3 << 20))
    with wire.connect_unix(server.unix_path) as conn:
        (status, size, chunks), = lease(conn, ["leased"], client.namespace)
        assert (status, size) == (0, 3 << 20)
        assert sum(length for _, length in chunks) == size
        assert pinned(server) == 1
        assert release(conn) == 0
        assert pinned(server) == 0


def test_lease_too_small_and_missing_keys_pin_nothing(server, make_client):
    client = shm_client(make_client, server)
    client.put("small", b"s" * 100)
    with wire.connect_unix(server.unix_path) as conn:
        answer = lease(conn, ["small", "absent"], client.namespace, capacity=10)
        assert answer == [(errors.E_TOO_SMALL, 100, []), (errors.E_NOT_FOUND, 0, [])]
        assert pinned(server) == 0


def test_next_frame_ends_a_lease(server, make_client):
    client = shm_client(make_client, server)
    client.put("implicit", b"i" * 100)
    with wire.connect_unix(server.unix_path) as conn:
        lease(conn, ["implicit"], client.namespace)
        assert pinned(server) == 1
        conn.call(wire.OP_PING)
        assert pinned(server) == 0


@pytest.mark.parametrize("how", ["close", "sigkill"])
def test_reader_gone_drops_its_lease(server, make_client, tmp_path, how):
    client = shm_client(make_client, server)
    client.put("held", b"h" * 1000)
    if how == "close":
        with wire.connect_unix(server.unix_path) as conn:
            lease(conn, ["held"], client.namespace)
            assert pinned(server) == 1
    else:
        ready = tmp_path / "ready"
        holder = subprocess.Popen([sys.executable, __file__, "hold", server.unix_path,
                                   client.namespace, "held", str(ready)])
        try:
            wait_for(ready.exists, 20, "the holder to take its lease")
            assert pinned(server) == 1
        finally:
            holder.kill()
            holder.wait(10)
    # Well before the 5 s lease timeout: the connection's end is enough.
    wait_for(lambda: pinned(server) == 0, 2, "the dead reader's pins to drop")


def test_stalled_reader_loses_its_lease(server_factory, make_client):
    server = server_factory(args=["--lease-timeout-ms", "200"])
    client = shm_client(make_client, server)
    client.put("stalled", b"z" * 1000)
    with wire.connect_unix(server.unix_path) as conn:
        lease(conn, ["stalled"], client.namespace)
        wait_for(lambda: pinned(server) == 0, 5, "the lease to expire")
        assert stat(server.stats(), "shm_leases_expired") == 1
        assert release(conn) == errors.E_TIMEOUT
        # The connection goes on; a fresh lease is honoured.
        lease(conn, ["stalled"], client.namespace)
        assert release(conn) == 0


def test_the_lease_word_says_whether_the_lease_holds(server_factory, make_client):
    """After HELLO, the connection's staging ends in the lease word: 1 from
    a LEASE answer with pins, 0 before the server lets them go (RELEASE,
    the next frame, expiry). A RELEASE flagged unanswered ends the lease
    and sends nothing back: the next answer on the connection is the next
    request's."""
    server = server_factory(args=["--lease-timeout-ms", "300"])
    client = shm_client(make_client, server)
    ns = client.namespace
    client.put("w", b"w" * 1000)
    with wire.connect_unix(server.unix_path) as conn:
        hdr, _, (pool_fd, staging_fd) = wire.hello_fds(conn)
        os.close(pool_fd)
        size = os.fstat(staging_fd).st_size
        view = mmap.mmap(staging_fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        os.close(staging_fd)

        def word():
            return struct.unpack_from("<I", view, size - wire.LEASE_WORD_BYTES)[0]

        assert hdr.flags & wire.HELLO_LEASE_WORD and word() == 0
        lease(conn, ["w"], ns)
        assert word() == 1
        assert release(conn) == 0 and word() == 0
        assert lease(conn, ["absent"], ns) == [(errors.E_NOT_FOUND, 0, [])]
        assert word() == 0                      # nothing pinned, nothing held
        lease(conn, ["w"], ns)
        conn.call(wire.OP_PING)
        assert word() == 0 and pinned(server) == 0
        lease(conn, ["w"], ns)
        wait_for(lambda: word() == 0, 5, "the lease to expire")
        assert pinned(server) == 0 and release(conn) == errors.E_TIMEOUT
        lease(conn, ["w"], ns)
        assert word() == 1
        conn.send(wire.Header(opcode=wire.OP_RELEASE, flags=wire.RELEASE_UNANSWERED,
                              req_id=7).pack())
        hdr, _, _ = conn.call(wire.OP_PING, req_id=8)
        assert (hdr.opcode, hdr.req_id, hdr.status) == (wire.OP_PING | wire.OP_RESPONSE, 8, 0)
        assert word() == 0 and pinned(server) == 0
        view.close()


@pytest.mark.parametrize("staging", ["16MiB", "0"])
def test_gets_seen_held_end_their_leases_unanswered(server_factory, make_client, staging):
    """A GET over shm reads its connection's lease word once the copy is
    done: seen held, the RELEASE goes unanswered (no round trip). Without
    staging there is no word and every RELEASE is answered. Byte-exact
    either way."""
    server = server_factory(args=["--shm-staging", staging])
    client = shm_client(make_client, server, conns=1)
    keys = [f"seen-{i}" for i in range(32)]
    values = [content(k, 20000) for k in keys]
    assert batch_put_bytes(client, keys, values) == [0] * len(keys)
    for _ in range(3):
        assert batch_get_bytes(client, keys, [20000] * len(keys)) == ([20000] * len(keys), values)
    leases = stat(server.stats(), "shm_leases")
    assert leases >= 3
    seen = client.stats()["client"]["shm_leases_seen_held"]
    assert seen == (0 if staging == "0" else leases)


EXPIRY_KEYS, EXPIRY_SIZE = [f"slow-{i}" for i in range(4)], 32 << 20


def test_reader_of_an_expired_lease_reports_failure_not_bytes(server_factory, make_client,
                                                             tmp_path):
    """A reader stopped (SIGSTOP) for longer than its lease, with the lease's
    worker ticking meanwhile, loses the lease under its copy: those keys
    must fail when it goes on, every other read must be exact. The reader
    loops on large copies in its own process; a stop that falls between
    copies holds no lease, so the stops repeat until one lands in a copy."""
    server = server_factory(memory="512MiB", args=["--lease-timeout-ms", "1", "--workers", "1"])
    client = shm_client(make_client, server)
    assert batch_put_bytes(client, EXPIRY_KEYS,
                           [content(k, EXPIRY_SIZE) for k in EXPIRY_KEYS]) == [0] * 4
    ready = tmp_path / "ready"
    reader = subprocess.Popen([sys.executable, __file__, "read-until-expired",
                               f"{server.url}?transport=shm&namespace={client.namespace}",
                               str(ready)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    # Ticks need the worker awake: another client's traffic keeps it so.
    waker = make_client(server.url, transport="tcp", namespace=unique("waker"))
    stop = threading.Event()

    def wake_the_worker():
        while not stop.is_set():
            waker.batch_sizes(["nothing"])

    try:
        wait_for(ready.exists, 30, "the reader to start")
        with background(wake_the_worker, stop=stop):
            for _ in range(100):
                time.sleep(random.uniform(0.1, 0.2))    # the reader runs a few copies
                reader.send_signal(signal.SIGSTOP)
                time.sleep(0.3)     # past the lease's 1 ms + 32 ms (1 ms per MiB) and a tick
                reader.send_signal(signal.SIGCONT)
                if reader.poll() is not None:
                    break
        out = reader.communicate(timeout=60)[0].decode(errors="replace")
    finally:
        reader.kill()
    assert reader.returncode == 0, out
    assert "expired" in out, out
    assert stat(server.stats(), "shm_leases_expired") >= 1


def _read_until_expired(url, ready):
    """Reads EXPIRY_KEYS in a loop until a read fails; the failed keys must
    be E_TIMEOUT, the others of that batch (and of the first) exact."""
    size, count = EXPIRY_SIZE, len(EXPIRY_KEYS)
    expected = [np.frombuffer(content(k, size), np.uint8) for k in EXPIRY_KEYS]
    with gdrkv.Client(url, timeout_ms=30000) as client:
        dest = np.zeros(size * count, np.uint8)
        base, _ = client.register(dest)
        open(ready, "w").close()
        for first in itertools.chain([True], itertools.repeat(False)):
            dest.fill(0)
            results = client.batch_get(EXPIRY_KEYS, [base + i * size for i in range(count)],
                                       [size] * count)
            if not first and all(r == size for r in results):
                continue
            for i, (key, result) in enumerate(zip(EXPIRY_KEYS, results)):
                if result < 0:
                    assert result == errors.E_TIMEOUT, (key, errors.strerror(result))
                else:
                    assert result == size, key
                    assert np.array_equal(dest[i * size:(i + 1) * size], expected[i]), key
            if not first:
                break
        assert client.stats()["client"]["shm_leases_expired"] >= 1
        print("expired", sum(r < 0 for r in results))


# ---------------------------------------------------------------- servers come and go

@pytest.mark.memfd_pool("expects the restarted server to come back empty; over a pool file it "
                        "doesn't")
def test_server_restarted_under_a_client(server_factory, make_client):
    server = server_factory()
    client = shm_client(make_client, server, timeout_ms=1000, backoff_min_ms=50,
                        backoff_max_ms=200)
    client.put("before", b"b" * 4096)
    assert client.get("before") == b"b" * 4096
    server.kill()
    assert client.batch_sizes(["before"])[0] in (errors.E_UNAVAILABLE, errors.E_TIMEOUT)
    server.restart()
    # The new server has a new, empty pool: a miss, then the new pool serves.
    wait_for(lambda: client.batch_sizes(["before"]) == [errors.E_NOT_FOUND], 10,
             "the client to reconnect")
    client.put("after", b"a" * 4096)
    assert client.get("after") == b"a" * 4096
    assert client.stats()["client"]["shm_connects"] >= 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def running(pid):
    """Whether pid is alive (a zombie has exited: it only waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_local_url_starts_one_daemon_and_reuses_it(tmp_path, monkeypatch):
    monkeypatch.setenv("GDRKV_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("GDRKV_LOCAL_MEMORY", "64MiB")
    port = free_port()
    url = f"gdrkv://local:{port}?namespace=local"
    pid_path = tmp_path / f"{port}.pid"
    try:
        with gdrkv.Client(url) as first:
            first.put("shared", b"s" * 1000)
            daemon = int(pid_path.read_text())
            # Another process finds the same daemon rather than starting one.
            code = f"import gdrkv; print(gdrkv.Client({url!r}).get('shared') == b's' * 1000)"
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 timeout=60, check=False)
            assert out.stdout.strip() == "True", out.stderr
            assert int(pid_path.read_text()) == daemon
            assert first.stats()["client"]["shm_connects"] >= 1
        # The daemon outlives its clients.
        with gdrkv.Client(url) as again:
            assert again.get("shared") == b"s" * 1000
    finally:
        if pid_path.exists():
            daemon = int(pid_path.read_text())
            os.kill(daemon, signal.SIGTERM)
            wait_for(lambda: not running(daemon), 10, "the local daemon to stop")


# ---------------------------------------------------------------- concurrency

KEYS = [f"evict-{i}" for i in range(160)]     # about twice the pool


def size_of(key):
    return (64 << 10) * (1 + int(key.rsplit("-", 1)[1]) % 24)


def hammer(client, seed, ops=120):
    """Random batch puts and gets over KEYS, which hold several times the
    pool: every read is a miss or exact, while eviction runs throughout."""
    rng = random.Random(seed)
    for _ in range(ops):
        keys = rng.sample(KEYS, rng.randint(1, 12))
        if rng.random() < 0.4:
            results = batch_put_bytes(client, keys, [content(k, size_of(k)) for k in keys])
            # BUSY: another process is writing that key at this moment.
            assert all(r in (0, errors.E_NO_SPACE, errors.E_BUSY) for r in results), results
        else:
            results, values = batch_get_bytes(client, keys, [size_of(k) for k in keys])
            for key, result, value in zip(keys, results, values):
                check_read(key, size_of(key), result, value)


def test_processes_read_and_write_while_eviction_runs(server, make_client):
    ns = unique("evict")
    url = f"{server.url}?transport=shm&namespace={ns}"
    evictions_before = stat(server.stats(), "evictions")
    procs = [subprocess.Popen([sys.executable, __file__, "hammer", url, str(seed)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for seed in range(4)]
    outputs = [p.communicate(timeout=240)[0].decode(errors="replace") for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out
    assert stat(server.stats(), "evictions") > evictions_before, "nothing was evicted"
    wait_for(lambda: pinned(server) == 0, 5, "every lease to be released")


def _hold(path, ns, key, ready):
    """Takes a lease and never lets go, until killed."""
    with wire.connect_unix(path) as conn:
        lease(conn, [key], ns)
        open(ready, "w").close()
        signal.pause()


if __name__ == "__main__":
    if sys.argv[1] == "hold":
        _hold(*sys.argv[2:6])
    elif sys.argv[1] == "read-until-expired":
        _read_until_expired(*sys.argv[2:4])
    else:
        url, seed = sys.argv[2], int(sys.argv[3])
        with gdrkv.Client(url) as c:
            hammer(c, seed)
            assert c.stats()["client"]["shm_bytes_copied"] > 0, "the worker did not use shm"
