"""The rdma transport over softverbs, between real processes: what the
verbs techniques must show (chained WRs, selective signalling, SGEs per
multi-segment object), negotiation, the pool split at the largest MR, and
failures (an error completion, a server killed mid-batch, bad RDMA_HELLO
frames). The round-trip and concurrency suites also run over rdma."""
import time

import numpy as np
import pytest

import gdrkv
from support import wire
from support.content import batch_get_bytes, batch_put_bytes, check_read, content
from support.servers import drain
from support.softverbs import SOFTVERBS, counters, softverbs
from support.util import python_child, stat, unique
from gdrkv import errors

pytestmark = [pytest.mark.pool_file,
              pytest.mark.skipif(SOFTVERBS is None, reason="built without softverbs "
                                 "(no <infiniband/verbs.h>); run.sh requires it")]

IBV_WC_REM_ACCESS_ERR = 10


def rdma_client(make_client, server, **options):
    options.setdefault("namespace", unique("rdma"))
    return make_client(server.url, transport="rdma", **options)


def client_stat(client, name):
    return stat(client.stats()["client"], name)


def test_server_serves_rdma_by_default(server):
    """The 128 MiB pool is registered as 8 MRs, one per registering thread."""
    stats = server.stats()
    assert stat(stats, "rdma_enabled") == 1
    assert stat(stats, "rdma_pool_mrs") == 8


def test_get_chains_work_requests_and_signals_selectively(server, make_client):
    """1024 objects in one frame: a handful of doorbells and completions,
    not one of each per object."""
    n, size = 1024, 4096
    client = rdma_client(make_client, server, conns=1)
    keys = [f"chain-{i}" for i in range(n)]
    values = [content(k, size) for k in keys]
    assert batch_put_bytes(client, keys, values) == [0] * n

    before, wrs0 = counters(), client_stat(client, "rdma_work_requests")
    results, got = batch_get_bytes(client, keys, [size] * n)
    after = counters()
    for k, r, v in zip(keys, results, got):
        check_read(k, size, r, v, allowed_errors=())
    assert client_stat(client, "rdma_work_requests") - wrs0 == n
    doorbells = after.post_send_calls - before.post_send_calls
    completions = after.completions - before.completions
    assert after.wrs_posted - before.wrs_posted == n
    assert doorbells <= n // 32 + 4, f"{doorbells} post_send calls for {n} WRs"
    assert completions <= 16, f"{completions} completions for {n} WRs"
    assert after.error_completions == before.error_completions


def test_multi_segment_objects_are_one_work_request_each(server, make_client):
    """An object scattered over 4 segments is one READ with 4 SGEs."""
    n, seg = 64, 1024
    client = rdma_client(make_client, server, conns=1)
    keys = [f"sge-{i}" for i in range(n)]
    assert batch_put_bytes(client, keys, [content(k, 4 * seg) for k in keys]) == [0] * n
    dest = np.zeros(n * 4 * (seg + 16), np.uint8)       # 16-byte gaps between segments
    base, _ = client.register(dest)
    try:
        ptrs = [[base + (i * 4 + s) * (seg + 16) for s in range(4)] for i in range(n)]
        before = counters()
        results = client.batch_get(keys, ptrs, [[seg] * 4] * n)
        after = counters()
        assert results == [4 * seg] * n
        for i, k in enumerate(keys):
            got = b"".join(dest[p - base:p - base + seg].tobytes() for p in ptrs[i])
            assert got == content(k, 4 * seg)
            for p in ptrs[i]:
                assert not dest[p - base + seg:p - base + seg + 16].any(), "a gap was written"
        assert after.wrs_posted - before.wrs_posted == n
        assert after.sges - before.sges == 4 * n
    finally:
        client.unregister(base)


def test_unregistered_memory_goes_over_the_socket(server, make_client):
    client = rdma_client(make_client, server)
    key = unique("plain")
    assert client.put(key, content(key, 10000)) is None
    assert client.get(key) == content(key, 10000)     # bytes objects are not registered
    assert client_stat(client, "rdma_fallback_frames") >= 2


