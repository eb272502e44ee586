"""Writes over shm (#15): a local client copies PUT values into its
connection's staging memfd and the server copies them into the pool
(PUT_STAGED); on a single-tenant server the client copies straight into its
reservations (RESERVE, copy, COMMIT). These tests check that each path is
really taken and byte-exact, that in the default mode a client can write
nowhere but its own PUTs' objects, and that a writer that dies or gives up
leaves nothing visible and nothing held.

Run as a script (`test_writes.py URL NAMESPACE`) it is a writer that puts
big batches until it is killed; `test_writes.py URL NAMESPACE small` puts
small batches until its server sent some back (a followed copy that
stalled), then says how it went."""
import mmap
import os
import signal
import struct
import subprocess
import sys
import time

import pytest

import gdrkv
from support import wire
from support.content import batch_get_bytes, batch_put_bytes, check_read, content
from support.util import stat, unique, wait_for
from gdrkv import errors

pytestmark = pytest.mark.pool_file

SIZES = [1, 4096, 65536, (1 << 20) + 3, 3 << 20]


def shm_client(make_client, server, **options):
    return make_client(server.url, namespace=unique("w"), transport="shm", **options)


def put_and_check(client, sizes, count=16):
    every = [size for size in sizes for _ in range(count)]
    keys = [unique(f"v{size}") for size in every]
    values = [content(k, size) for k, size in zip(keys, every)]
    assert batch_put_bytes(client, keys, values) == [0] * len(keys)
    results, got = batch_get_bytes(client, keys, [len(v) for v in values])
    assert results == [len(v) for v in values]
    assert got == values
    return sum(len(v) for v in values)


def multi_segment_put(client, key, parts):
    """One object from several segments of one registered buffer."""
    buf = bytearray(b"".join(parts))
    ptr, _ = client.register(buf)
    ptrs, off = [], 0
    for part in parts:
        ptrs.append(ptr + off)
        off += len(part)
    try:
        return client.batch_put([key], [ptrs], [[len(p) for p in parts]])
    finally:
        client.unregister(buf)


# ---------------------------------------------------------------- the default mode

def test_shm_puts_go_through_staging_byte_exact(server_factory, make_client):
    server = server_factory(memory="512MiB")   # its 68 MiB GET stays under the peer pin cap (25%)
    client = shm_client(make_client, server)
    before = server.stats()
    moved = put_and_check(client, SIZES)
    parts = [os.urandom(n) for n in (10, 4096, 0, 70000)]
    assert multi_segment_put(client, "multi", parts) == [0]
    assert client.get("multi") == b"".join(parts)
    after = server.stats()
    # Every value went through staging: none crossed the socket.
    assert stat(after, "shm_staged_bytes") - stat(before, "shm_staged_bytes") == \
        moved + sum(map(len, parts))
    assert stat(after, "bytes_in") == stat(before, "bytes_in")
    assert client.stats()["client"]["shm_bytes_staged"] == moved + sum(map(len, parts))


# ---------------------------------------------------------------- following the copy

def test_frames_copied_alone_are_followed_byte_exact(server_factory, make_client):
    """A frame whose host values the calling thread copies alone goes before
    them, and the server copies behind the client's copy (PUT_STAGED_FOLLOW);
    a frame of 5 MiB, which the client shares with its helpers (or copies
    out of order), goes after them. Byte-exact either way."""
    server = server_factory(memory="256MiB")
    client = shm_client(make_client, server, conns=1)
    before = server.stats()
    moved = put_and_check(client, [4096], count=64)         # one frame of 256 KiB
    parts = [os.urandom(n) for n in (10, 4096, 0, 70000)]
    assert multi_segment_put(client, "multi", parts) == [0]
    assert client.get("multi") == b"".join(parts)
    middle = server.stats()
    assert stat(middle, "shm_staged_followed") - stat(before, "shm_staged_followed") == 2
    assert stat(middle, "shm_staged_bytes") - stat(before, "shm_staged_bytes") == \
        moved + sum(map(len, parts))
    put_and_check(client, [5 << 20], count=1)
    after = server.stats()
    assert stat(after, "shm_staged_puts") - stat(middle, "shm_staged_puts") == 1
    assert stat(after, "shm_staged_followed") == stat(middle, "shm_staged_followed")
    # A stall (this machine busy elsewhere) is sent back and comes again.
    assert stat(after, "shm_staged_follow_stalls") == \
        client.stats()["client"]["shm_staged_sent_again"]


