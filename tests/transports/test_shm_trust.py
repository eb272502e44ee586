"""docs/transports.md's shm promises that test_shm.py does not cover: the
trust boundary (peer uid, socket directory), the client's checks of a
hostile server's LEASE answers, `auto` falling back to tcp and trying shm
again, the old pool unmapped after a restart, helper threads for large
frames, and a LEASE without hits skipping RELEASE.

Run as a script (`test_shm_trust.py threads URL NS`) it is the child of
test_large_frames_start_copy_helpers (threads are counted per process)."""
import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading

import pytest

import gdrkv
from support import wire
from support.content import batch_get_bytes, content
from support.util import build_preload, counted, stat, unique, wait_for
from gdrkv import errors

NOBODY = 65534
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x10)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


@pytest.fixture
def open_dir():
    """A directory in /tmp that other users can traverse (pytest's tmp_path
    is 0700), removed afterwards."""
    path = tempfile.mkdtemp(prefix="gdrkv-trust-")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- trust boundary

PEER = r"""
import os, socket, sys, struct
os.setgid(%d); os.setuid(%d)
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
# The server may close a refused peer before its HELLO is even sent.
try:
    s.sendall(struct.pack("<IBBHiIIIQQ", 0x564B4447, 1, 8, 0, 0, 0, 0, 0, 0, 1))
    data, fds, _, _ = socket.recv_fds(s, 40, 1)
except (BrokenPipeError, ConnectionResetError):
    data, fds = b"", []
print(len(data), len(fds))
""" % (NOBODY, NOBODY)


@as_root
def test_unix_peer_of_another_user_is_refused_and_counted(server_factory, open_dir):
    """With the directory and socket opened up to everyone, SO_PEERCRED is
    what still keeps another user out."""
    sock_dir = os.path.join(open_dir, "sock")
    server = server_factory(args=["--unix-path", os.path.join(sock_dir, "s.sock")])
    os.chmod(sock_dir, 0o755)
    os.chmod(server.unix_path, 0o666)
    out = subprocess.run([sys.executable, "-c", PEER, server.unix_path], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "0"], "the other user got an answer (or the pool)"
    assert stat(server.stats(), "shm_connections_refused") == 1
    # The server's own user is still served.
    with wire.connect_unix(server.unix_path) as conn:
        hdr, _, fd = wire.hello(conn)
        assert hdr.status == 0 and fd is not None
        os.close(fd)
    assert stat(server.stats(), "shm_connections_refused") == 1


@pytest.mark.parametrize("how", ["writable_by_others", "writable_by_group",
                                 pytest.param("owned_by_another_user", marks=as_root)])
def test_socket_directory_open_to_others_is_refused(open_dir, how):
    sock_dir = os.path.join(open_dir, how)
    os.mkdir(sock_dir)
    if how == "writable_by_others":
        os.chmod(sock_dir, 0o757)
    elif how == "writable_by_group":
        os.chmod(sock_dir, 0o770)
    else:
        os.chmod(sock_dir, 0o700)
        os.chown(sock_dir, NOBODY, NOBODY)
    with pytest.raises(gdrkv.GdrkvError, match="must belong to uid"):
        gdrkv.Server(memory="16MiB", pretouch=False, rdma="off",
                     unix_path=os.path.join(sock_dir, "s.sock"))
    assert os.listdir(sock_dir) == []



# ---------------------------------------------------------------- impostors

IMPOSTOR = r"""
import os, socket, sys, threading
os.setgid(%d); os.setuid(%d)
path = sys.argv[1]
os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
listener = socket.socket(socket.AF_UNIX)
listener.bind(path)
os.chmod(path, 0o666)
listener.listen(16)
got = []

def serve():
    while True:
        conn, _ = listener.accept()
        conn.settimeout(5)
        try:
            while data := conn.recv(65536):
                got.append(len(data))
        except OSError:
            pass

threading.Thread(target=serve, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()                    # until the test is done
print(sum(got), flush=True)
""" % (NOBODY, NOBODY)


