"""Rules of docs/protocol.md checked over raw sockets (tests/wire.py), one
test per rule: limits answered TOO_LARGE, how long a lease lives, how
RDMA_HELLO is refused, and every RESERVE/COMMIT rule. RESERVE needs a
connection with QPs: the server connects them to an endpoint that exists
only on paper (wire.rdma_endpoint), which is all the control rules need.

Status INTERNAL has no test: the server never sends it (an allocation
failure while answering closes the connection instead, server_ops_execute
< 0), and the client produces it only when malloc, poll or a GPU call
fails."""
import time

import pytest

from support import wire
from support.content import content
from support.softverbs import SOFTVERBS
from support.util import stat, unique, wait_for
from gdrkv import errors

needs_rdma = pytest.mark.skipif(SOFTVERBS is None, reason="built without softverbs "
                                "(no <infiniband/verbs.h>); run.sh requires it")

MiB = 1 << 20
ROCE_GID = bytes(10) + b"\xff\xff\x7f\x00\x00\x01"      # ::ffff:127.0.0.1


def put(server, make_client, keys, size, ns):
    client = make_client(server.url, namespace=ns, transport="tcp")
    for key in keys:
        client.put(key, content(key, size))
    return client


def lease_frame(keys, ns, capacity=1 << 30):
    return wire.request(wire.OP_LEASE, [(k, capacity) for k in keys], ns=ns.encode())


def assert_closed(conn):
    assert conn.wait_closed(10), "the server kept the connection open"


# ---------------------------------------------------------------- limits

@pytest.mark.parametrize("name, hdr", [
    ("count", wire.Header(opcode=wire.OP_GET, count=wire.MAX_KEYS + 1, body_len=1 << 20)),
    ("body_len", wire.Header(opcode=wire.OP_GET, count=1, body_len=wire.MAX_BODY + 1)),
    ("payload_len", wire.Header(opcode=wire.OP_PUT, count=1, body_len=14,
                                payload_len=wire.MAX_PAYLOAD + 1)),
])
def test_header_over_a_limit_is_too_large_with_a_message_then_closed(server_factory, name, hdr):
    server = server_factory()
    with wire.connect(server.address) as conn:
        conn.send(hdr.pack())
        answer, message, _ = conn.read_frame()
        assert (answer.opcode, answer.status, answer.count) == \
            (hdr.opcode | wire.OP_RESPONSE, errors.E_TOO_LARGE, 0)
        assert name in message.decode(), message
        assert_closed(conn)


def test_lease_over_the_body_limit_is_too_large_and_pins_nothing(server_factory, make_client):
    """8192 leases of one 72-chunk object need 8192 x (16 + 8 + 72 x 16)
    bytes of answer, more than the 8 MiB body limit."""
    # Leases of most of the pool: one peer may pin all of it here.
    server = server_factory(memory="160MiB", args=["--peer-pin-share", "1"])
    ns = unique("big")
    put(server, make_client, ["big"], 72 * MiB, ns)
    with wire.connect_unix(server.unix_path) as conn:
        conn.send(lease_frame([b"big"] * wire.MAX_KEYS, ns))
        hdr, message, _ = conn.read_frame()
        assert hdr.status == errors.E_TOO_LARGE and hdr.count == 0
        assert b"body limit" in message
        assert stat(server.stats(), "pinned_objects") == 0
        # Nothing is held: RELEASE finds no lease.
        hdr, _, _ = conn.call(wire.OP_RELEASE)
        assert hdr.status == errors.E_INVALID
    assert stat(server.stats(), "shm_leases") == 0


def test_lease_timeout_grows_one_ms_per_mib_leased(server_factory, make_client):
    """Two leases taken one after the other on a server whose lease timeout
    is 100 ms: a tiny one, and one of 1000 x 72 MiB (the same object leased
    1000 times), whose timeout is 72 s longer. The tiny one expires; the
    big one, taken first, still holds well after that."""
    server = server_factory(memory="160MiB", args=["--lease-timeout-ms", "100",
                                                   "--peer-pin-share", "1"])
    ns = unique("grow")
    put(server, make_client, ["big", "tiny"], 72 * MiB, ns)
    put(server, make_client, ["tiny"], 100, ns + "-tiny")
    with wire.connect_unix(server.unix_path) as big, \
            wire.connect_unix(server.unix_path) as tiny:
        big.send(lease_frame([b"big"] * 1000, ns))
        assert big.read_frame()[0].status == 0
        tiny.send(lease_frame([b"tiny"], ns + "-tiny"))
        assert tiny.read_frame()[0].status == 0
        wait_for(lambda: stat(server.stats(), "shm_leases_expired") >= 1, 10,
                 "the tiny lease to expire")
        time.sleep(1.0)         # ten expiry ticks past the tiny one's
        assert stat(server.stats(), "shm_leases_expired") == 1
        assert big.call(wire.OP_RELEASE)[0].status == 0, "the big lease was dropped"
        assert tiny.call(wire.OP_RELEASE)[0].status == errors.E_TIMEOUT


