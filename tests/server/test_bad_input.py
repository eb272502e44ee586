"""Malformed, truncated and hostile input over raw sockets: the server
answers with an error frame or closes that one connection, and keeps
serving everyone else."""
import socket
import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support import wire
from support.content import content
from support.util import stat, unique, wait_for
from gdrkv import errors

pytestmark = pytest.mark.pool_file

SERVER_MEMORY = "64MiB"
STALL_TIMEOUT_MS = 1000
SERVER_ARGS = ["--stall-timeout-ms", str(STALL_TIMEOUT_MS)]
NS = b"bad-input"
CLOSED = "closed"


@pytest.fixture
def healthy(server, make_client):
    """Asserts after the test that the server process is alive and a normal
    client still round-trips an object."""
    yield
    assert server.alive, server.log_tail()
    client = make_client(server.url, namespace=unique("healthy"))
    value = content("after", 100_000)
    client.put("after", value)
    assert client.get("after") == value


def outcome(conn, timeout=3.0):
    """CLOSED, or the status of the error frame the server answered with."""
    conn.sock.settimeout(timeout)
    try:
        hdr = conn.read_header()
        message = conn.recv_exact(hdr.body_len)
    except (wire.PeerClosed, ConnectionResetError):
        return CLOSED
    assert hdr.magic == wire.MAGIC and hdr.opcode & wire.OP_RESPONSE
    assert hdr.status < 0 and hdr.count == 0, f"not an error frame: {hdr}"
    message.decode()                    # the message is UTF-8 text
    return hdr.status


def ping_works(conn):
    conn.send(wire.request(wire.OP_PING, req_id=77))
    hdr, body, payload = conn.read_frame()
    return (hdr.opcode, hdr.status, hdr.req_id, body, payload) == \
        (wire.OP_PING | wire.OP_RESPONSE, 0, 77, b"", b"")


def frames_bad(server):
    return stat(server.stats(), "frames_bad")


def keyed(opcode, body, count=1, payload=b""):
    return wire.Header(opcode=opcode, count=count, body_len=len(body),
                       payload_len=len(payload)).pack() + body + payload


def entry(key_len, size, key):
    return struct.pack("<IQ", key_len, size) + key


# Frames the server can skip whole: it must answer with an error frame and
# keep the connection usable.
RECOVERABLE = {
    "unknown_opcode": (wire.Header(opcode=42).pack(), errors.E_UNSUPPORTED),
    "unknown_opcode_with_body": (wire.Header(opcode=42, body_len=10).pack() + b"x" * 10,
                                 errors.E_UNSUPPORTED),
    "unknown_version": (wire.Header(version=2).pack(), errors.E_UNSUPPORTED),
}

# Frames the server can't follow: docs/protocol.md promises an error frame
# with a message (TOO_LARGE for a header or key over a limit, PROTOCOL for
# an inconsistent one), then the connection is closed, since its stream
# can't be trusted past them; a stream that isn't gdrkv's (bad magic) is
# closed without an answer.
REJECTED = {
    "bad_magic": (wire.Header(magic=0x12345678).pack(), CLOSED),
    "body_len_over_limit": (wire.Header(opcode=wire.OP_GET, count=1,
                                        body_len=wire.MAX_BODY + 1).pack(), errors.E_TOO_LARGE),
    "count_over_limit": (wire.Header(opcode=wire.OP_GET, count=wire.MAX_KEYS + 1,
                                     body_len=1 << 20).pack(), errors.E_TOO_LARGE),
    "payload_len_over_limit": (wire.Header(opcode=wire.OP_PUT, count=1, body_len=14,
                                           payload_len=wire.MAX_PAYLOAD + 1).pack(),
                               errors.E_TOO_LARGE),
    "payload_on_get": (keyed(wire.OP_GET, b"\0" + entry(1, 0, b"k"), payload=b"x"),
                       errors.E_PROTOCOL),
    "key_len_zero": (keyed(wire.OP_GET, b"\0" + entry(0, 0, b"") + b"k"), errors.E_PROTOCOL),
    "key_len_beyond_body": (keyed(wire.OP_GET, b"\0" + entry(100, 0, b"short")),
                            errors.E_PROTOCOL),
    "key_over_limit": (keyed(wire.OP_GET, b"\0" + entry(4097, 0, b"k" * 4097)),
                       errors.E_TOO_LARGE),
    "ns_beyond_body": (keyed(wire.OP_GET, b"\xff" + entry(1, 0, b"k")), errors.E_PROTOCOL),
    "fewer_entries_than_count": (keyed(wire.OP_GET, b"\0" + entry(1, 0, b"k") + b"\0" * 13,
                                       count=3), errors.E_PROTOCOL),
    "trailing_bytes_in_body": (keyed(wire.OP_GET, b"\0" + entry(1, 0, b"k") + b"junk"),
                               errors.E_PROTOCOL),
    "sizes_not_summing_to_payload": (keyed(wire.OP_PUT, b"\0" + entry(1, 10, b"a") +
                                           entry(1, 10, b"b"), count=2, payload=b"p" * 15),
                                     errors.E_PROTOCOL),
    "object_over_limit": (keyed(wire.OP_GET, b"\0" + entry(1, wire.MAX_OBJECT + 1, b"k")),
                          errors.E_TOO_LARGE),
    "ping_with_body": (wire.Header(opcode=wire.OP_PING, body_len=4).pack() + b"abcd",
                       errors.E_PROTOCOL),
}