def test_read_depth_is_negotiated(server_factory, make_client, monkeypatch):
    """A server whose device allows 2 READs in flight per QP answers with
    2: the client never issues more (softverbs fails such READs)."""
    monkeypatch.setenv("SOFTVERBS_MAX_QP_RD_ATOM", "2")
    small = server_factory("64MiB")
    monkeypatch.delenv("SOFTVERBS_MAX_QP_RD_ATOM")
    client = rdma_client(make_client, small, conns=1)
    keys = [f"depth-{i}" for i in range(256)]
    assert batch_put_bytes(client, keys, [content(k, 8192) for k in keys]) == [0] * 256
    results, got = batch_get_bytes(client, keys, [8192] * 256)
    for k, r, v in zip(keys, results, got):
        check_read(k, 8192, r, v, allowed_errors=())


def test_pool_is_split_at_the_largest_mr(server_factory, make_client, monkeypatch):
    monkeypatch.setenv("SOFTVERBS_MAX_MR_SIZE", str(4 << 20))
    split = server_factory("64MiB", args=["--peer-pin-share", "1"])    # reads 40 MiB at once
    monkeypatch.delenv("SOFTVERBS_MAX_MR_SIZE")
    assert stat(split.stats(), "rdma_pool_mrs") == 16
    client = rdma_client(make_client, split)
    keys = [f"mr-{i}" for i in range(40)]
    size = (1 << 20) + 4096                     # objects span slab pages
    assert batch_put_bytes(client, keys, [content(k, size) for k in keys]) == [0] * 40
    results, got = batch_get_bytes(client, keys, [size] * 40)
    for k, r, v in zip(keys, results, got):
        check_read(k, size, r, v, allowed_errors=())


def test_error_completion_fails_only_its_keys(server, make_client):
    """An injected remote-access error: the keys of that QP's unconfirmed
    WRs fail, the others arrive intact, and the next call reconnects."""
    n, size = 512, 4096
    client = rdma_client(make_client, server, conns=1)
    keys = [f"inject-{i}" for i in range(n)]
    assert batch_put_bytes(client, keys, [content(k, size) for k in keys]) == [0] * n
    softverbs().softverbs_inject_error(100, IBV_WC_REM_ACCESS_ERR)
    results, got = batch_get_bytes(client, keys, [size] * n)
    failed = [r for r in results if r < 0]
    # The WR that failed carries its error; the ones its QP flushed after it
    # are unavailable; the ones before it and on other QPs arrived.
    assert failed.count(errors.E_PROTOCOL) == 1
    assert set(failed) <= {errors.E_PROTOCOL, errors.E_UNAVAILABLE}
    assert len(failed) < n
    for k, r, v in zip(keys, results, got):
        check_read(k, size, r, v, allowed_errors=(errors.E_PROTOCOL, errors.E_UNAVAILABLE))
    results, got = batch_get_bytes(client, keys, [size] * n)
    for k, r, v in zip(keys, results, got):
        check_read(k, size, r, v, allowed_errors=())


def test_put_error_completion_commits_only_written_keys(server, make_client):
    n, size = 256, 4096
    client = rdma_client(make_client, server, conns=1)
    keys = [unique("wfail") for _ in range(n)]
    softverbs().softverbs_inject_error(10, IBV_WC_REM_ACCESS_ERR)
    results = batch_put_bytes(client, keys, [content(k, size) for k in keys])
    failed = {k for k, r in zip(keys, results) if r < 0}
    assert failed and len(failed) < n
    assert all(r in (0, errors.E_PROTOCOL, errors.E_UNAVAILABLE) for r in results)
    # What failed is not stored (its bytes may be partial); the rest is.
    sizes = client.batch_sizes(keys)
    for k, s in zip(keys, sizes):
        assert s == (errors.E_NOT_FOUND if k in failed else size), k


KILL_MID_BATCH = """
import signal, threading
from support.content import batch_get_bytes, check_read
from support.softverbs import counters

url, ns, pid, n, size = ARGS[0], ARGS[1], int(ARGS[2]), int(ARGS[3]), int(ARGS[4])
keys = [f"kill-{i}" for i in range(n)]
client = gdrkv.Client(url, transport="rdma", namespace=ns, timeout_ms=10000, conns=4)
outcome = {}
reader = threading.Thread(target=lambda: outcome.update(zip(
    ("results", "values"), batch_get_bytes(client, keys, [size] * n))))
before = counters().wrs_executed
reader.start()
deadline = time.monotonic() + 30
while counters().wrs_executed - before < n // 2 - n // 8 and time.monotonic() < deadline:
    time.sleep(0.001)
os.kill(pid, signal.SIGKILL)
reader.join(60)
assert not reader.is_alive(), "the batch did not end after the server died"
for k, r, v in zip(keys, outcome["results"], outcome["values"]):
    check_read(k, size, r, v, allowed_errors=(errors.E_UNAVAILABLE, errors.E_TIMEOUT,
                                              errors.E_PROTOCOL))
print(sum(r == size for r in outcome["results"]))
"""