# ---------------------------------------------------------------- RDMA_HELLO

@needs_rdma
@pytest.mark.parametrize("link", ["ib", "ethernet"])
def test_rdma_hello_across_link_layers_is_refused(server_factory, monkeypatch, link):
    """An IB client to a RoCE server (and the reverse) gets a frame error
    with a message; the server counts it and the connection stays."""
    if link == "ethernet":
        monkeypatch.setenv("SOFTVERBS_LINK_LAYER", "ethernet")
    server = server_factory()
    monkeypatch.delenv("SOFTVERBS_LINK_LAYER", raising=False)
    refused = stat(server.stats(), "rdma_sessions_refused")
    with wire.connect(server.address) as conn:
        hdr, message = wire.rdma_hello(conn, wire.rdma_endpoint(eth=int(link == "ib")))
        assert hdr.status == errors.E_UNAVAILABLE and hdr.count == 0
        assert b"link layers differ" in message
        assert conn.call(wire.OP_PING)[0].status == 0
        # The same endpoint on the right link layer is accepted.
        hdr, body = wire.rdma_hello(conn, wire.rdma_endpoint(eth=int(link == "ethernet"),
                                                             gid=ROCE_GID))
        assert hdr.status == 0, body
    assert stat(server.stats(), "rdma_sessions_refused") == refused + 1


def test_server_without_rdma_answers_unsupported_and_stays_usable(server_factory,
                                                                   make_client):
    server = server_factory(args=["--rdma", "off"])
    assert stat(server.stats(), "rdma_enabled") == 0
    with wire.connect(server.address) as conn:
        hdr, message = wire.rdma_hello(conn, wire.rdma_endpoint())
        assert hdr.status == errors.E_UNSUPPORTED and b"no rdma" in message
        ns = unique("nordma")
        put(server, make_client, ["k"], 100, ns)
        hdr, results, payload = conn.call(wire.OP_GET, [(b"k", 100)], ns=ns.encode())
        assert (hdr.status, results, payload) == (0, [(0, 100)], content("k", 100))


# ---------------------------------------------------------------- RESERVE and COMMIT

def rdma_conn(server):
    """A raw tcp connection with (paper) QPs."""
    conn = wire.connect(server.address)
    hdr, _ = wire.rdma_hello(conn, wire.rdma_endpoint(qps=((1, 0), (2, 0))))
    assert hdr.status == 0
    return conn


def reserve(conn, keys, size, ns):
    """RESERVE: [(status, size, chunks)] per key."""
    conn.send(wire.request(wire.OP_RESERVE, [(k, size) for k in keys], ns=ns.encode()))
    hdr, body, _ = conn.read_frame()
    assert hdr.status == 0, body
    return wire.decode_lease(body, hdr.count)


def commit(conn, flags, count=None):
    body = bytes(flags)
    conn.send(wire.Header(opcode=wire.OP_COMMIT, count=len(body) if count is None else count,
                          body_len=len(body)).pack() + body)
    hdr, body, _ = conn.read_frame()
    return hdr, body


def reserved(server):
    return stat(server.stats(), "reserved_objects")


@needs_rdma
def test_reserve_then_commit_publishes_and_reports_stored_keys(server_factory, make_client):
    """The baseline the other rules depart from: status 0 with chunks
    covering the value, 1 for a key already stored, COMMIT publishes."""
    server = server_factory()
    ns = unique("commit")
    client = put(server, make_client, ["old"], 4096, ns)
    with rdma_conn(server) as conn:
        answer = reserve(conn, [b"new", b"old"], 4096, ns)
        assert answer[0][:2] == (0, 4096) and sum(n for _, n in answer[0][2]) == 4096
        assert answer[1] == (1, 4096, [])
        assert reserved(server) == 1
        hdr, body = commit(conn, [1, 1])
        assert hdr.status == 0 and wire.decode_results(body) == [(0, 0), (0, 0)]
        assert reserved(server) == 0
        assert conn.call(wire.OP_PING)[0].status == 0
    assert client.batch_sizes(["new", "old"]) == [4096, 4096]


@needs_rdma
def test_next_other_frame_drops_the_reservation_and_ends_rdma(server_factory, make_client):
    server = server_factory()
    ns = unique("drop")
    with rdma_conn(server) as conn:
        reserve(conn, [b"k"], 4096, ns)
        assert reserved(server) == 1
        assert conn.call(wire.OP_PING)[0].status == 0
        assert reserved(server) == 0
        # The QPs are dead: the room can go to another writer.
        other = make_client(server.url, namespace=ns, transport="tcp")
        other.put("k", content("k", 4096))
        assert other.get("k") == content("k", 4096)
        # ... and the connection is closed after that answer.
        assert_closed(conn)