@pytest.mark.parametrize("name", sorted(RECOVERABLE))
def test_unsupported_frame_gets_error_and_connection_stays_usable(name, server, healthy):
    frame, status = RECOVERABLE[name]
    bad_before = frames_bad(server)
    with wire.connect(server.address) as conn:
        conn.send(frame)
        assert outcome(conn) == status
        assert ping_works(conn)
    assert frames_bad(server) > bad_before


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_malformed_frame_gets_its_error_then_close(name, server, healthy):
    frame, expected = REJECTED[name]
    bad_before = frames_bad(server)
    with wire.connect(server.address) as conn:
        conn.send(frame)
        assert outcome(conn) == expected
        assert conn.wait_closed(3), "the connection stayed open after a frame it can't follow"
    assert frames_bad(server) == bad_before + 1


def connections_now(server):
    return stat(server.stats(), "connections_current")


@pytest.mark.parametrize("cut", [0, 1, wire.HDR_SIZE - 1, wire.HDR_SIZE + 5])
def test_truncated_frame_then_close(cut, server, healthy):
    """A client that goes away mid-frame costs nothing: its connection is
    released and no frame is counted as served or bad."""
    before = connections_now(server)
    stats_before = server.stats()
    frame = wire.request(wire.OP_GET, [(b"some-key", 100)], ns=NS)
    with wire.connect(server.address) as conn:
        conn.send(frame[:cut])
    wait_for(lambda: connections_now(server) <= before, 5, "the connection to be released")
    after = server.stats()
    assert stat(after, "ops_get") == stat(stats_before, "ops_get")
    assert stat(after, "pinned_objects") == 0


def test_put_cut_short_leaves_no_object(server, make_client, healthy):
    frame = wire.request(wire.OP_PUT, [(b"cut", 50_000)], ns=NS, payload=content("cut", 50_000))
    with wire.connect(server.address) as conn:
        conn.send(frame[:-1])
    client = make_client(server.url, namespace=NS.decode())
    wait_for(lambda: stat(server.stats(), "reserved_objects") == 0, 5,
             "the cut-off put to be released")
    assert client.batch_exists(["cut"]) == [False]


def test_stalled_frame_is_closed_and_others_are_served(server, make_client, healthy):
    client = make_client(server.url, namespace=unique("bystander"))
    with wire.connect(server.address) as conn:
        conn.send(wire.Header(opcode=wire.OP_GET, count=1, body_len=50).pack())
        started = time.monotonic()
        value = content("bystander", 1 << 20)
        client.put("bystander", value)
        assert client.get("bystander") == value
        assert conn.wait_closed(STALL_TIMEOUT_MS / 1000 + 5), "a stalled frame was never closed"
        assert time.monotonic() - started >= STALL_TIMEOUT_MS / 1000 * 0.8


def test_idle_connection_is_not_a_stall(server, healthy):
    with wire.connect(server.address) as conn:
        time.sleep(STALL_TIMEOUT_MS / 1000 * 2)
        assert ping_works(conn), "an idle connection between frames was dropped"