@pytest.mark.memfd_pool("timed for objects of one chunk; over a pool file a 1 MiB value takes "
                        "two (its header comes first)")
def test_server_killed_mid_batch(server_factory, make_client):
    """The server dies in the middle of a batch striped over 4 connections:
    the frames whose RELEASE was answered before are byte-exact, the others
    fail (a lease not confirmed vouches for nothing), nothing hangs. The
    reader is a child whose softverbs runs each WR slowly
    (SOFTVERBS_EXEC_DELAY_US, read once per process) and which kills the
    server itself once its counters show the first stripes' READs done, so
    the later ones can't be confirmed. How many frames had their RELEASE
    answered by then depends on how the call's loop interleaves its
    connections' READs and RELEASEs (softverbs runs a QP's READs when its
    CQ is polled): none, or the first stripes'."""
    victim = server_factory("256MiB")
    n, size = 64, 1 << 20
    ns = unique("kill")
    keys = [f"kill-{i}" for i in range(n)]
    writer = rdma_client(make_client, victim, namespace=ns)
    assert batch_put_bytes(writer, keys, [content(k, size) for k in keys]) == [0] * n
    victim.must_exit_cleanly = False        # the child kills it
    out = python_child(KILL_MID_BATCH, victim.url, ns, victim.proc.pid, n, size,
                       env={"SOFTVERBS_EXEC_DELAY_US": "20000"})
    landed = int(out.split()[-1])
    assert landed < n, f"{landed} of {n} keys arrived: the kill was not mid-batch"
    victim.kill()                           # reaps it
    victim.restart()
    fresh = rdma_client(make_client, victim, backoff_max_ms=100)
    key = unique("after")
    assert batch_put_bytes(fresh, [key], [content(key, 4096)]) == [0]


def test_bad_rdma_hello_frames_are_refused(server):
    """Malformed endpoints get a clear error; the server stays up."""
    bad_bodies = [b"", b"\x00" * 39, b"\x07" + b"\x00" * 39, b"\xff" * 4096]
    for body in bad_bodies:
        with wire.connect(server.address) as conn:
            conn.send(wire.Header(opcode=wire.OP_RDMA_HELLO, body_len=len(body)).pack() + body)
            hdr, resp, _ = conn.read_frame()
            assert hdr.status == errors.E_PROTOCOL, body[:8]
            assert b"endpoint" in resp
    with wire.connect(server.address) as conn:
        # LEASE, RESERVE and COMMIT need QPs on the connection first.
        for op in (wire.OP_LEASE, wire.OP_RESERVE, wire.OP_COMMIT):
            hdr, _, _ = conn.call(op, [(b"k", 8)] if op != wire.OP_COMMIT else ())
            assert hdr.status == errors.E_UNSUPPORTED
    assert server.alive


def test_hca_filter_that_excludes_every_device(monkeypatch):
    monkeypatch.setenv("GDRKV_IB_HCA", "^softverbs")
    with pytest.raises(gdrkv.GdrkvError, match="GDRKV_IB_HCA"):
        gdrkv.Server(memory="16MiB", pretouch=False, unix_path="", rdma="on")
    monkeypatch.setenv("GDRKV_IB_HCA", "=softverbs0:1")
    with gdrkv.Server(memory="16MiB", pretouch=False, unix_path="", rdma="on") as s:
        assert s.stats()["rdma_enabled"] == 1


def test_rdma_report_names_the_device():
    from gdrkv._native import ffi, lib
    buf = ffi.new("char[]", 8192)
    assert lib.gdrkv_rdma_report(buf, 8192) > 0
    report = dict(line.split(" ", 1) for line in ffi.string(buf).decode().splitlines())
    assert report["rdma_available"] == "1"
    assert report["device"] == "softverbs0"
    assert report["device.softverbs0.port.1.state"] == "ACTIVE"
    assert int(report["device.softverbs0.max_qp_rd_atom"]) >= 1


