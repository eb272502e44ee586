"""SIGTERM drains (#19): the server stops accepting, lets the frames in
flight finish (within --drain-timeout-ms), closes every connection, and
exits 0; a client between frames is let go at once."""
import pytest

import re
import signal
import socket
import time

import gdrkv
from support import wire
from support.content import batch_put_bytes, content
from support.util import background, unique, wait_for
from gdrkv import errors

pytestmark = pytest.mark.pool_file


def test_a_frame_in_flight_finishes(server_factory, make_client):
    """A PUT half sent when SIGTERM comes is read to its end and answered;
    only then does the server exit, 0."""
    server = server_factory("64MiB", args=["--drain-timeout-ms", "10000"])
    ns = unique("drain")
    value = content("k", 1 << 20)
    frame = wire.request(wire.OP_PUT, [(b"k", len(value))], ns=ns.encode(), payload=value)
    with wire.connect(server.address, timeout=20) as conn, \
            wire.connect(server.address, timeout=20) as idle:
        conn.send(frame[:len(frame) // 2])
        time.sleep(0.2)
        server.proc.send_signal(signal.SIGTERM)
        assert idle.wait_closed(5), "a connection between frames was kept"
        time.sleep(0.5)
        # Not accepting any more, but still reading the frame in flight.
        assert server.alive
        conn.send(frame[len(frame) // 2:])
        hdr, body, _ = conn.read_frame()
        assert hdr.status == 0 and wire.decode_results(body) == [(0, 0)]
        assert conn.wait_closed(5)
    assert server.proc.wait(10) == 0
    server.must_exit_cleanly = False


def test_new_connections_are_not_taken_while_draining(server_factory):
    server = server_factory("64MiB", args=["--drain-timeout-ms", "10000"])
    busy = wire.connect(server.address, timeout=20)
    busy.send(wire.request(wire.OP_PING)[:20])           # a frame that never ends
    time.sleep(0.2)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    host, port = server.address.rsplit(":", 1)
    late = socket.create_connection((host, int(port)), timeout=5)
    late.settimeout(1)
    late.sendall(wire.request(wire.OP_PING))
    try:
        assert late.recv(40) == b"", "a connection made while draining was served"
    except (TimeoutError, socket.timeout, ConnectionResetError):
        pass                                    # queued, never accepted
    late.close()
    busy.close()                                # ends the drain
    assert server.proc.wait(10) == 0
    server.must_exit_cleanly = False


def test_the_drain_is_bounded(server_factory):
    """A frame that never ends is given --drain-timeout-ms, then cut."""
    server = server_factory("64MiB", args=["--drain-timeout-ms", "500"])
    with wire.connect(server.address, timeout=20) as stuck:
        stuck.send(wire.request(wire.OP_PING)[:20])
        time.sleep(0.2)
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(10) == 0
        assert 0.4 < time.monotonic() - started < 5.0
        assert stuck.wait_closed(5)
    server.must_exit_cleanly = False


def test_clients_see_the_server_go_and_do_not_hang(server_factory, make_client):
    server = server_factory("64MiB")
    client = make_client(server.url, transport="tcp", namespace=unique("go"), timeout_ms=2000)
    client.put("k", b"v" * 100)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(10) == 0
    server.must_exit_cleanly = False
    started = time.monotonic()
    assert client.batch_sizes(["k"]) == [errors.E_UNAVAILABLE]
    assert time.monotonic() - started < 3.0


def test_sighup_says_what_it_can_reload(server_factory, make_client):
    """Nothing can change at run time yet: SIGHUP says so, and the server
    goes on serving."""
    server = server_factory("64MiB")
    server.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: b"SIGHUP: no setting can change" in open(server.log_path, "rb").read(), 10,
             "the answer to SIGHUP")
    client = make_client(server.url, transport="tcp", namespace=unique("hup"))
    client.put("k", b"v")
    assert client.get("k") == b"v"


def test_drain_under_load_loses_no_acknowledged_write(server_factory, monkeypatch):
    """Four writers put 16 x 64 KiB batches of new keys in a loop when
    SIGTERM comes: every call returns within its timeout, and the server,
    which logs how many puts it committed once drained, committed exactly
    the puts it acknowledged (no frame was cut after it was answered, none
    answered before it was committed)."""
    monkeypatch.setenv("GDRKV_LOG", "info")
    server = server_factory("512MiB", args=["--drain-timeout-ms", "10000"])
    acked, took = [], []

    def writer(w):
        client = gdrkv.Client(server.url, transport="tcp", namespace=f"load{w}",
                              timeout_ms=3000, backoff_min_ms=0)
        try:
            for i in range(100000):
                keys = [f"{w}-{i}-{j}" for j in range(16)]
                started = time.monotonic()
                results = batch_put_bytes(client, keys, [b"x" * 65536] * 16)
                took.append(time.monotonic() - started)
                acked.extend(k for k, r in zip(keys, results) if r == 0)
                if any(r != 0 for r in results):
                    return
        finally:
            client.close()

    with background(*(lambda w=w: writer(w) for w in range(4)), timeout=60):
        time.sleep(0.5)
        server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(20) == 0
    server.must_exit_cleanly = False
    log = open(server.log_path).read()
    committed = int(re.search(r"drained: (\d+) puts committed", log).group(1))
    assert len(acked) > 0 and committed == len(acked), (committed, len(acked))
    assert max(took) < 3.0 + 2.0, max(took)
