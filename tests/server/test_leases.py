"""Pins protect objects while they are being sent, and reservations are
invisible until committed; both are released when a connection goes."""
import pytest

from support import wire
from support.content import batch_put_bytes, content
from support.util import stat, wait_for

pytestmark = pytest.mark.pool_file

SERVER_MEMORY = "32MiB"
NAMESPACE = "leases"
BIG = 8 << 20                   # more than the socket buffers can swallow at once
SLOW_CHUNK = 64 << 10


def flood(client, total=64 << 20, size=1 << 20, prefix="flood"):
    """Puts twice the pool, which evicts everything that is not pinned."""
    for first in range(0, total // size, 4):
        keys = [f"{prefix}-{i}" for i in range(first, first + 4)]
        results = batch_put_bytes(client, keys, [content(k, size) for k in keys])
        assert results == [0] * 4, f"flood puts failed: {results}"


def start_slow_get(server, key):
    """A raw GET whose response we read at our own pace, through a small
    receive window so the server must keep the object pinned while it waits."""
    conn = wire.connect(server.address, timeout=10, rcvbuf=SLOW_CHUNK)
    conn.send(wire.request(wire.OP_GET, [(key.encode(), BIG)], ns=NAMESPACE.encode()))
    hdr = conn.read_header()
    assert (hdr.status, hdr.count, hdr.payload_len) == (0, 1, BIG)
    assert wire.decode_results(conn.recv_exact(hdr.body_len)) == [(0, BIG)]
    return conn


def pinned(server):
    return stat(server.stats(), "pinned_objects")


def test_slow_reader_gets_original_bytes_despite_eviction(server, make_client):
    client = make_client(server.url, namespace=NAMESPACE)
    client.put("big", content("big", BIG))
    evictions_before = stat(server.stats(), "evictions")

    with start_slow_get(server, "big") as conn:
        received = conn.recv_exact(1 << 20, chunk=SLOW_CHUNK, pause=0.005)
        wait_for(lambda: pinned(server) >= 1, 5, "the object being sent to be pinned")
        flood(client)
        assert stat(server.stats(), "evictions") > evictions_before, "the flood evicted nothing"
        assert pinned(server) >= 1, "the pin went away while the response was unsent"
        received += conn.recv_exact(BIG - len(received), chunk=SLOW_CHUNK, pause=0.002)
        assert received == content("big", BIG)
        wait_for(lambda: pinned(server) == 0, 5, "the pin to drop after the response")


def test_reader_disconnecting_mid_response_drops_its_pin(server, make_client):
    client = make_client(server.url, namespace=NAMESPACE)
    client.put("big-abandoned", content("big-abandoned", BIG))
    with start_slow_get(server, "big-abandoned") as conn:
        conn.recv_exact(SLOW_CHUNK)
        wait_for(lambda: pinned(server) >= 1, 5, "the object being sent to be pinned")
    wait_for(lambda: pinned(server) == 0, 5, "the pin to drop after the reader left")
    flood(client, prefix="after-abandon")     # still makes room after the abandoned send


def test_put_cut_off_mid_payload_stays_invisible_and_is_released(server, make_client):
    client = make_client(server.url, namespace=NAMESPACE)
    size = 1 << 20
    frame = wire.request(wire.OP_PUT, [(b"half", size)], ns=NAMESPACE.encode(),
                         payload=content("half", size))
    with wire.connect(server.address) as conn:
        conn.send(frame[:len(frame) - size + (100 << 10)])
        wait_for(lambda: stat(server.stats(), "reserved_objects") >= 1, 5,
                 "the half-sent object to be reserved")
        assert client.batch_exists(["half"]) == [False]
        assert client.get("half") is None
    wait_for(lambda: stat(server.stats(), "reserved_objects") == 0, 5,
             "the reservation to be released after the writer left")
    assert client.batch_exists(["half"]) == [False]
    client.put("half", content("half-again", size))
    assert client.get("half") == content("half-again", size)