def test_flush_read_follows_reads_that_need_it(server, make_client, monkeypatch):
    """GPU memory before Hopper needs one READ of the destination after the
    batch; GDRKV_IB_FLUSH=always applies it to host memory so the path runs
    here. One flush per GET frame, and the bytes are still right."""
    monkeypatch.setenv("GDRKV_IB_FLUSH", "always")
    client = rdma_client(make_client, server, conns=1)
    keys = [f"flush-{i}" for i in range(64)]
    assert batch_put_bytes(client, keys, [content(k, 4096) for k in keys]) == [0] * 64
    assert client_stat(client, "rdma_flush_reads") == 0      # WRITEs need none
    results, got = batch_get_bytes(client, keys, [4096] * 64)
    for k, r, v in zip(keys, results, got):
        check_read(k, 4096, r, v, allowed_errors=())
    assert client_stat(client, "rdma_flush_reads") == 1
    monkeypatch.delenv("GDRKV_IB_FLUSH")
    plain = rdma_client(make_client, server, conns=1, namespace=client.namespace)
    results, _ = batch_get_bytes(plain, keys, [4096] * 64)
    assert results == [4096] * 64
    assert client_stat(plain, "rdma_flush_reads") == 0


ROCE_CLIENT = r"""
from gdrkv._native import ffi, lib
c = gdrkv.Client(ARGS[0] + "?transport=rdma", namespace="roce", timeout_ms=10000)
src = np.frombuffer(os.urandom(64 * 8192), np.uint8).copy()
dst = np.zeros_like(src)
s, _ = c.register(src)
d, _ = c.register(dst)
keys = [f"r{i}" for i in range(64)]
assert c.batch_put(keys, [s + i * 8192 for i in range(64)], [8192] * 64) == [0] * 64
assert c.batch_get(keys, [d + i * 8192 for i in range(64)], [8192] * 64) == [8192] * 64
assert (src == dst).all()
assert c.stats()["client"]["rdma_read_frames"] > 0
buf = ffi.new("char[]", 8192)
lib.gdrkv_rdma_report(buf, 8192)
print(ffi.string(buf).decode())
"""


@pytest.mark.parametrize("v2_index", [None, 0])
def test_roce_addresses_by_gid(server_factory, tmp_path, monkeypatch, v2_index):
    """On Ethernet the QPs are addressed by GID: without sysfs types the
    IPv4-mapped GID (index 1 on softverbs) wins; with index 0 marked RoCE v2
    in sysfs, that one does. Client and server run as separate processes."""
    monkeypatch.setenv("SOFTVERBS_LINK_LAYER", "ethernet")
    if v2_index is not None:
        types = tmp_path / "sys/class/infiniband/softverbs0/ports/1/gid_attrs/types"
        types.mkdir(parents=True)
        (types / "0").write_text("RoCE v2\n")
        (types / "1").write_text("IB/RoCE v1\n")
        monkeypatch.setenv("GDRKV_SYSFS_ROOT", str(tmp_path))
    roce = server_factory("64MiB")
    out = python_child(ROCE_CLIENT, roce.url)
    report = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert report["device.softverbs0.port.1.link_layer"] == "Ethernet"
    assert report["device.softverbs0.port.1.gid_index"] == str(1 if v2_index is None else 0)


def test_silent_server_costs_only_its_own_keys(server, fake_server, make_client):
    """RDMA_HELLO is answered inside the call's poll loop: a server that
    accepts and never answers holds up only its own keys, within the
    timeout, while the other server's keys move by RDMA."""
    def silent(conn):
        drain(conn)

    silent_server = fake_server(silent)
    client = make_client(f"gdrkv://{server.address},{silent_server.address}", transport="rdma",
                         namespace=unique("silent"), timeout_ms=1500, backoff_min_ms=50)
    keys = [f"s-{i}" for i in range(64)]
    start = time.monotonic()
    results = batch_put_bytes(client, keys, [content(k, 4096) for k in keys])
    assert time.monotonic() - start < 1.5 + 1.0
    assert set(results) == {0, errors.E_TIMEOUT}, "keys should land on both servers"
    assert client_stat(client, "rdma_write_frames") >= 1