def test_a_calls_last_frame_is_followed(server_factory, make_client):
    """A call's last frame is followed even while another followed frame
    is in flight (the server's copy of the last frame would be the call's
    tail). Two servers, a frame each, both below the size a client on any
    host shares with its helpers: the first frame's answer is not back
    when the second begins, so only the last-frame rule follows it."""
    servers = [server_factory(memory="256MiB") for _ in range(2)]
    client = make_client("gdrkv://" + ",".join(s.address for s in servers),
                         namespace=unique("w"), transport="shm")
    for _ in range(5):
        before = [s.stats() for s in servers]
        put_and_check(client, [4096], count=64)
        after = [s.stats() for s in servers]
        frames = sum(stat(a, "shm_staged_puts") - stat(b, "shm_staged_puts")
                     for a, b in zip(after, before))
        followed = sum(stat(a, "shm_staged_followed") - stat(b, "shm_staged_followed")
                       for a, b in zip(after, before))
        assert (frames, followed) == (2, 2)


def raw_staging(conn, size):
    """HELLO on a raw unix connection: its staging, mapped writable, and
    the staged word's place in it."""
    hdr, _, (pool_fd, staging_fd) = wire.hello_fds(conn)
    os.close(pool_fd)
    assert hdr.flags & wire.HELLO_STAGED_WORD
    view = mmap.mmap(staging_fd, size + wire.LEASE_WORD_BYTES, mmap.MAP_SHARED,
                     mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(staging_fd)
    return view, size + wire.STAGED_WORD_OFFSET


def publish(view, word_at, staged):
    struct.pack_into("<Q", view, word_at, staged)


def test_a_stalled_follow_is_sent_back_whole(server_factory, make_client):
    """Over the raw protocol: a followed PUT_STAGED whose staged word stops
    short of its last value is answered TIMEOUT with the follow flag, and
    none of it is stored, not even the values the word covered; sent again
    without the flag, it is stored as staged. A word raised past the values
    at once only lets the server copy what staging holds: the client's own
    objects."""
    server = server_factory(args=["--shm-staging", "1MiB"])
    reader = shm_client(make_client, server)
    ns = reader.namespace.encode()
    entries = [(b"a", b"A" * 5000), (b"b", b"B" * 300)]
    with wire.connect_unix(server.unix_path) as conn:
        view, word_at = raw_staging(conn, 1 << 20)
        try:
            publish(view, word_at, 0)
            view[0:5300] = b"A" * 5000 + b"B" * 300
            publish(view, word_at, 5000)                    # "b" never comes
            started = time.monotonic()
            hdr, body, _ = conn.call(wire.OP_PUT_STAGED, [(k, len(v)) for k, v in entries],
                                     ns=ns, flags=wire.PUT_STAGED_FOLLOW)
            waited = time.monotonic() - started
            assert hdr.status == errors.E_TIMEOUT and hdr.flags == wire.PUT_STAGED_FOLLOW, \
                (hdr, body)
            assert waited < 1.0, f"the server followed a stalled copy for {waited:.3f} s"
            assert reader.batch_exists(["a", "b"]) == [False, False]
            assert stat(server.stats(), "reserved_objects") == 0

            hdr, results, _ = conn.call(wire.OP_PUT_STAGED, [(k, len(v)) for k, v in entries],
                                        ns=ns)
            assert hdr.status == 0 and hdr.flags == 0 and results == [(0, 0), (0, 0)]
            assert reader.get("a") == b"A" * 5000 and reader.get("b") == b"B" * 300

            view[0:100] = b"C" * 100
            publish(view, word_at, (1 << 64) - 1)
            hdr, results, _ = conn.call(wire.OP_PUT_STAGED, [(b"c", 100)], ns=ns,
                                        flags=wire.PUT_STAGED_FOLLOW)
            assert hdr.status == 0 and results == [(0, 0)]
            assert reader.get("c") == b"C" * 100
        finally:
            view.close()
    stats = server.stats()
    assert stat(stats, "shm_staged_followed") == 2 and stat(stats, "shm_staged_follow_stalls") == 1


def test_the_server_copies_only_what_the_word_covers(server_factory, make_client):
    """A followed PUT_STAGED sent while staging still holds other bytes,
    its values written and the word raised only afterwards: what is stored
    is the values, never what staging held when the request came. (A
    server too busy to follow in time sends the frame back; tried again.)"""
    server = server_factory(args=["--shm-staging", "1MiB"])
    reader = shm_client(make_client, server)
    ns = reader.namespace.encode()
    with wire.connect_unix(server.unix_path) as conn:
        view, word_at = raw_staging(conn, 1 << 20)
        try:
            for attempt in range(10):
                key = f"late-{attempt}".encode()
                value = os.urandom(200 << 10)
                publish(view, word_at, 0)
                view[0:len(value)] = b"\xee" * len(value)
                conn.send(wire.request(wire.OP_PUT_STAGED, [(key, len(value))], ns=ns,
                                       flags=wire.PUT_STAGED_FOLLOW))
                time.sleep(0.0003)
                view[0:len(value)] = value
                publish(view, word_at, len(value))
                hdr, body, _ = conn.read_frame()
                if hdr.status == 0:
                    assert wire.decode_results(body) == [(0, 0)]
                    assert reader.get(key) == value
                    break
                assert hdr.status == errors.E_TIMEOUT and hdr.flags == wire.PUT_STAGED_FOLLOW
                assert reader.get(key) is None
            else:
                pytest.fail("every followed frame was sent back")
        finally:
            view.close()


def test_a_word_raised_a_byte_at_a_time_holds_the_server_briefly(server_factory, make_client):
    """A client that keeps raising the staged word, a byte at a time,
    holds its worker no longer than the frame's deadline (2 ms plus a copy
    at 1 GB/s: 2.5 ms here, where the word would take ~0.2 s to cover the
    value): the frame is sent back and nothing is stored."""
    size = 512 << 10
    server = server_factory(args=["--shm-staging", "1MiB", "--workers", "1"])
    reader = shm_client(make_client, server)
    ns = reader.namespace.encode()
    with wire.connect_unix(server.unix_path) as conn:
        view, word_at = raw_staging(conn, 1 << 20)
        publish(view, word_at, 0)
        creeper = os.fork()     # a process of its own: no GIL pauses in its creep
        if creeper == 0:
            try:
                end = time.monotonic() + 2
                staged = 0
                while staged < size and time.monotonic() < end:
                    staged += 1
                    publish(view, word_at, staged)
            finally:
                os._exit(0)
        try:
            started = time.monotonic()
            hdr, body, _ = conn.call(wire.OP_PUT_STAGED, [(b"creep", size)], ns=ns,
                                     flags=wire.PUT_STAGED_FOLLOW)
            waited = time.monotonic() - started
            assert hdr.status == errors.E_TIMEOUT and hdr.flags == wire.PUT_STAGED_FOLLOW, \
                (hdr, body)
            assert waited < 0.05, f"a creeping word held the worker {waited:.3f} s"
            assert reader.batch_exists(["creep"]) == [False]
        finally:
            os.waitpid(creeper, 0)
            view.close()


def test_a_followed_writer_that_dies_leaves_nothing(server_factory, make_client):
    """A client gone while the server follows its copy: the server stops
    as for a stall, drops the reservations, and nothing is visible."""
    server = server_factory(args=["--shm-staging", "1MiB"])
    reader = shm_client(make_client, server)
    ns = reader.namespace.encode()
    conn = wire.connect_unix(server.unix_path)
    with conn:
        view, word_at = raw_staging(conn, 1 << 20)
        publish(view, word_at, 0)
        view[0:64 << 10] = b"D" * (64 << 10)
        publish(view, word_at, 64 << 10)
        conn.send(wire.request(wire.OP_PUT_STAGED, [(b"d1", 64 << 10), (b"d2", 64 << 10)],
                               ns=ns, flags=wire.PUT_STAGED_FOLLOW))
        view.close()
    wait_for(lambda: stat(server.stats(), "shm_staged_follow_stalls") == 1, 5,
             "the server to stop following")
    wait_for(lambda: stat(server.stats(), "reserved_objects") == 0, 5,
             "the reservations to be dropped")
    assert reader.batch_exists(["d1", "d2"]) == [False, False]
    assert reader.get("d1") is None


def stalling_writer_main(url, ns):
    """Puts batches of 96 x 4 KiB (one frame its thread copies alone, so
    followed) until the server sent 2 frames back, or 20 s passed; prints
    the batches, how many came back, and the keys that failed."""
    client = gdrkv.Client(url, namespace=ns, transport="shm", conns=1, timeout_ms=30000)
    size, count, n, failed = 4096, 96, 0, 0
    buf = bytearray(size * count)
    ptr, _ = client.register(buf)
    deadline = time.monotonic() + 20
    while client.stats()["client"]["shm_staged_sent_again"] < 2 and time.monotonic() < deadline:
        keys = [f"stall-{n}-{i}" for i in range(count)]
        for i, key in enumerate(keys):
            buf[i * size:(i + 1) * size] = content(key, size)
        results = client.batch_put(keys, [ptr + i * size for i in range(count)], [size] * count)
        failed += sum(r != 0 for r in results)
        n += 1
    print(n, client.stats()["client"]["shm_staged_sent_again"], failed, flush=True)


def test_a_writer_held_up_mid_copy_sends_its_frames_again(server_factory, make_client):
    """The real client held up (SIGSTOP) while the server follows its copy:
    the server sends the frame back, the client sends it again once its copy
    is done, and every batch is stored byte-exact."""
    server = server_factory(memory="256MiB")
    ns = unique("stall")
    writer = subprocess.Popen([sys.executable, __file__, server.url, ns, "small"],
                              stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        while writer.poll() is None:
            writer.send_signal(signal.SIGSTOP)
            time.sleep(0.01)        # past the server's patience (FOLLOW_STALL_NS)
            writer.send_signal(signal.SIGCONT)
            time.sleep(0.003)
        out = writer.stdout.read().split()
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait(10)
        writer.stdout.close()
    assert writer.returncode == 0 and len(out) == 3, out
    batches, sent_again, failed = map(int, out)
    assert sent_again >= 1 and failed == 0, out
    assert stat(server.stats(), "shm_staged_follow_stalls") == sent_again
    reader = make_client(server.url, namespace=ns, transport="shm")
    keys = [f"stall-{n}-{i}" for n in range(batches) for i in range(96)]
    results, values = batch_get_bytes(reader, keys, [4096] * len(keys))
    assert all(check_read(k, 4096, r, v) for k, r, v in zip(keys, results, values))


def test_values_larger_than_staging_go_on_the_socket(server_factory, make_client):
    server = server_factory(memory="256MiB", args=["--shm-staging", "1MiB"])
    client = shm_client(make_client, server)
    small, big = put_and_check(client, [4096]), put_and_check(client, [3 << 20], count=4)
    stats = server.stats()
    assert stat(stats, "shm_staged_bytes") == small
    assert stat(stats, "bytes_in") == big


def test_frames_are_cut_to_a_staging_smaller_than_the_clients_frames(server_factory,
                                                                    make_client):
    """A server whose staging holds less than a client's PUT frame (1 MiB
    on a small host, 8 MiB on a big one): once a connection has told the
    client, its calls are cut to the staging, and their values go through
    it rather than on the socket."""
    server = server_factory(memory="256MiB", args=["--shm-staging", "256KiB"])
    client = shm_client(make_client, server, conns=1)
    first = put_and_check(client, [4096], count=1)      # the connection tells the staging size
    moved = put_and_check(client, [64 << 10], count=64)     # 4 MiB in one call
    stats = server.stats()
    assert stat(stats, "shm_staged_bytes") == first + moved
    assert stat(stats, "bytes_in") == 0


def test_no_staging_means_the_socket(server_factory, make_client):
    server = server_factory(memory="128MiB", args=["--shm-staging", "0"])
    client = shm_client(make_client, server)
    moved = put_and_check(client, [4096, 65536])
    stats = server.stats()
    assert stat(stats, "shm_staged_puts") == 0 and stat(stats, "bytes_in") == moved


def test_put_if_absent_over_staging_keeps_the_first_value(server_factory, make_client):
    server = server_factory()
    client = shm_client(make_client, server)
    assert batch_put_bytes(client, ["same", "other"], [b"first" * 100, b"o" * 10]) == [0, 0]
    assert batch_put_bytes(client, ["same", "new"], [b"later" * 100, b"n" * 20]) == [0, 0]
    assert client.get("same") == b"first" * 100
    assert client.get("new") == b"n" * 20


# ---------------------------------------------------------------- what a writer can touch

def test_staging_is_sealed_and_the_pool_stays_read_only(server_factory):
    server = server_factory(args=["--shm-staging", "4MiB"])
    with wire.connect_unix(server.unix_path) as conn:
        hdr, results, fds = wire.hello_fds(conn)
    pool_fd, staging_fd = fds
    try:
        assert hdr.status == 0 and hdr.flags == wire.HELLO_LEASE_WORD | wire.HELLO_STAGED_WORD
        # Room for 4 MiB of values, then the lease word's (docs/protocol.md).
        assert os.fstat(staging_fd).st_size == (4 << 20) + wire.LEASE_WORD_BYTES
        size = results[0][1]
        with pytest.raises(PermissionError):
            mmap.mmap(pool_fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        # The staging memfd is ours to write, but not to shrink or grow
        # (the server copies from it: a shrink would fault it).
        view = mmap.mmap(staging_fd, 4 << 20, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        view.close()
        for length in (0, 8 << 20):
            with pytest.raises(PermissionError):
                os.ftruncate(staging_fd, length)
    finally:
        os.close(pool_fd)
        os.close(staging_fd)


def staged_put(conn, view, ns, entries):
    """Writes the values into staging and sends PUT_STAGED: (header, results)."""
    off = 0
    for _, value in entries:
        view[off:off + len(value)] = value
        off += len(value)
    hdr, results, _ = conn.call(wire.OP_PUT_STAGED, [(k, len(v)) for k, v in entries],
                                ns=ns.encode())
    return hdr, results


def test_a_raw_writer_reaches_only_its_own_objects(server_factory, make_client):
    """Over the raw protocol, a client that owns its staging memfd: its
    PUT_STAGED stores what staging held at the call; changing staging
    afterwards changes nothing stored; values past the staging size are
    refused whole; the op is refused over tcp."""
    server = server_factory(args=["--shm-staging", "1MiB"])
    reader = shm_client(make_client, server)
    ns = reader.namespace
    with wire.connect_unix(server.unix_path) as conn:
        view, _ = raw_staging(conn, 1 << 20)
        try:
            hdr, results = staged_put(conn, view, ns, [(b"a", b"A" * 5000), (b"b", b"B" * 300)])
            assert hdr.status == 0 and results == [(0, 0), (0, 0)]
            view[0:6000] = b"X" * 6000          # after the answer: too late to matter
            assert reader.get("a") == b"A" * 5000 and reader.get("b") == b"B" * 300

            hdr, body, _ = conn.call(wire.OP_PUT_STAGED, [(b"big1", 600 << 10),
                                                          (b"big2", 600 << 10)], ns=ns.encode())
            assert hdr.status == errors.E_TOO_LARGE, (hdr, body)
            assert reader.batch_exists(["big1", "big2"]) == [False, False]
            hdr, _, _ = conn.call(wire.OP_PING)
            assert hdr.status == 0, "the connection did not survive the refusal"
        finally:
            view.close()
    assert stat(server.stats(), "reserved_objects") == 0
    with wire.connect(server.address) as conn:
        hdr, _, _ = conn.call(wire.OP_PUT_STAGED, [(b"tcp", 10)], ns=ns.encode())
        assert hdr.status == errors.E_UNSUPPORTED
    with wire.connect_unix(server.unix_path) as conn:     # no HELLO: no staging
        hdr, _, _ = conn.call(wire.OP_PUT_STAGED, [(b"nohello", 10)], ns=ns.encode())
        assert hdr.status == errors.E_INVALID
    assert reader.batch_exists(["tcp", "nohello"]) == [False, False]


def test_single_tenant_reserve_is_refused_to_a_default_server(server_factory):
    server = server_factory()
    with wire.connect_unix(server.unix_path) as conn:
        os.close(wire.hello(conn)[2])
        hdr, _, _ = conn.call(wire.OP_RESERVE, [(b"k", 100)])
        assert hdr.status == errors.E_UNSUPPORTED


# ---------------------------------------------------------------- writers that die

def writer_main(url, ns):
    """Puts 32 MiB batches of 1 MiB values, each value a function of its key,
    until killed."""
    client = gdrkv.Client(url, namespace=ns, transport="shm", timeout_ms=30000)
    size, count, n = 1 << 20, 32, 0
    buf = bytearray(size * count)
    ptr, _ = client.register(buf)
    while True:
        keys = [f"dead-{n}-{i}" for i in range(count)]
        for i, key in enumerate(keys):
            buf[i * size:(i + 1) * size] = content(key, size)
        client.batch_put(keys, [ptr + i * size for i in range(count)], [size] * count)
        n += 1
        print(n, flush=True)


@pytest.mark.parametrize("mode", ["staged", "single-tenant"])
def test_a_writer_killed_mid_batch_leaves_nothing_half_written(server_factory, make_client,
                                                                mode):
    args = ["--single-tenant"] if mode == "single-tenant" else []
    server = server_factory(memory="512MiB", args=args)
    ns = unique("dead")
    writer = subprocess.Popen([sys.executable, __file__, server.url, ns], stdout=subprocess.PIPE)
    try:
        for _ in range(3):          # a few batches in, so one is surely in flight
            assert writer.stdout.readline(), "the writer died on its own"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(10)
        writer.stdout.close()
    wait_for(lambda: stat(server.stats(), "reserved_objects") == 0, 5,
             "the dead writer's reservations to be dropped")
    reader = make_client(server.url, namespace=ns, transport="shm")
    keys = [f"dead-{n}-{i}" for n in range(8) for i in range(32)]
    results, values = batch_get_bytes(reader, keys, [1 << 20] * len(keys))
    found = sum(check_read(k, 1 << 20, r, v) for k, r, v in zip(keys, results, values))
    assert found >= 3 * 32, "acknowledged batches are missing"


# ---------------------------------------------------------------- single tenant

def test_single_tenant_writes_straight_into_the_pool(server_factory, make_client):
    server = server_factory(memory="512MiB", args=["--single-tenant"])  # under the pin cap
    with wire.connect_unix(server.unix_path) as conn:
        hdr, _, fds = wire.hello_fds(conn)
        for fd in fds:
            os.close(fd)
    assert hdr.flags == wire.HELLO_WRITABLE | wire.HELLO_LEASE_WORD | wire.HELLO_STAGED_WORD
    client = shm_client(make_client, server)
    moved = put_and_check(client, SIZES)
    parts = [os.urandom(n) for n in (10, 4096, 0, 70000)]
    assert multi_segment_put(client, "multi", parts) == [0]
    assert client.get("multi") == b"".join(parts)
    stats = server.stats()
    assert stat(stats, "shm_reserved_bytes") == moved + sum(map(len, parts))
    assert stat(stats, "shm_staged_puts") == 0 and stat(stats, "bytes_in") == 0


def staged_frame_bytes():
    """The values a PUT frame through staging carries (client.c): 1 MiB on a
    host of fewer than 8 CPUs, where the staged bytes stay in the CPU cache
    between the client's copy and the server's; 8 MiB on a bigger one,
    where helpers share both copies."""
    return (8 << 20) if os.cpu_count() >= 8 else (1 << 20)


@pytest.mark.parametrize("single_tenant", [False, True], ids=["staged", "single-tenant"])
def test_puts_are_cut_for_staging_only_through_staging(server_factory, make_client,
                                                       single_tenant):
    """Through staging PUT frames are cut to the client's frame size; into
    a single-tenant pool there is one copy, and a frame per connection: 24
    values of 512 KiB on one connection are 12 staged frames (2 on a host
    of 8 CPUs or more), or 1 RESERVE once the client has mapped the pool
    writable."""
    server = server_factory(memory="256MiB", args=["--single-tenant"] if single_tenant else [])
    client = shm_client(make_client, server, conns=1)
    assert client.batch_exists(["map-the-pool"]) == [False]
    op = "ops_reserve" if single_tenant else "ops_put_staged"
    before = stat(server.stats(), op)
    moved = put_and_check(client, [512 << 10], count=24)
    staged_frames = -(-moved // staged_frame_bytes())
    # A followed frame the server sent back (its copy into staging stalled:
    # docs/transports.md) goes again as a PUT_STAGED of its own.
    again = client.stats()["client"]["shm_staged_sent_again"]
    assert stat(server.stats(), op) - before - again == (1 if single_tenant else staged_frames)


def test_a_call_of_more_frames_than_planning_notes(server_factory, make_client):
    """Planning notes a call's first 64 frames while measuring it and
    replays them (client_call.c); a call of more frames is planned again.
    80 values of 1 MiB through 1 MiB of staging are 80 frames, each
    byte-exact (once a connection has told the client the staging size)."""
    # Its check reads the 80 MiB back in one call: over the default share
    # of pins one peer may hold (docs/protocol.md, "Pins per peer").
    server = server_factory(memory="256MiB",
                            args=["--shm-staging", "1MiB", "--peer-pin-share", "1"])
    client = shm_client(make_client, server, conns=1)
    assert client.batch_exists(["map-the-pool"]) == [False]
    before = stat(server.stats(), "ops_put_staged")
    put_and_check(client, [1 << 20], count=80)
    again = client.stats()["client"]["shm_staged_sent_again"]
    assert stat(server.stats(), "ops_put_staged") - before - again == 80


def test_single_tenant_reservation_dropped_with_its_connection(server_factory, make_client):
    server = server_factory(args=["--single-tenant"])
    reader = shm_client(make_client, server)
    with wire.connect_unix(server.unix_path) as conn:
        os.close(wire.hello(conn)[2])
        conn.send(wire.request(wire.OP_RESERVE, [(b"never", 5000)],
                               ns=reader.namespace.encode()))
        hdr, body, _ = conn.read_frame()
        (status, size, chunks), = wire.decode_lease(body, 1)
        assert (hdr.status, status, size) == (0, 0, 5000) and chunks
        assert stat(server.stats(), "reserved_objects") == 1
    wait_for(lambda: stat(server.stats(), "reserved_objects") == 0, 2,
             "the reservation to go with its connection")
    assert reader.batch_exists(["never"]) == [False]


if __name__ == "__main__":
    if sys.argv[3:] == ["small"]:
        stalling_writer_main(*sys.argv[1:3])
    else:
        writer_main(*sys.argv[1:])