def test_connect_then_close(server, healthy):
    before = stat(server.stats(), "connections_total")
    current = connections_now(server)
    host, port = server.address.rsplit(":", 1)
    for _ in range(20):
        socket.create_connection((host, int(port))).close()
    # At most as many as before: a connection of an earlier test may end meanwhile.
    wait_for(lambda: connections_now(server) <= current, 5, "the connections to be released")
    # Each was accepted (and counted) once; the stats connection too.
    assert stat(server.stats(), "connections_total") >= before + 20


# ---------------------------------------------------------------- fuzz

def valid_frames():
    keys = st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=4)
    keyed_ops = st.sampled_from([wire.OP_EXISTS, wire.OP_GET, wire.OP_DELETE])
    return st.one_of(
        st.sampled_from([wire.OP_PING, wire.OP_STATS]).map(wire.request),
        st.builds(lambda op, ks: wire.request(op, [(k, 64) for k in ks], ns=NS), keyed_ops, keys),
        keys.map(lambda ks: wire.request(wire.OP_PUT, [(k, 8) for k in ks], ns=NS,
                                         payload=b"p" * 8 * len(ks))),
        st.just(wire.request(wire.OP_CLEAR, ns=NS)),
    )


INTERESTING = [0, 1, 2, 12, 13, 255, 4096, 4097, wire.MAX_KEYS, wire.MAX_KEYS + 1,
               wire.MAX_BODY, wire.MAX_BODY + 1, 2**31, 2**32 - 1]


@st.composite
def mutated_frames(draw):
    frame = bytearray(draw(valid_frames()))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "length", "append"]))
        if kind == "flip" and frame:
            i = draw(st.integers(0, len(frame) - 1))
            frame[i] ^= draw(st.integers(1, 255))
        elif kind == "truncate":
            del frame[draw(st.integers(0, len(frame))):]
        elif kind == "length" and len(frame) >= wire.HDR_SIZE:
            # count, body_len, payload_len, or a key_len in the body
            offset = draw(st.sampled_from([12, 16, 24, wire.HDR_SIZE + 1 + len(NS)]))
            if offset + 4 <= len(frame):
                frame[offset:offset + 4] = struct.pack("<I", draw(st.sampled_from(INTERESTING)))
        elif kind == "append":
            frame += draw(st.binary(max_size=64))
    return bytes(frame)


@settings(max_examples=1000)
@given(data=st.one_of(st.binary(max_size=256), mutated_frames()))
def test_fuzzed_frames_never_hurt_the_server(data, server):
    with wire.connect(server.address) as conn:
        try:
            conn.send(data)
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass                        # the server already hung up: fine
        assert conn.wait_closed(STALL_TIMEOUT_MS / 1000 + 5), \
            "the server kept a connection open after the client's EOF"
    assert server.alive, server.log_tail()


def test_every_bad_frame_is_counted(server, healthy):
    """frames_bad counts each refused frame once, whatever ran before."""
    before = frames_bad(server)
    for frame, _ in REJECTED.values():
        with wire.connect(server.address) as conn:
            conn.send(frame)
            assert conn.wait_closed(3)
    wait_for(lambda: frames_bad(server) == before + len(REJECTED), 5, "every frame counted")


def test_pipelined_frames_are_all_answered(server):
    """A client may send many frames back to back. The server runs a bounded
    number of steps per socket event; when the bound falls right after it
    read the last frame already sent, it must still answer that frame
    without waiting for more bytes (which never come: the client waits for
    the answer). Every split of EXISTS and PING frames is tried so the bound
    lands on every kind of step."""
    def frame(i):
        """Frame i of a pipeline: EXISTS or PING, request id i + 1."""
        if i % 3:
            return wire.OP_EXISTS, wire.request(wire.OP_EXISTS, [(b"pipelined", 0)], req_id=i + 1)
        return wire.OP_PING, wire.request(wire.OP_PING, req_id=i + 1)

    for n in range(1, 80):
        frames = [frame(i) for i in range(n)]
        with wire.connect(server.address, timeout=3.0) as conn:
            conn.send(b"".join(f for _, f in frames))
            for i, (op, _) in enumerate(frames):
                hdr = conn.read_header()
                conn.recv_exact(hdr.body_len)
                # In order: the answer to frame i, and nothing else.
                assert (hdr.opcode, hdr.req_id, hdr.status) == \
                    (op | wire.OP_RESPONSE, i + 1, 0), (n, i)