TIMED_OUT_READS = """
url, ns, n, size = ARGS[0], ARGS[1], int(ARGS[2]), int(ARGS[3])
keys = [f"late-{i}" for i in range(n)]
client = gdrkv.Client(url, transport="rdma", namespace=ns, timeout_ms=300, conns=1)
dest = np.full(n * size, 0x11, np.uint8)
base, _ = client.register(dest)
started = time.monotonic()
results = client.batch_get(keys, [base + i * size for i in range(n)], [size] * n)
took = time.monotonic() - started
assert set(results) <= {errors.E_TIMEOUT, errors.E_UNAVAILABLE}, results
at_return = dest.copy()
# More calls on the same client poll the CQs of whatever connections it
# kept: WRs left on a pooled QP would run now, into the old buffer.
other = np.zeros(size, np.uint8)
obase, _ = client.register(other)
for _ in range(3):
    client.batch_get(keys[:1], [obase], [size])
time.sleep(0.5)
assert (dest == at_return).all(), "bytes landed after the call returned"
print(round(took, 3), int((at_return != 0x11).sum()))
"""


@pytest.mark.memfd_pool("timed for objects of one chunk; over a pool file a 1 MiB value takes "
                        "two (its header comes first)")
def test_timed_out_reads_leave_no_late_dma(server_factory, make_client):
    """docs/transports.md: a call that times out with WRs outstanding
    destroys its QPs, so no READ lands after it returned. softverbs runs
    each WR slowly (SOFTVERBS_EXEC_DELAY_US) so the timeout comes with WRs
    still queued; the calls that follow would run any that were left."""
    server = server_factory("256MiB")
    n, size = 32, 1 << 20
    ns = unique("late")
    keys = [f"late-{i}" for i in range(n)]
    writer = rdma_client(make_client, server, namespace=ns)
    assert batch_put_bytes(writer, keys, [content(k, size) for k in keys]) == [0] * n
    out = python_child(TIMED_OUT_READS, server.url, ns, n, size,
                       env={"SOFTVERBS_EXEC_DELAY_US": "50000"})
    took, landed_before_return = out.split()[-2:]
    # Timed out: some WRs ran (50 ms each) but far from all 32 in 300 ms.
    assert float(took) < 0.3 + 2.0, took
    assert 0 < int(landed_before_return) < n * size, landed_before_return


LATE_WRITES = """
from support.softverbs import counters

url, ns, n, size = ARGS[0], ARGS[1], int(ARGS[2]), int(ARGS[3])
client = gdrkv.Client(url, transport="rdma", namespace=ns, timeout_ms=20000, conns=1)
src = np.full(n * size, 0x5a, np.uint8)
base, _ = client.register(src)
results = client.batch_put([f"late-{i}" for i in range(n)],
                           [base + i * size for i in range(n)], [size] * n)
c = counters()
print(" ".join(map(str, results)), "|", c.wrs_executed, c.error_completions)
"""


def test_expired_reservation_refuses_late_writes(server_factory, make_client):
    """docs/protocol.md: when a reservation expires before its COMMIT, the
    server moves the connection's QPs to the error state before it gives
    the room back, so the client's WRITEs that were still to run are
    refused by the NIC instead of landing in room another object may get.
    The writer's softverbs runs each WR in 50 ms; the reservation lasts
    100 ms (+8 ms for 8 MiB): the first WRITEs land, the later ones fail."""
    server = server_factory("256MiB", args=["--lease-timeout-ms", "100"])
    n, size = 8, 1 << 20
    ns = unique("latew")
    out = python_child(LATE_WRITES, server.url, ns, n, size,
                       env={"SOFTVERBS_EXEC_DELAY_US": "50000"})
    results, counts = out.strip().splitlines()[-1].split("|")
    results = [int(r) for r in results.split()]
    executed, error_completions = map(int, counts.split())
    # The keys written in time fail at COMMIT (their reservation expired),
    # the later ones at their WRITE: the responder's QPs were in error.
    written = results.count(errors.E_TIMEOUT)
    assert 0 < written < n, results
    assert results == [errors.E_TIMEOUT] * written + [errors.E_UNAVAILABLE] * (n - written)
    assert error_completions >= 1 and executed >= written, (executed, error_completions)
    reader = rdma_client(make_client, server, namespace=ns)
    assert reader.batch_sizes([f"late-{i}" for i in range(n)]) == [errors.E_NOT_FOUND] * n
    stats = server.stats()
    assert stat(stats, "shm_leases_expired") == 1      # leases and reservations
    assert stat(stats, "reserved_objects") == 0
    # The room was given back: the same 8 MiB is free for the next writer.
    keys = [unique("after") for _ in range(n)]
    assert batch_put_bytes(reader, keys, [content(k, size) for k in keys]) == [0] * n
