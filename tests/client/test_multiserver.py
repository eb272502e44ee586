"""Several servers behind one client: rendezvous routing that every client
agrees on, a lost server costing only its own keys, and recovery without
recreating the client."""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from support.content import batch_get_bytes, batch_put_bytes, check_read, content
from support.servers import freeze
from support.util import background, stat, unique, wait_for
from gdrkv import errors

pytestmark = pytest.mark.pool_file

TIMEOUT_MS = 1000
MARGIN_S = 1.0                  # scheduling slack on a loaded 2-core machine
FAST_S = 0.5                    # a short-circuited call is well under the timeout
DOWN = (errors.E_UNAVAILABLE, errors.E_TIMEOUT)
KEYS = [f"key-{i}" for i in range(300)]
SIZES = [1000 + 37 * i for i in range(300)]   # distinct, so misplaced bytes show


def multi_url(servers):
    return "gdrkv://" + ",".join(s.address for s in servers)


def owners(make_client, servers, keys, namespace):
    """Index of the server holding each key, asked of each server alone."""
    holders = [make_client(s.url, namespace=namespace).batch_exists(keys) for s in servers]
    found = {}
    for key, where in zip(keys, zip(*holders)):
        assert sum(where) == 1, f"{key} is on servers {[i for i, w in enumerate(where) if w]}"
        found[key] = where.index(True)
    return found


@pytest.fixture
def three(server_factory):
    return [server_factory(memory="64MiB") for _ in range(3)]


def test_keys_spread_and_every_client_routes_alike(three, make_client, tmp_path):
    ns = unique("spread")
    client = make_client(multi_url(three), namespace=ns)
    assert batch_put_bytes(client, KEYS, [content(k, s) for k, s in zip(KEYS, SIZES)]) == [0] * 300

    placement = owners(make_client, three, KEYS, ns)
    for i, server in enumerate(three):
        held = sum(1 for owner in placement.values() if owner == i)
        assert held > 30, f"server {i} holds only {held} of 300 keys"
        assert stat(server.stats(), "objects") == held
        assert client.stats()["servers"][server.address]["objects"] == held

    # The same servers listed in another order route the same way.
    reordered = make_client(multi_url(three[::-1]), namespace=ns)
    results, values = batch_get_bytes(reordered, KEYS, SIZES)
    assert all(check_read(k, s, r, v, allowed_errors=()) for k, s, r, v in
               zip(KEYS, SIZES, results, values))

    # So does a client in another process.
    script = ("import sys, gdrkv\nfrom support.content import batch_put_bytes, content\n"
              "c = gdrkv.Client(sys.argv[1], namespace=sys.argv[2])\n"
              "keys = [f'proc-{i}' for i in range(100)]\n"
              "assert batch_put_bytes(c, keys, [content(k, 999) for k in keys])"
              " == [0] * 100\n"
              "c.close()\n")
    subprocess.run([sys.executable, "-c", script, multi_url(three), ns], check=True,
                   timeout=60, cwd=os.path.dirname(__file__))
    proc_keys = [f"proc-{i}" for i in range(100)]
    results, values = batch_get_bytes(client, proc_keys, [999] * 100)
    assert all(check_read(k, 999, r, v, allowed_errors=()) for k, r, v in
               zip(proc_keys, results, values))

    # Rendezvous hashing: dropping a server only moves the keys it held.
    two = make_client(multi_url(three[:2]), namespace=ns + "-two")
    assert batch_put_bytes(two, KEYS, [b"x"] * 300) == [0] * 300
    placement_two = owners(make_client, three[:2], KEYS, ns + "-two")
    moved = [k for k in KEYS if placement[k] != 2 and placement_two[k] != placement[k]]
    assert not moved, f"keys moved between servers that stayed: {moved[:5]}"


def test_killed_server_costs_only_its_keys_and_comes_back(three, make_client):
    ns = unique("kill")
    client = make_client(multi_url(three), namespace=ns, timeout_ms=TIMEOUT_MS,
                         connect_timeout_ms=500, backoff_min_ms=200, backoff_max_ms=1000)
    assert batch_put_bytes(client, KEYS, [content(k, s) for k, s in zip(KEYS, SIZES)]) == [0] * 300
    placement = owners(make_client, three, KEYS, ns)
    victim = three[1]
    dead_keys = [k for k in KEYS if placement[k] == 1]

    calls, failures, stop = [], [], threading.Event()

    def reader():
        while not stop.is_set():
            started = time.monotonic()
            results, values = batch_get_bytes(client, KEYS, SIZES)
            calls.append((time.monotonic() - started, results))
            for key, size, result, value in zip(KEYS, SIZES, results, values):
                allowed = DOWN if placement[key] == 1 else ()
                try:
                    check_read(key, size, result, value, allowed_errors=allowed)
                except AssertionError as e:
                    failures.append(str(e))

    with background(reader, timeout=30):
        try:
            time.sleep(0.3)
            victim.kill()
            time.sleep(1.5)
        finally:
            stop.set()
    assert not failures, failures[:5]
    assert max(d for d, _ in calls) <= TIMEOUT_MS / 1000 + MARGIN_S
    assert all(r < 0 for k, r in zip(KEYS, calls[-1][1]) if placement[k] == 1)

    started = time.monotonic()
    results, _ = batch_get_bytes(client, dead_keys, [SIZES[KEYS.index(k)] for k in dead_keys])
    assert time.monotonic() - started < FAST_S, "a server known to be down still costs time"
    assert all(r in DOWN for r in results)
    assert "error" in client.stats()["servers"][victim.address]

    victim.restart()
    dead_sizes = [SIZES[KEYS.index(k)] for k in dead_keys]
    dead_values = [content(k, s) for k, s in zip(dead_keys, dead_sizes)]
    wait_for(lambda: batch_put_bytes(client, dead_keys, dead_values) == [0] * len(dead_keys),
             10, "puts to the restarted server to succeed")
    results, values = batch_get_bytes(client, KEYS, SIZES)
    assert all(check_read(k, s, r, v, allowed_errors=()) for k, s, r, v in
               zip(KEYS, SIZES, results, values))