@as_root
def test_server_refuses_a_default_socket_directory_of_another_user(server_factory, open_dir,
                                                                   monkeypatch):
    """Another user made the default directory first: running without shm
    would leave local clients to whatever they put there, so the server
    does not start, and says why."""
    runtime = os.path.join(open_dir, "runtime")
    os.mkdir(runtime, 0o755)
    os.chown(runtime, NOBODY, NOBODY)
    monkeypatch.setenv("GDRKV_RUNTIME_DIR", runtime)
    with pytest.raises(RuntimeError, match="another user may be posing as the server"):
        server_factory("16MiB")


@as_root
@pytest.mark.parametrize("where", ["directory", "process"])
def test_client_does_not_talk_to_an_impostor(server_factory, make_client, open_dir, monkeypatch,
                                             where):
    """Another user listens where the client looks for its server's socket
    (the real server serves tcp only). "directory": in a directory of its
    own. "process": the directory and the socket file are made to look
    like ours, only the listening process (SO_PEERCRED) gives it away.
    Either way the client sends it nothing and goes over tcp."""
    os.chmod(open_dir, 0o1777)                      # a /tmp: anyone may make a directory
    runtime = os.path.join(open_dir, "runtime")
    monkeypatch.setenv("GDRKV_RUNTIME_DIR", runtime)
    server = server_factory("64MiB", args=["--unix-path", ""])
    theirs = os.path.join(open_dir, "theirs", f"{server.port}.sock")
    impostor = subprocess.Popen([sys.executable, "-c", IMPOSTOR,
                                 theirs if where == "process" else
                                 os.path.join(runtime, f"{server.port}.sock")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert impostor.stdout.readline().strip() == "ready"
        if where == "process":
            os.mkdir(runtime, 0o700)
            os.chown(theirs, 0, 0)
            os.rename(theirs, os.path.join(runtime, f"{server.port}.sock"))
        client = make_client(server.url, namespace=unique("imp"), timeout_ms=3000)
        client.put("k", content("k", 10_000))
        assert client.get("k") == content("k", 10_000)
        assert client.stats()["client"]["shm_connects"] == 0
        shm_only = make_client(server.url, namespace=unique("imp"), transport="shm",
                               timeout_ms=3000)
        assert shm_only.batch_sizes(["k"]) == [errors.E_UNAVAILABLE]
    finally:
        out, _ = impostor.communicate("", timeout=30)
    assert out.split() == ["0"], "the client sent the impostor bytes"


@pytest.mark.parametrize("seals", [0, fcntl.F_SEAL_GROW | F_SEAL_FUTURE_WRITE,
                                   fcntl.F_SEAL_SHRINK | F_SEAL_FUTURE_WRITE,
                                   fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW],
                         ids=["none", "can-shrink", "can-grow", "writable"])
def test_client_maps_only_a_sealed_pool(tmp_path, seals):
    """A pool fd that could shrink under the client (SIGBUS mid-copy), grow
    or be written is not mapped: the keys fail, nothing is leased."""
    server = HostileShmServer(str(tmp_path / "s.sock"), seals=seals)
    try:
        client = gdrkv.Client("gdrkv://unix:" + str(tmp_path / "s.sock"), transport="shm",
                              timeout_ms=3000)
        assert client.batch_sizes([GOOD]) == [errors.E_UNAVAILABLE]
        assert client.stats()["client"]["shm_connects"] == 0
        client.close()
    finally:
        server.close()
    assert wire.OP_HELLO in server.ops and wire.OP_LEASE not in server.ops


# ---------------------------------------------------------------- a hostile server

POOL = 1 << 20
SIZE = 4096


def chunks(*pairs, n=None):
    """One object's chunk list; n overrides the chunk count it claims."""
    return struct.pack("<II", len(pairs) if n is None else n, 0) + \
        b"".join(struct.pack("<QQ", off, length) for off, length in pairs)


# Each case: (the results, the chunk lists after them). The key asked for
# names the case; every key is read with capacity SIZE.
HOSTILE = {
    "offset_past_the_pool": ([(0, SIZE)], chunks((POOL, SIZE))),
    "chunk_past_the_pool": ([(0, SIZE)], chunks((POOL - 8, SIZE))),
    "huge_length": ([(0, SIZE)], chunks((0, (1 << 64) - 1))),
    "huge_offset_wrapping": ([(0, SIZE)], chunks(((1 << 64) - 8, 16), (0, SIZE - 16))),
    "lengths_over_the_object": ([(0, SIZE)], chunks((0, SIZE), (SIZE, SIZE))),
    "overlapping_chunks_over_the_object": ([(0, SIZE)], chunks((0, SIZE), (100, SIZE))),
    "lengths_under_the_object": ([(0, SIZE)], chunks((0, 100))),
    "more_chunks_claimed_than_sent": ([(0, SIZE)], chunks((0, SIZE), n=1000)),
    "chunk_count_of_2_to_32": ([(0, SIZE)], chunks((0, SIZE), n=1 << 32 - 1)),
    "no_list_for_a_hit": ([(0, SIZE)], b""),
    "truncated_list": ([(0, SIZE)], chunks((0, SIZE))[:-3]),
    "list_for_a_miss": ([(errors.E_NOT_FOUND, 0)], chunks((0, SIZE))),
    "trailing_bytes": ([(0, SIZE)], chunks((0, SIZE)) + b"junk"),
    "object_over_the_capacity": ([(0, 2 * SIZE)], chunks((0, 2 * SIZE))),   # not TOO_SMALL
    "object_in_the_pool_fine": ([(0, SIZE)], chunks((SIZE, SIZE // 2), (3 * SIZE, SIZE // 2))),
}
GOOD = "object_in_the_pool_fine"


def sealed_memfd(data, seals=None):
    """A memfd holding data, sealed as a real server's pool is (client_shm.c
    refuses to map one that is not)."""
    fd = os.memfd_create("fake-pool", os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if seals is None:
        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | F_SEAL_FUTURE_WRITE
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


class HostileShmServer:
    """Answers HELLO with a 1 MiB memfd of known bytes and each LEASE with
    the case its key names; counts what it was sent."""

    def __init__(self, path, seals=None):
        self.fd = sealed_memfd(os.urandom(POOL), seals)
        self.pool = os.pread(self.fd, POOL, 0)
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(path)
        self.listener.listen(16)
        self.ops = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(wire.Conn(sock, 30),), daemon=True).start()

    def _serve(self, conn):
        try:
            while True:
                hdr, _, entries, _ = conn.read_request()
                self.ops.append(hdr.opcode)
                if hdr.opcode == wire.OP_HELLO:
                    frame = wire.response(wire.OP_HELLO, [(0, POOL)], req_id=hdr.req_id)
                    socket.send_fds(conn.sock, [frame], [self.fd])
                elif hdr.opcode == wire.OP_LEASE:
                    results, lists = HOSTILE[entries[0][0].decode()]
                    body = wire.encode_results(results) + lists
                    conn.send(wire.Header(opcode=wire.OP_LEASE | wire.OP_RESPONSE,
                                          count=len(results), body_len=len(body),
                                          req_id=hdr.req_id).pack() + body)
                else:
                    conn.send(wire.response(hdr.opcode, req_id=hdr.req_id))
        except (OSError, wire.PeerClosed, ValueError):
            conn.close()

    def close(self):
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        os.close(self.fd)


HOSTILE_CLIENT = r"""
import json, sys
import numpy as np
import gdrkv
SIZE = %d
dest = np.zeros(3 * SIZE, np.uint8)      # the destination is the middle third
out = {}
for case in sys.argv[2:]:
    # A client per case: a protocol error puts the server in backoff.
    client = gdrkv.Client("gdrkv://unix:" + sys.argv[1], transport="shm", timeout_ms=5000)
    base, _ = client.register(dest)
    dest[:] = 0xAB
    result = client.batch_get([case], [base + SIZE], [SIZE])[0]
    touched = bool((dest[:SIZE] != 0xAB).any() or (dest[2 * SIZE:] != 0xAB).any())
    out[case] = [result, dest[SIZE:2 * SIZE].tobytes().hex(), touched]
    client.close()
print(json.dumps(out))
""" % SIZE


def test_client_refuses_hostile_lease_answers(tmp_path):
    """Chunks out of the pool, past the object or the capacity, lists of
    the wrong length: each key fails with an error and nothing is copied
    outside its destination; the client process never crashes. The last
    case, well formed, shows the fake server is read at all."""
    path = str(tmp_path / "hostile.sock")
    server = HostileShmServer(path)
    try:
        cases = sorted(set(HOSTILE) - {GOOD}) + [GOOD]
        out = subprocess.run([sys.executable, "-c", HOSTILE_CLIENT, path, *cases],
                             capture_output=True, text=True, timeout=120)
    finally:
        server.close()
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout)
    good, good_bytes, touched = results.pop(GOOD)
    assert good == SIZE and not touched
    assert bytes.fromhex(good_bytes) == \
        server.pool[SIZE:SIZE + SIZE // 2] + server.pool[3 * SIZE:3 * SIZE + SIZE // 2]
    for case, (result, _, touched) in results.items():
        assert result == errors.E_PROTOCOL, f"{case}: {result}"
        assert not touched, f"{case}: bytes written outside the destination"
    assert server.ops.count(wire.OP_LEASE) == len(cases)


# ---------------------------------------------------------------- seals

@pytest.fixture
def refuse_seals(tmp_path, monkeypatch):
    """Servers started from now on run with fcntl(F_ADD_SEALS) failing, as
    on a kernel without F_SEAL_FUTURE_WRITE (tests/native/refuse_seals.c)."""
    monkeypatch.setenv("LD_PRELOAD", build_preload("refuse_seals", tmp_path))


def test_unsealable_pool_serves_tcp_only(refuse_seals, server_factory, make_client):
    """docs/transports.md: when the kernel refuses the seals the server logs
    why and serves tcp only; an `auto` client gets its bytes over tcp."""
    server = server_factory()
    assert "cannot seal the memfd" in open(server.log_path).read()
    assert stat(server.stats(), "shm_enabled") == 0
    assert server.unix_path is None          # it announced no socket
    client = make_client(server.url, namespace=unique("noseal"))
    keys = [unique("k") for _ in range(16)]
    values = [content(k, 65536) for k in keys]
    assert [client.put(k, v) for k, v in zip(keys, values)] == [None] * 16
    assert [client.get(k) for k in keys] == values
    assert client.stats()["client"]["shm_connects"] == 0


def test_unsealable_pool_refuses_an_asked_unix_path(refuse_seals, server_factory, tmp_path):
    """Asked for a unix socket it can't serve, the server does not start."""
    with pytest.raises(RuntimeError, match="the pool can't be shared"):
        server_factory(args=["--unix-path", str(tmp_path / "s.sock")])


# ---------------------------------------------------------------- auto

def test_auto_falls_back_to_tcp_when_hello_fails_and_tries_shm_again(
        server_factory, make_client, tmp_path, monkeypatch):
    """The socket at the default path first leads to a listener that
    refuses HELLO: the call goes over tcp. Once it leads to the real
    server, the next new connection uses shm."""
    monkeypatch.setenv("GDRKV_RUNTIME_DIR", str(tmp_path))
    real_path = str(tmp_path / "real.sock")
    server = server_factory(args=["--unix-path", real_path])
    hellos = []

    def refuse_hello(conn):
        hdr, _, _, _ = conn.read_request()
        hellos.append(hdr.opcode)
        conn.send(wire.response(hdr.opcode, status=errors.E_UNSUPPORTED, req_id=hdr.req_id))
        conn.close()

    fake_path = str(tmp_path / "refuses.sock")
    fake = socket.socket(socket.AF_UNIX)
    fake.bind(fake_path)
    fake.listen(4)
    threading.Thread(target=lambda: refuse_hello(wire.Conn(fake.accept()[0], 10)),
                     daemon=True).start()
    default_path = str(tmp_path / f"{server.port}.sock")
    os.symlink(fake_path, default_path)
    try:
        client = make_client(server.url, namespace=unique("auto"), timeout_ms=2000,
                             backoff_min_ms=10, backoff_max_ms=100)
        client.put("k", content("k", 100_000))
        assert client.get("k") == content("k", 100_000)
        stats = client.stats()["client"]
        assert hellos == [wire.OP_HELLO]
        assert stats["shm_connects"] == 0 and stats["shm_bytes_copied"] == 0
        # The default path now leads to the server; its connections end
        # (restart), so the next call connects anew.
        os.unlink(default_path)
        os.symlink(real_path, default_path)
        server.kill()
        server.restart()
        wait_for(lambda: client.batch_sizes(["k"]) == [errors.E_NOT_FOUND], 20,
                 "the client to reconnect")
        client.put("k2", content("k2", 100_000))
        assert client.get("k2") == content("k2", 100_000)
        stats = client.stats()["client"]
        assert stats["shm_connects"] >= 1 and stats["shm_bytes_copied"] >= 100_000
    finally:
        fake.close()


# ---------------------------------------------------------------- the client side

def pool_mappings():
    """Inodes of the server pools mapped in this process."""
    with open("/proc/self/maps") as f:
        return {line.split()[4] for line in f if "memfd:gdrkv-pool" in line}


def test_old_pool_is_unmapped_after_a_server_restart(server_factory, make_client):
    server = server_factory()
    before = pool_mappings()
    client = make_client(server.url, namespace=unique("remap"), transport="shm",
                         timeout_ms=2000, backoff_min_ms=10, backoff_max_ms=100)
    client.put("k", b"x" * 4096)
    assert client.get("k") == b"x" * 4096
    first = pool_mappings() - before
    assert len(first) == 1, "one mapping per server"
    server.kill()
    server.restart()
    wait_for(lambda: client.batch_sizes(["k"]) == [errors.E_NOT_FOUND], 20,
             "the client to reconnect")
    client.put("k", b"y" * 4096)
    assert client.get("k") == b"y" * 4096
    second = pool_mappings() - before
    assert len(second) == 1 and second != first, "the old pool is still mapped"


def test_lease_without_hits_skips_release(server, make_client):
    client = make_client(server.url, namespace=unique("nohit"), transport="shm")
    client.put("hit", b"h" * 1000)
    before = server.stats()
    results, _ = batch_get_bytes(client, ["miss-1", "miss-2"], [1000, 1000])
    assert results == [errors.E_NOT_FOUND] * 2
    leases = counted(lambda: server.stats()["ops_lease"], before["ops_lease"] + 1)
    assert leases == before["ops_lease"] + 1
    assert server.stats()["ops_release"] == before["ops_release"]
    results, _ = batch_get_bytes(client, ["hit", "miss-1"], [1000, 1000])
    assert results == [1000, errors.E_NOT_FOUND]
    releases = counted(lambda: server.stats()["ops_release"], before["ops_release"] + 1)
    assert releases == before["ops_release"] + 1


def test_large_frames_start_copy_helpers(server, make_client):
    """Helper threads start with the first frame of 4 MiB or more (one per
    further CPU, at most 3), never for smaller frames; counted in a child
    process, whose threads are all the client's."""
    client = make_client(server.url, namespace=unique("helpers"))
    client.put("small", content("small", (4 << 20) - 4096))
    client.put("large", content("large", 4 << 20))
    out = subprocess.run([sys.executable, __file__, "threads", server.url, client.namespace],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    counts = json.loads(out.stdout)
    expected = min(max(os.sysconf("SC_NPROCESSORS_ONLN") - 1, 0), 3)
    assert counts["after_small"] == counts["start"], counts
    assert counts["after_large"] == counts["start"] + expected, counts
    assert counts["after_second_large"] == counts["after_large"], counts


def count_threads_child(url, ns):
    import numpy as np
    client = gdrkv.Client(url, namespace=ns, transport="shm")
    dest = np.zeros(4 << 20, np.uint8)
    base, _ = client.register(dest)

    def threads():
        return len(os.listdir("/proc/self/task"))

    counts = {"start": None}
    client.batch_exists(["small"])            # connects: any thread of that is counted
    counts["start"] = threads()
    assert client.batch_get(["small"], [base], [4 << 20]) == [(4 << 20) - 4096]
    counts["after_small"] = threads()
    for name in ("after_large", "after_second_large"):
        assert client.batch_get(["large"], [base], [4 << 20]) == [4 << 20]
        counts[name] = threads()
    assert client.stats()["client"]["shm_bytes_copied"] > 0
    print(json.dumps(counts))


if __name__ == "__main__" and sys.argv[1] == "threads":
    count_threads_child(sys.argv[2], sys.argv[3])