@needs_rdma
def test_commit_after_expiry_is_timeout(server_factory, make_client):
    server = server_factory(args=["--lease-timeout-ms", "100"])
    ns = unique("expire")
    with rdma_conn(server) as conn:
        reserve(conn, [b"a", b"b"], 4096, ns)
        wait_for(lambda: reserved(server) == 0, 10, "the reservation to expire")
        assert stat(server.stats(), "shm_leases_expired") == 1
        hdr, _ = commit(conn, [1, 1])
        assert hdr.status == errors.E_TIMEOUT
        assert_closed(conn)
    client = make_client(server.url, namespace=ns, transport="tcp")
    assert client.batch_sizes(["a", "b"]) == [errors.E_NOT_FOUND] * 2


@needs_rdma
@pytest.mark.parametrize("count", [1, 3])
def test_commit_of_another_count_closes_the_connection(server_factory, make_client, count):
    server = server_factory()
    ns = unique("count")
    with rdma_conn(server) as conn:
        reserve(conn, [b"a", b"b"], 4096, ns)
        hdr, message = commit(conn, [1] * count)
        assert hdr.status == errors.E_PROTOCOL and b"reserved" in message
        assert_closed(conn)
    wait_for(lambda: reserved(server) == 0, 10, "the reservations to be dropped")
    client = make_client(server.url, namespace=ns, transport="tcp")
    assert client.batch_sizes(["a", "b"]) == [errors.E_NOT_FOUND] * 2


@needs_rdma
def test_commit_byte_zero_drops_that_key_and_closes(server_factory, make_client):
    server = server_factory()
    ns = unique("abort")
    with rdma_conn(server) as conn:
        reserve(conn, [b"kept", b"dropped"], 4096, ns)
        hdr, body = commit(conn, [1, 0])
        assert hdr.status == 0
        assert wire.decode_results(body) == [(0, 0), (errors.E_INVALID, 0)]
        assert_closed(conn)
    assert reserved(server) == 0
    client = make_client(server.url, namespace=ns, transport="tcp")
    assert client.batch_sizes(["kept", "dropped"]) == [4096, errors.E_NOT_FOUND]


# ---------------------------------------------------------------- holds

def pinned(server):
    return stat(server.stats(), "pinned_objects")


@needs_rdma
@pytest.mark.parametrize("count", [1, 64, 8192])
def test_commit_while_a_lease_is_held_lets_the_lease_go(server_factory, make_client, count):
    """A hold survives only into the frame that ends it: a COMMIT (of any
    count) after a LEASE is not the lease's RELEASE, so the lease's pins go
    first. It used to skip the release and reuse the arrays holding the
    pins: SIGSEGV at 64 keys, a pin held forever at 8192."""
    server = server_factory()
    ns = unique("commit-lease")
    put(server, make_client, ["k"], 4096, ns)
    with rdma_conn(server) as conn:
        conn.send(lease_frame([b"k"], ns))
        hdr, _, _ = conn.read_frame()
        assert hdr.status == 0 and pinned(server) == 1
        commit(conn, [1] * count)       # whatever the answer, or a close
        wait_for(lambda: pinned(server) == 0, 10, "the lease's pin to go")
    with wire.connect(server.address) as other:
        assert other.call(wire.OP_PING)[0].status == 0
    assert server.proc.poll() is None, "the server died"


@needs_rdma
@pytest.mark.parametrize("opcode", ["RESERVE", "GET", "LEASE", "PING"])
def test_any_other_frame_after_a_lease_lets_it_go(server_factory, make_client, opcode):
    server = server_factory()
    ns = unique("after-lease")
    put(server, make_client, ["k"], 4096, ns)
    frames = {"RESERVE": wire.request(wire.OP_RESERVE, [(b"n", 4096)], ns=ns.encode()),
              "GET": wire.request(wire.OP_GET, [(b"k", 4096)], ns=ns.encode()),
              "LEASE": lease_frame([b"k"], ns),
              "PING": wire.Header(opcode=wire.OP_PING).pack()}
    with rdma_conn(server) as conn:
        conn.send(lease_frame([b"k"], ns))
        assert conn.read_frame()[0].status == 0 and pinned(server) == 1
        conn.send(frames[opcode])
        assert conn.read_frame()[0].status == 0
        # A new LEASE holds its own pin; anything else holds none.
        assert pinned(server) == (1 if opcode == "LEASE" else 0)
    wait_for(lambda: pinned(server) == 0 and reserved(server) == 0, 10, "the holds to go")
