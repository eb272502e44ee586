"""Fail-soft against servers that misbehave: every call returns within its
timeout with per-key errors, never raises, never hangs, and a server known
to be down is skipped at once instead of costing the timeout again."""
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import gdrkv
from support import wire
from support.content import batch_get_bytes, batch_put_bytes, content
from support.servers import drain
from support.util import build_preload, python_child
from gdrkv import errors

TIMEOUT_MS = 500
MARGIN_S = 1.0
FAST_S = 0.3
KEYS = [f"k{i}" for i in range(16)]
OPTIONS = dict(timeout_ms=TIMEOUT_MS, connect_timeout_ms=300,
               backoff_min_ms=5000, backoff_max_ms=10000)


def silent(conn):
    drain(conn)


def half_header(conn):
    conn.read_header()
    conn.send(wire.response(wire.OP_GET)[:wire.HDR_SIZE // 2])
    drain(conn)


def garbage(conn):
    conn.read_frame()
    conn.send(bytes(range(0xC0, 0xC0 + wire.HDR_SIZE)))
    drain(conn)


def close_at_once(conn):
    conn.close()


def nothing_listening():
    with socket.create_server(("127.0.0.1", 0)) as s:
        return "gdrkv://127.0.0.1:%d" % s.getsockname()[1]


OPS = {
    "get": lambda c: batch_get_bytes(c, KEYS, [4096] * len(KEYS))[0],
    "put": lambda c: batch_put_bytes(c, KEYS, [b"v" * 4096] * len(KEYS)),
    "sizes": lambda c: c.batch_sizes(KEYS),
    "delete": lambda c: c.batch_delete(KEYS),
}
BEHAVIOURS = {
    "silent": (silent, errors.E_TIMEOUT),
    "half_header": (half_header, errors.E_TIMEOUT),
    "garbage": (garbage, errors.E_PROTOCOL),
    "close_at_once": (close_at_once, errors.E_UNAVAILABLE),
    "nothing_listening": (None, errors.E_UNAVAILABLE),
}


def timed(call, *args, **kwargs):
    started = time.monotonic()
    result = call(*args, **kwargs)
    return time.monotonic() - started, result


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("name", sorted(BEHAVIOURS))
def test_bad_server_gives_bounded_per_key_errors(name, op, fake_server, make_client):
    behaviour, expected = BEHAVIOURS[name]
    url = fake_server(behaviour).url if behaviour else nothing_listening()
    elapsed, client = timed(make_client, url, **OPTIONS)
    assert elapsed <= TIMEOUT_MS / 1000 + MARGIN_S, "creating the client took too long"

    elapsed, results = timed(OPS[op], client)
    assert results == [expected] * len(KEYS)
    assert elapsed <= TIMEOUT_MS / 1000 + MARGIN_S

    # Marked down now: every kind of call answers at once.
    for other in sorted(OPS):
        elapsed, results = timed(OPS[other], client)
        assert results == [errors.E_UNAVAILABLE] * len(KEYS), other
        assert elapsed < FAST_S, f"{other} paid for a server known to be down"
    elapsed, exists = timed(client.batch_exists, KEYS)
    assert exists == [False] * len(KEYS) and elapsed < FAST_S
    elapsed, alive = timed(client.ping)
    assert alive is False and elapsed < FAST_S


def test_buffers_untouched_after_a_timed_out_get(fake_server, make_client):
    """A server that starts a GET response and trickles it: once the call
    has returned, no later byte may land in the caller's buffer."""
    size = 64 << 10
    tries = []                          # when the server tried to send the next value bytes

    def trickle(conn):
        hdr, _, entries, _ = conn.read_request()
        payload = b"\x77" * (size * len(entries))
        frame = wire.response(wire.OP_GET, [(0, size)] * len(entries), payload, hdr.req_id)
        head = len(frame) - len(payload)
        conn.send(frame[:head])
        for off in range(head, len(frame), 1024):
            tries.append(time.monotonic())
            try:
                conn.send(frame[off:off + 1024])
            except OSError:             # the client closed the connection when it gave up
                return
            time.sleep(0.02)

    client = make_client(fake_server(trickle).url, conns=1, **OPTIONS)
    dest = np.full(size, 0x11, np.uint8)
    base, _ = client.register(dest)
    try:
        elapsed, results = timed(client.batch_get, ["slow"], [base], [size])
        returned = time.monotonic()
        assert results == [errors.E_TIMEOUT]
        assert elapsed <= TIMEOUT_MS / 1000 + MARGIN_S
        after_return = dest.copy()
        time.sleep(1.0)                 # the fake server keeps sending meanwhile
        assert (dest == after_return).all(), "the client wrote into a buffer after returning"
        # The test means something only if value bytes were on their way
        # both while the call waited and after it gave up (the first send
        # after the client closed may go out before or after the call is
        # back in Python; only the tries tell).
        assert any(when < returned for when in tries), "nothing was sent before the timeout"
        assert any(when > returned for when in tries), "the server stopped before the timeout"
    finally:
        client.unregister(base)


def test_dead_server_costs_only_its_own_keys(fake_server, make_client):
    with gdrkv.Server(memory="64MiB", pretouch=False) as real:
        url = f"gdrkv://{real.address},{fake_server(silent).address}"
        client = make_client(url, **OPTIONS)
        keys = [f"mixed-{i}" for i in range(100)]
        values = [content(k, 2000) for k in keys]

        elapsed, results = timed(batch_put_bytes, client, keys, values)
        assert elapsed <= TIMEOUT_MS / 1000 + MARGIN_S
        assert set(results) == {0, errors.E_TIMEOUT}, "keys should land on both servers"
        on_real = [r == 0 for r in results]

        elapsed, (results, got) = timed(batch_get_bytes, client, keys, [2000] * 100)
        assert elapsed < FAST_S
        for key, value, real_key, result, data in zip(keys, values, on_real, results, got):
            if real_key:
                assert result == 2000 and data == value, key
            else:
                assert result == errors.E_UNAVAILABLE, key
        client.close()


EXIT_WHILE_A_CALL_IS_IN_FLIGHT = textwrap.dedent("""
    import atexit, socket, threading, time
    atexit.register(time.sleep, 1.0)   # runs after the client's finalizer: keeps the thread alive
    import gdrkv

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held = []
    def accept_and_never_answer():
        while True:
            held.append(listener.accept()[0])
    threading.Thread(target=accept_and_never_answer, daemon=True).start()

    client = gdrkv.Client(f"gdrkv://127.0.0.1:{listener.getsockname()[1]}",
                          transport="tcp", timeout_ms=600)
    threading.Thread(target=client.batch_exists, args=(["k"],), daemon=True).start()
    time.sleep(0.2)
""")


def test_interpreter_exit_waits_for_calls_in_flight():
    """SGLang's storage threads are daemon threads: at interpreter exit one
    may still be inside a call when the client's finalizer runs, which must
    wait for it instead of freeing the C client under it (under the ASan
    pass of tests/run.sh a use-after-free aborts the process)."""
    done = subprocess.run([sys.executable, "-c", EXIT_WHILE_A_CALL_IS_IN_FLIGHT],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]


SLOW_NAME = """
client = gdrkv.Client("gdrkv://cache.unanswered.example:7480", timeout_ms=500,
                      connect_timeout_ms=300)
started = time.monotonic()
results = client.batch_sizes(["k"])
print(results[0], round(time.monotonic() - started, 2))
"""


def test_a_name_that_does_not_resolve_costs_only_the_timeout(tmp_path):
    """Name resolution is bounded by the call's deadline: with a DNS server
    that does not answer (tests/native/slow_dns.c makes every lookup of a
    name take 10 s), the call still returns in about its 500 ms."""
    env = {"LD_PRELOAD": build_preload("slow_dns", tmp_path), "SLOW_DNS_SECONDS": "10"}
    result, took = python_child(SLOW_NAME, env=env).split()
    assert int(result) in (errors.E_TIMEOUT, errors.E_UNAVAILABLE)
    assert float(took) < 3.0, f"the call took {took} s"
