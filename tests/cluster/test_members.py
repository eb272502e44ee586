"""A client's server table swapped at run time (Client._set_members, the C
gdrkv_client_set_members that the cluster watcher drives): a client opened
with its members to come, swaps under calls, calls in flight finishing on
the table they began with, servers kept keeping their connections, bad
tables refused with the old one kept."""
import signal
import threading
import time

import pytest

import gdrkv
from support.content import batch_get_bytes, batch_put_bytes, check_read, content
from support.servers import freeze
from support.util import background, stat, unique

MIB = 1 << 20
MARGIN_S = 1.0                  # scheduling slack on a loaded 2-core machine


def members(servers, leaving=()):
    return [(s.address, 64 * MIB, f"zone-{i}", s in leaving) for i, s in enumerate(servers)]


@pytest.fixture
def three(server_factory):
    return [server_factory(memory="64MiB") for _ in range(3)]


def test_members_later_then_set(three, make_client):
    client = make_client(None, _members_later=True, namespace=unique("later"), replicas=2)
    assert client.batch_exists(["k"]) == [False]
    assert client.batch_sizes(["k"]) == [gdrkv.E_UNAVAILABLE]
    assert batch_put_bytes(client, ["k"], [b"v"]) == [gdrkv.E_UNAVAILABLE]
    assert stat(client.stats()["client"], "members") == 0

    client._set_members(members(three))
    assert sorted(client.stats()["servers"]) == sorted(s.address for s in three)
    client.put("k", b"v")
    assert client.get("k") == b"v"
    assert stat(client.stats()["client"], "membership_changes") == 1

    with pytest.raises(ValueError, match="members come later"):
        gdrkv.Client(three[0].url, _members_later=True)


def test_bad_tables_are_refused_and_the_old_one_stays(three, make_client):
    client = make_client(None, _members_later=True, namespace=unique("bad"))
    client._set_members(members(three[:2]))
    good = members(three)
    for bad, why in (([good[0], good[0]], "listed twice"),
                     ([("10.0.0.1:notaport", MIB, None, False)], "bad server address"),
                     ([(three[0].address, 0, None, False)], "capacity"),
                     ([(three[0].address, MIB, None)], "must be")):
        with pytest.raises(ValueError, match=why):
            client._set_members(bad)
    assert sorted(client.stats()["servers"]) == sorted(s.address for s in three[:2])
    assert client.ping()


def test_swaps_under_calls(three, make_client):
    """Threads put and read back while the table changes between subsets of
    the servers: every read is its bytes or a miss, never an error, and no
    call outlives its timeout."""
    ns = unique("swap")
    client = make_client(None, _members_later=True, namespace=ns, replicas=2, timeout_ms=2000)
    client._set_members(members(three))
    sizes = [100 + i for i in range(200)]
    failures, stop, calls = [], threading.Event(), []

    def caller(name):
        # Keys of its own: two writers of one key at once get E_BUSY.
        keys = [f"swap-{name}-{i}" for i in range(200)]
        while not stop.is_set():
            started = time.monotonic()
            puts = batch_put_bytes(client, keys, [content(k, s) for k, s in zip(keys, sizes)])
            results, values = batch_get_bytes(client, keys, sizes)
            calls.append(time.monotonic() - started)
            try:
                assert all(r == 0 for r in puts), puts
                for key, size, result, value in zip(keys, sizes, results, values):
                    check_read(key, size, result, value)
            except AssertionError as e:
                failures.append(str(e))

    tables = [three, three[:2], three[1:], [three[0], three[2]], three]
    with background(lambda: caller("a"), lambda: caller("b"), timeout=60):
        try:
            for i in range(30):
                seen = len(calls)
                client._set_members(members(tables[i % len(tables)],
                                            leaving=three[:1] if i % 4 == 3 else ()))
                while len(calls) == seen and not failures:
                    time.sleep(0.01)        # let a call run on this table
        finally:
            stop.set()
    assert not failures, failures[:3]
    assert max(calls) <= 2 * 2.0 + MARGIN_S
    assert stat(client.stats()["client"], "membership_changes") == 31


def test_a_call_in_flight_finishes_on_its_table(three, make_client):
    """A call stuck on a frozen server ends by its own timeout, on the table
    it began with; the swap that drops that server meanwhile returns at once,
    and calls after it never go there."""
    ns = unique("flight")
    # settle_ms=0: no read-through to the old table, whose server is frozen.
    client = make_client(None, _members_later=True, namespace=ns, timeout_ms=3000,
                         backoff_min_ms=60000, backoff_max_ms=60000, settle_ms=0)
    client._set_members(members(three[:1]))
    client.put("k", b"v")
    freeze(three[0].proc)
    try:
        stuck = {}

        def stuck_call():
            started = time.monotonic()
            stuck["result"] = client.batch_sizes(["k"])[0]
            stuck["took"] = time.monotonic() - started

        with background(stuck_call, timeout=30):
            time.sleep(0.5)                 # the call is waiting on the frozen server
            client._set_members(members(three[1:]))
            assert "result" not in stuck, "the swap waited for the call in flight"
            assert client.batch_sizes(["k"]) == [gdrkv.E_NOT_FOUND]     # the new table
            client.put("k", b"new")
            assert client.get("k") == b"new"
        assert stuck["result"] == gdrkv.E_TIMEOUT
        assert 3.0 * 0.8 <= stuck["took"] <= 3.0 + MARGIN_S
    finally:
        three[0].proc.send_signal(signal.SIGCONT)


def test_servers_kept_keep_their_connections(three, make_client):
    client = make_client(None, _members_later=True, namespace=unique("keep"), transport="tcp")
    client._set_members(members(three))
    assert client.ping()
    connects = stat(client.stats()["client"], "connects")
    for i in range(10):
        client._set_members(members(three[:2] if i % 2 else three, leaving=three[1:2]))
        assert client.ping()
    # Back to all three: the third server was out of the table in between,
    # and still is the same server with its idle connection.
    client._set_members(members(three))
    assert client.ping()
    assert stat(client.stats()["client"], "connects") == connects


def test_replicas_option_is_checked(three, make_client):
    url = "gdrkv://" + ",".join(s.address for s in three)
    client = make_client(url + "?replicas=3&settle_ms=0")
    keys = [f"r-{i}" for i in range(20)]
    assert client.batch_put_copies(keys, [0] * 20, [0] * 20) == [3] * 20
    for bad in ("0", "9", "two"):
        with pytest.raises(ValueError, match="replicas"):
            gdrkv.Client(url + f"?replicas={bad}")


def test_a_read_through_to_a_member_gone_is_a_miss(three, make_client):
    """The previous owner of a moved key is dead: the read is a miss (the
    key is not where it lives now), never the dead member's error."""
    client = make_client(None, _members_later=True, namespace=unique("gone"), settle_ms=60000,
                         timeout_ms=2000)
    client._set_members(members(three[:1]))
    client.put("k", b"v")
    three[0].kill()
    client._set_members(members(three[1:]))
    assert client.batch_sizes(["k"]) == [gdrkv.E_NOT_FOUND]
    assert client.get("k") is None
    assert stat(client.stats()["client"], "read_throughs") >= 1
