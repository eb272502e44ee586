"""What keeps one client from locking the others out or holding the
server's memory (#14 defects 3-5): connection slots per peer and apart for
local clients, the idle timeout, request deadlines that grow with size, a
global cap on buffered request bodies, the age limit of a tcp GET's pins,
and the cap on one GET frame's destination bytes. Each test reproduces the
defect's attack and fails on a server without the limit."""
import os
import socket
import struct
import threading
import time

import numpy as np
import pytest

import gdrkv

from support import wire
from support.content import batch_put_bytes, content
from support.util import background, stat, unique, wait_for
from gdrkv import errors

pytestmark = pytest.mark.pool_file

MiB = 1 << 20


def connect_from(server, source):
    """A raw tcp connection to server from the loopback address source
    (127.0.0.0/8 is all this host: each address is another peer)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.settimeout(5)
    host, port = server.address.rsplit(":", 1)
    sock.connect((host, int(port)))
    return wire.Conn(sock, timeout=5)


def answers_ping(conn):
    try:
        hdr, _, _ = conn.call(wire.OP_PING)
        return hdr.status == 0
    except (wire.PeerClosed, ConnectionResetError, TimeoutError, OSError):
        return False


# ---------------------------------------------------------------- slots

def test_one_peer_cannot_take_every_connection(server_factory):
    """The defect: idle sockets from one host used to take all of
    max_connections. Now that host gets max_connections_per_peer; another
    host and local clients still get in."""
    server = server_factory("32MiB", args=["--max-connections", "16",
                                           "--max-connections-per-peer", "8"])
    hog = [connect_from(server, "127.0.0.2") for _ in range(8)]
    assert all(answers_ping(c) for c in hog)
    refused = connect_from(server, "127.0.0.2")
    assert refused.wait_closed(5), "a 9th connection from the same peer was kept"
    stats = server.stats()
    assert stat(stats, "connections_rejected_peer") == 1
    with connect_from(server, "127.0.0.3") as other:
        assert answers_ping(other)
    for c in hog:
        c.close()
    # Its slots come back when its connections close.
    wait_for(lambda: answers_ping(connect_from(server, "127.0.0.2")), 10,
             "the peer's slots to come back")


def test_local_clients_have_slots_of_their_own(server_factory, make_client):
    """tcp connections at max_connections do not keep the local (shm)
    engines out: unix connections are counted apart."""
    server = server_factory("32MiB", args=["--max-connections", "8"])
    hog = [connect_from(server, f"127.0.1.{i}") for i in range(1, 9)]
    assert all(answers_ping(c) for c in hog)
    assert connect_from(server, "127.0.1.9").wait_closed(5)
    client = make_client(server.url, transport="shm", namespace=unique("local"))
    assert batch_put_bytes(client, ["k"], [b"x" * 4096]) == [0]
    assert client.get("k") == b"x" * 4096
    with wire.connect_unix(server.unix_path) as local:    # tcp is full: stats go this way
        hdr, body, _ = local.call(wire.OP_STATS)
    stats = wire.parse_stats(body)
    assert stat(stats, "connections_current") == 8
    assert stat(stats, "local_connections_current") >= 1
    for c in hog:
        c.close()


# ---------------------------------------------------------------- idle

def test_idle_connections_are_closed_and_clients_reconnect(server_factory, make_client):
    server = server_factory("32MiB", args=["--idle-timeout-ms", "300"])
    with wire.connect(server.address) as idle:
        assert answers_ping(idle)
        assert idle.wait_closed(5), "an idle connection stayed open"
    assert stat(server.stats(), "connections_idle_closed") >= 1
    client = make_client(server.url, transport="tcp", namespace=unique("idle"))
    client.put("k", content("k", 10_000))
    time.sleep(1.0)                         # its pooled connections are closed meanwhile
    assert client.get("k") == content("k", 10_000)
    mine = client.stats()["client"]
    assert mine["errors_unavailable"] == 0 and mine["connects"] >= 2


def token_file(tmp_path):
    token = tmp_path / "token"
    token.write_text("limits-test-token-0123456789\n")
    token.chmod(0o600)
    return str(token)


def test_strangers_get_auth_timeout_ms_to_authenticate(server_factory, tmp_path):
    server = server_factory("32MiB", args=["--auth-token-file", token_file(tmp_path),
                                           "--auth-timeout-ms", "300"])
    with wire.connect(server.address) as stranger:
        started = time.monotonic()
        assert stranger.wait_closed(10)
        assert time.monotonic() - started < 5
    assert stat(server.stats(), "auth_timeouts") >= 1


def flood_from(server, source, stop, opened, keep=40):
    """Dials server from source as fast as it can, unpaced, without the
    token, keeping its last `keep` connections open (each sends nothing)."""
    host, port = server.address.rsplit(":", 1)
    held = []
    while not stop.is_set():
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.settimeout(1)
        try:
            sock.bind((source, 0))
            sock.connect((host, int(port)))
        except OSError:
            sock.close()
            continue
        opened.append(1)
        held.append(sock)
        if len(held) > keep:
            held.pop(0).close()
    for sock in held:
        sock.close()


def test_a_token_holder_gets_in_while_strangers_flood(server_factory, tmp_path):
    """The defect (#39, 1): connections that never authenticate held slots
    of max_connections, so an attacker redialling from a few addresses kept
    every token holder out. Now strangers have a budget of their own, and
    its fullest address gives way to a newcomer from another: a client with
    the token gets in every time while 16 addresses flood unpaced."""
    token = token_file(tmp_path)
    server = server_factory("32MiB", args=["--auth-token-file", token,
                                           "--max-connections", "64",
                                           "--max-connections-per-peer", "8"])
    stop, opened = threading.Event(), []
    attackers = [lambda a=f"127.0.3.{i}": flood_from(server, a, stop, opened)
                 for i in range(1, 17)]
    attempts, served = 20, 0
    with background(*attackers, stop=stop):
        wait_for(lambda: len(opened) >= 16 * 40, 60, "the flood to fill its budget")
        for i in range(attempts):
            client = gdrkv.Client(server.url, token_file=token, transport="tcp",
                                  namespace=unique("holder"), timeout_ms=10000)
            try:
                key = f"k{i}"
                if batch_put_bytes(client, [key], [content(key, 4096)]) == [0]:
                    served += client.get(key) == content(key, 4096)
            finally:
                client.close()
    stats = server.stats()
    assert served == attempts, f"{served} of {attempts} attempts got through"
    assert stat(stats, "unauthenticated_evicted") + stat(stats, "unauthenticated_refused") > 0
    assert stat(stats, "auth_ok") >= attempts


# ---------------------------------------------------------------- slow requests

def test_a_trickled_request_is_closed_by_its_deadline(server_factory):
    """The defect: one byte per stall period kept a frame open for ever
    (each byte was progress). A request now has stall_timeout_ms plus 1 s
    per MiB, from its first byte, to arrive."""
    server = server_factory("32MiB", args=["--stall-timeout-ms", "1000"])
    frame = wire.request(wire.OP_PING)
    with wire.connect(server.address) as conn:
        started = time.monotonic()
        for i, byte in enumerate(frame):
            try:
                conn.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.4)                 # well inside the stall timeout each time
        else:
            pytest.fail("the whole 40-byte header trickled in without the server closing")
        assert time.monotonic() - started < 10
        assert i < len(frame)
    assert stat(server.stats(), "frames_too_slow") == 1


def test_buffered_request_bodies_are_capped(server_factory):
    """The defect: every connection could hold an 8 MiB body buffer, with
    no cap over all of them. With --max-buffered 16MiB two big bodies are
    buffered and the others wait unread until there is room; small frames
    still go through meanwhile, and every body is served in the end."""
    server = server_factory("32MiB", args=["--max-buffered", "16MiB"])
    big = wire.Header(opcode=wire.OP_GET, count=1, body_len=8 * MiB).pack()
    conns = [wire.connect(server.address, timeout=30) for _ in range(4)]
    for c in conns:
        c.send(big)
    wait_for(lambda: stat(server.stats(), "frames_waited_for_buffer") == 2, 10,
             "two frames to wait for buffer room")
    assert stat(server.stats(), "buffered_bytes") <= 16 * MiB + MiB
    with wire.connect(server.address) as small:
        assert answers_ping(small)
    # The bodies come (malformed: each connection is answered, then closed);
    # the waiting frames get room as the others end, never past the cap.
    statuses, peak = [], 0

    def feed(conn):
        conn.send(b"\0" * (8 * MiB))
        statuses.append(conn.read_frame()[0].status)

    with background(*(lambda c=c: feed(c) for c in conns), timeout=60):
        deadline = time.monotonic() + 60
        while len(statuses) < 4 and time.monotonic() < deadline:
            peak = max(peak, stat(server.stats(), "buffered_bytes"))
            time.sleep(0.01)
    assert statuses == [errors.E_PROTOCOL] * 4
    assert peak <= 16 * MiB + MiB, peak
    for c in conns:
        c.close()
    wait_for(lambda: stat(server.stats(), "buffered_bytes") < MiB, 10,
             "the buffers to be given back")


# ---------------------------------------------------------------- GET pins

def test_an_unread_get_loses_its_pins(server_factory, make_client):
    """The defect: a tcp GET whose reader never reads kept its objects
    pinned for the whole stall timeout (30 s), so writers got NO_SPACE.
    Its pins now last lease_timeout_ms + 10 ms per MiB, as a lease's do."""
    server = server_factory("64MiB", args=["--lease-timeout-ms", "300"])
    writer = make_client(server.url, transport="tcp", namespace="pins")
    assert batch_put_bytes(writer, ["big"], [content("big", 16 * MiB)]) == [0]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    host, port = server.address.rsplit(":", 1)
    sock.connect((host, int(port)))
    with wire.Conn(sock, timeout=5) as reader:
        reader.send(wire.request(wire.OP_GET, [(b"big", 16 * MiB)], ns=b"pins"))
        wait_for(lambda: stat(server.stats(), "pinned_objects") == 1, 5, "the GET to pin")
        started = time.monotonic()
        wait_for(lambda: stat(server.stats(), "pinned_objects") == 0, 10,
                 "the pins of the unread GET to be dropped")
        assert time.monotonic() - started < 5
    assert stat(server.stats(), "get_pins_expired") == 1


def test_one_get_frame_pins_at_most_1gib(server_factory, make_client):
    """A GET asking for more than 1 GiB of destination bytes in one frame
    is refused; the client cuts its frames to fit, so its calls still work."""
    server = server_factory("32MiB")
    with wire.connect(server.address) as conn:
        conn.send(wire.request(wire.OP_GET, [(b"a", 600 * MiB), (b"b", 600 * MiB)]))
        hdr, body, _ = conn.read_frame()
        assert hdr.status == errors.E_TOO_LARGE and b"GET of" in body
        assert conn.wait_closed(5)
    client = make_client(server.url, transport="tcp", namespace=unique("cap"))
    keys = [f"k{i}" for i in range(3)]
    assert batch_put_bytes(client, keys, [content(k, 4096) for k in keys]) == [0] * 3
    # 512 MiB of room declared per key (only the 4 KiB objects are written).
    dest = np.zeros(3 * 4096, np.uint8)
    base, _ = client.register(dest)
    before = client.stats()["client"]
    assert client.batch_get(keys, [base + i * 4096 for i in range(3)], [512 * MiB] * 3) == \
        [4096] * 3
    assert [dest[i * 4096:(i + 1) * 4096].tobytes() for i in range(3)] == \
        [content(k, 4096) for k in keys]
    assert client.stats()["client"]["bytes_received"] - before["bytes_received"] >= 3 * 4096


# ---------------------------------------------------------------- pins per peer

PIN_POOL = "128MiB"
PIN_SHARE = 0.25                # the default of --peer-pin-share
PIN_OBJECTS = 140               # 1 MiB each: more than the pool holds


def fill_for_readers(server, make_client, ns):
    """A writer of ns that has filled the pool with 1 MiB objects; (writer,
    the keys the pool kept)."""
    writer = make_client(server.url, transport="tcp", namespace=ns)
    keys = [f"read-{i}" for i in range(PIN_OBJECTS)]
    for first in range(0, PIN_OBJECTS, 10):
        part = keys[first:first + 10]
        assert batch_put_bytes(writer, part, [content(k, MiB) for k in part]) == [0] * 10
    return writer, [k for k, kept in zip(keys, writer.batch_exists(keys)) if kept]


def pinned_keys(results):
    """How many keys of a GET or LEASE answer were pinned, and how many
    were refused BUSY (the pool may still have been evicting the oldest
    down to its low watermark: those are not found)."""
    statuses = [status for status, _ in results]
    assert set(statuses) <= {0, errors.E_BUSY, errors.E_NOT_FOUND}, statuses
    return statuses.count(0), statuses.count(errors.E_BUSY)


def write_40(writer, prefix):
    """40 PUTs of 1 MiB in two calls, as an engine's offload batches them:
    each call needs 20 MiB of room, more than the pool keeps free below
    its low watermark, so it must evict."""
    keys = [f"{prefix}-{i}" for i in range(40)]
    return [r for first in (0, 20)
            for r in batch_put_bytes(writer, keys[first:first + 20],
                                     [content(k, MiB) for k in keys[first:first + 20]])]


def test_one_unread_get_cannot_keep_writers_out(server_factory, make_client):
    """The defect (#39, finding 7): one tcp GET of the whole pool, never
    read, pinned it all until lease_timeout_ms (5 s), and 40 of 40 PUTs
    failed NO_SPACE meanwhile. A peer's pins are now capped at
    peer_pin_share of the pool: the keys past it are answered BUSY, the
    rest is evictable and every PUT succeeds."""
    server = server_factory(PIN_POOL)
    writer, keys = fill_for_readers(server, make_client, "pins")
    with wire.connect(server.address, timeout=10, rcvbuf=4096) as reader:
        reader.send(wire.request(wire.OP_GET, [(k.encode(), MiB) for k in keys], ns=b"pins"))
        wait_for(lambda: stat(server.stats(), "pinned_objects") > 0, 5, "the GET to pin")
        assert write_40(writer, "during") == [0] * 40
        assert stat(server.stats(), "pinned_objects") > 0, "the reader's pins were dropped"
        hdr = reader.read_header()
        served, refused = pinned_keys(wire.decode_results(reader.recv_exact(hdr.body_len)))
    cap = int(PIN_SHARE * stat(server.stats(), "pool_bytes"))
    assert 0 < served * MiB <= cap and refused > 0
    assert hdr.payload_len == served * MiB
    assert stat(server.stats(), "pin_cap_refused_keys") == refused


def test_one_peer_shares_its_cap_over_its_connections(server_factory, make_client):
    """Two connections of one address hold one cap between them: the
    second's GET gets what the first left, and BUSY for the rest; another
    address has a cap of its own. Once the pins go, the peer reads again."""
    server = server_factory(PIN_POOL)
    _, keys = fill_for_readers(server, make_client, "share")
    cap_keys = int(PIN_SHARE * stat(server.stats(), "pool_bytes")) // MiB
    newest = keys[-(cap_keys + 8):]         # the least recently used go first
    first, second = newest[:cap_keys - 8], newest[cap_keys - 8:]
    peer = [connect_from(server, "127.0.0.1") for _ in range(2)]
    other = connect_from(server, "127.0.0.2")
    try:
        for conn in (*peer, other):
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        answers = []
        for conn, part in ((peer[0], first), (peer[1], second), (other, second)):
            conn.send(wire.request(wire.OP_GET, [(k.encode(), MiB) for k in part], ns=b"share"))
            hdr = conn.read_header()
            answers.append(pinned_keys(wire.decode_results(conn.recv_exact(hdr.body_len))))
        assert answers == [(len(first), 0), (8, 8), (len(second), 0)]
    finally:
        for conn in (*peer, other):
            conn.close()
    wait_for(lambda: stat(server.stats(), "pinned_objects") == 0, 10, "the pins to go")
    reader = make_client(server.url, transport="tcp", namespace="share")
    dest = np.zeros(len(second) * MiB, np.uint8)
    base, _ = reader.register(dest)
    assert reader.batch_get(second, [base + i * MiB for i in range(len(second))],
                            [MiB] * len(second)) == [MiB] * len(second)


def test_an_unreleased_shm_lease_is_capped_too(server_factory, make_client):
    """A local client that LEASEs the pool and never RELEASEs: pinned up
    to its cap, the rest BUSY, and writers keep writing."""
    server = server_factory(PIN_POOL)
    writer, keys = fill_for_readers(server, make_client, "lease")
    with wire.connect_unix(server.unix_path, timeout=10) as conn:
        hdr, _, pool_fd = wire.hello(conn)
        assert hdr.status == 0 and pool_fd is not None
        os.close(pool_fd)
        conn.send(wire.request(wire.OP_LEASE, [(k.encode(), MiB) for k in keys], ns=b"lease",
                               req_id=2))
        hdr, body, _ = conn.read_frame()
        assert hdr.status == 0
        served, refused = pinned_keys([(status, size) for status, size, _ in
                                       wire.decode_lease(body, len(keys))])
        assert write_40(writer, "leased") == [0] * 40
        assert stat(server.stats(), "pinned_objects") == served, "the lease was dropped"
    cap = int(PIN_SHARE * stat(server.stats(), "pool_bytes"))
    assert 0 < served * MiB <= cap and refused > 0