def test_stopped_server_times_out_then_short_circuits(three, make_client):
    ns = unique("stop")
    client = make_client(multi_url(three), namespace=ns, timeout_ms=TIMEOUT_MS,
                         connect_timeout_ms=500, backoff_min_ms=2000, backoff_max_ms=4000)
    assert batch_put_bytes(client, KEYS, [content(k, s) for k, s in zip(KEYS, SIZES)]) == [0] * 300
    placement = owners(make_client, three, KEYS, ns)
    frozen = three[2]

    def read_all(keys):
        sizes = [SIZES[KEYS.index(k)] for k in keys]
        started = time.monotonic()
        results, values = batch_get_bytes(client, keys, sizes)
        elapsed = time.monotonic() - started
        for key, size, result, value in zip(keys, sizes, results, values):
            allowed = DOWN if placement[key] == 2 else ()
            check_read(key, size, result, value, allowed_errors=allowed)
        return elapsed, [r for k, r in zip(keys, results) if placement[k] == 2]

    freeze(frozen.proc)
    try:
        elapsed, frozen_results = read_all(KEYS)
        assert TIMEOUT_MS / 1000 * 0.8 <= elapsed <= TIMEOUT_MS / 1000 + MARGIN_S
        assert all(r in DOWN for r in frozen_results)

        elapsed, frozen_results = read_all(KEYS)
        assert elapsed < FAST_S, "the health short-circuit did not engage"
        assert all(r == errors.E_UNAVAILABLE for r in frozen_results)
    finally:
        frozen.proc.send_signal(signal.SIGCONT)

    # The resumed server now answers the requests that timed out; the client
    # must not take those stale answers for new ones (other keys, other order).
    reversed_keys = KEYS[::-1]
    wait_for(lambda: all(r >= 0 for r in read_all(reversed_keys)[1]), 10,
             "the resumed server to serve again")


def blackhole():
    """A listening address that swallows SYNs: its accept queue is full and
    never drained, so a connect to it neither completes nor fails. Returns
    (address, what keeps it so)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    keep = [listener]
    for _ in range(16):                     # connect until one hangs
        s = socket.socket()
        s.settimeout(0.2)
        try:
            s.connect(address)
        except (TimeoutError, socket.timeout):
            s.close()
            return "%s:%d" % address, keep
        keep.append(s)
    raise AssertionError("the accept queue never filled")


def test_a_server_that_swallows_syns_holds_up_no_other(server, make_client):
    """The tcp connect happens in the call's poll loop: while one server's
    connect hangs (until connect_timeout_ms), the other server's frames go
    out at once, and its keys are served; only the silent one's fail."""
    hole, keep = blackhole()
    try:
        ns = unique("hole")
        writer = make_client(server.url, namespace=ns)
        keys = [f"k{i}" for i in range(64)]
        assert batch_put_bytes(writer, keys, [content(k, 1000) for k in keys]) == [0] * 64
        client = make_client(f"gdrkv://{server.address},{hole}", namespace=ns, transport="tcp",
                             timeout_ms=5000, connect_timeout_ms=2000)
        before = stat(server.stats(), "ops_get")
        served_at = []
        stop = threading.Event()

        def watch():
            while not stop.is_set() and not served_at:
                if stat(server.stats(), "ops_get") > before:
                    served_at.append(time.monotonic())
                time.sleep(0.01)

        with background(watch, stop=stop, timeout=30):
            started = time.monotonic()
            results, values = batch_get_bytes(client, keys, [1000] * 64)
            took = time.monotonic() - started
        mine = [r for r in results if r != errors.E_UNAVAILABLE]
        assert mine and len(mine) < 64, "the keys should land on both servers"
        assert all(r == 1000 for r in mine)
        assert served_at and served_at[0] - started < 1.0, \
            "the live server's frame waited for the other server's connect"
        assert 2.0 <= took < 4.5, took              # the silent one's connect timeout
        assert client.stats()["client"]["connect_failures"] >= 1
    finally:
        for s in keep:
            s.close()
