"""Replicas (option replicas=R) over real server processes: a PUT lands on
its top R members, DELETE removes every copy, reads fall over to the next
copy when a member is killed or frozen, a join reads through to the
previous owners instead of missing, and a member leaving is read but takes
no PUTs."""
import signal
import threading
import time

import pytest

import gdrkv
from support.content import batch_get_bytes, batch_put_bytes, check_read, content
from support.servers import freeze
from support.util import background, stat, unique, wait_for

MIB = 1 << 20
TIMEOUT_MS = 1000
MARGIN_S = 1.0                  # scheduling slack on a loaded 2-core machine
KEYS = [f"rep-{i}" for i in range(300)]
SIZES = [500 + 13 * i for i in range(300)]
VALUES = [content(k, s) for k, s in zip(KEYS, SIZES)]


@pytest.fixture
def four(server_factory):
    return [server_factory(memory="64MiB") for _ in range(4)]


def members(servers, leaving=()):
    """Equal capacities, each server its own zone."""
    return [(s.address, 64 * MIB, f"zone-{i}", s in leaving) for i, s in enumerate(servers)]


def holders(make_client, servers, keys, namespace):
    """For each key, the indices of the servers that hold it, asked of each alone."""
    found = [make_client(s.url, namespace=namespace).batch_exists(keys) for s in servers]
    return [[i for i, has in enumerate(where) if has] for where in zip(*found)]


def test_puts_land_on_their_top_members_and_deletes_remove_every_copy(four, make_client):
    ns = unique("top")
    # A static list: equal weights, every member on this host (one failure
    # domain), so the copies go to distinct members.
    client = make_client("gdrkv://" + ",".join(s.address for s in four) + "?replicas=2",
                         namespace=ns)
    staged = batch_put_bytes(client, KEYS, VALUES)
    assert staged == [0] * len(KEYS)
    static = [(s.address, 1, None, False) for s in four]
    where = holders(make_client, four, KEYS, ns)
    for key, held in zip(KEYS, where):
        assert held == sorted(gdrkv.place(key, static, 2)), key
    # batch_put_copies says how many copies were written (already there: 2).
    assert client.batch_put_copies(KEYS[:10], [0] * 10, [0] * 10) == [2] * 10
    results, values = batch_get_bytes(client, KEYS, SIZES)
    assert all(check_read(k, s, r, v, allowed_errors=()) for k, s, r, v in
               zip(KEYS, SIZES, results, values))
    assert client.batch_delete(KEYS) == [0] * len(KEYS)
    assert all(not held for held in holders(make_client, four, KEYS, ns))


def reader_loop(client, stop, reads, failures, calls):
    while not stop.is_set():
        started = time.monotonic()
        results, values = batch_get_bytes(client, KEYS, SIZES)
        calls.append(time.monotonic() - started)
        for key, size, result, value in zip(KEYS, SIZES, results, values):
            try:
                reads.append(check_read(key, size, result, value))
            except AssertionError as e:
                failures.append(str(e))


def test_a_killed_member_costs_no_failed_read(four, make_client):
    client = make_client(None, _members_later=True, namespace=unique("kill"), replicas=2,
                         timeout_ms=TIMEOUT_MS, connect_timeout_ms=500)
    client._set_members(members(four))
    assert batch_put_bytes(client, KEYS, VALUES, copies=True) == [2] * len(KEYS)
    reads, failures, calls, stop = [], [], [], threading.Event()
    with background(lambda: reader_loop(client, stop, reads, failures, calls), timeout=60):
        try:
            wait_for(lambda: len(calls) >= 2, 30, "reads before the kill")
            four[1].kill()
            after = len(reads)
            wait_for(lambda: len(calls) >= 2 + 5, 30, "reads after the kill")
        finally:
            stop.set()
    assert not failures, failures[:5]
    hits = reads[after:]
    assert sum(hits) >= 0.99 * len(hits), f"{len(hits) - sum(hits)} misses of {len(hits)}"
    assert max(calls) <= TIMEOUT_MS / 1000 + MARGIN_S
    assert stat(client.stats()["client"], "failovers") > 0

    # PUTs go on: stored where one copy was written, and they say so.
    later = [f"later-{i}" for i in range(100)]
    copies = batch_put_bytes(client, later, [k.encode() for k in later], copies=True)
    lost = [k for k in later if four[1].address in
            [members(four)[i][0] for i in gdrkv.place(k, members(four), 2)]]
    assert copies == [1 if k in lost else 2 for k in later]
    assert stat(client.stats()["client"], "put_copies_short") == len(lost)
    assert client.batch_exists(later) == [True] * len(later)


def test_a_frozen_member_is_fallen_over_within_the_timeout(four, make_client):
    client = make_client(None, _members_later=True, namespace=unique("freeze"), replicas=2,
                         timeout_ms=TIMEOUT_MS, connect_timeout_ms=500, backoff_min_ms=200,
                         backoff_max_ms=400)
    client._set_members(members(four))
    assert batch_put_bytes(client, KEYS, VALUES) == [0] * len(KEYS)
    frozen = four[2]
    freeze(frozen.proc)
    try:
        for _ in range(3):
            started = time.monotonic()
            results, values = batch_get_bytes(client, KEYS, SIZES)
            assert time.monotonic() - started <= TIMEOUT_MS / 1000 + MARGIN_S
            assert all(check_read(k, s, r, v, allowed_errors=()) for k, s, r, v in
                       zip(KEYS, SIZES, results, values))
        assert stat(client.stats()["client"], "failovers") > 0
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
    hits_before = stat(frozen.stats(), "hits")

    def served_again():
        batch_get_bytes(client, KEYS, SIZES)
        return stat(frozen.stats(), "hits") > hits_before

    wait_for(served_again, 10, "the resumed member to serve reads again")


def test_a_join_moves_its_share_and_reads_through(server_factory, make_client):
    five = [server_factory(memory="64MiB") for _ in range(5)]
    keys = [f"join-{i}" for i in range(4000)]
    ns = unique("join")
    client = make_client(None, _members_later=True, namespace=ns, timeout_ms=5000)
    client._set_members(members(five[:4]))
    assert batch_put_bytes(client, keys, [k.encode() for k in keys]) == [0] * len(keys)

    misses, stop, rounds = [], threading.Event(), []

    def reader():
        while not stop.is_set():
            sizes = [len(k) for k in keys]
            results, _ = batch_get_bytes(client, keys, sizes)
            misses.extend(k for k, r in zip(keys, results) if r != len(k))
            rounds.append(1)

    with background(reader, timeout=120):
        try:
            wait_for(lambda: rounds, 30, "reads before the join")
            client._set_members(members(five))
            joined = len(rounds)
            wait_for(lambda: len(rounds) >= joined + 3, 60, "reads after the join")
        finally:
            stop.set()
    assert not misses, f"{len(misses)} reads missed, e.g. {misses[:3]}"
    new = members(five)
    moved = [k for k in keys if gdrkv.place(k, new, 1) == [4]]
    share = len(moved) / len(keys)
    assert abs(share - 1 / 5) <= 0.1 * (1 / 5), f"moved share {share:.3f}"
    assert stat(client.stats()["client"], "read_throughs") >= len(moved)
    # The keys the new member owns are the ones PUTs now bring it (the read-
    # through copies nothing over).
    assert stat(five[4].stats(), "objects") == 0
    assert batch_put_bytes(client, keys, [k.encode() for k in keys]) == [0] * len(keys)
    assert stat(five[4].stats(), "objects") == len(moved)


def test_a_member_leaving_is_read_but_takes_no_puts(four, make_client):
    ns = unique("leave")
    client = make_client(None, _members_later=True, namespace=ns, replicas=2, settle_ms=0)
    client._set_members(members(four))
    assert batch_put_bytes(client, KEYS, VALUES) == [0] * len(KEYS)
    client._set_members(members(four, leaving=four[:1]))
    results, values = batch_get_bytes(client, KEYS, SIZES)
    assert all(check_read(k, s, r, v, allowed_errors=()) for k, s, r, v in
               zip(KEYS, SIZES, results, values))
    later = [f"later-{i}" for i in range(200)]
    assert client.batch_put_copies(later, [0] * 200, [0] * 200) == [2] * 200
    assert not any(holders(make_client, four[:1], later, ns)[i] for i in range(200))
    assert client.batch_exists(later) == [True] * 200


def test_a_cold_lookup_costs_one_round_trip_unless_its_key_moved(server_factory, make_client):
    """While the table is young only the keys whose owner changed are asked
    twice (new owner, then previous); every other miss is final at once,
    and after settle_ms every miss is."""
    five = [server_factory(memory="64MiB") for _ in range(5)]
    client = make_client(None, _members_later=True, namespace=unique("cold"), settle_ms=60000)
    client._set_members(members(five[:4]))
    client._set_members(members(five))
    cold = [f"cold-{i}" for i in range(1000)]
    moved = [k for k in cold
             if gdrkv.place(k, members(five), 1) != gdrkv.place(k, members(five[:4]), 1)]
    assert moved

    def asked():
        """Keys the servers were asked about (each of these reads misses)."""
        return sum(stat(s.stats(), "keys_exists") for s in five)

    before = asked()
    assert client.batch_exists(cold) == [False] * len(cold)
    assert asked() - before == len(cold) + len(moved)
    assert stat(client.stats()["client"], "read_throughs") == len(moved)

    settled = make_client(None, _members_later=True, namespace=unique("cold"), settle_ms=0)
    settled._set_members(members(five[:4]))
    settled._set_members(members(five))
    before = asked()
    assert settled.batch_exists(cold) == [False] * len(cold)
    assert asked() - before == len(cold)


def test_a_delete_while_young_is_not_read_back_through(server_factory, make_client):
    five = [server_factory(memory="64MiB") for _ in range(5)]
    keys = [f"del-{i}" for i in range(300)]
    client = make_client(None, _members_later=True, namespace=unique("del"), settle_ms=60000)
    client._set_members(members(five[:4]))
    assert batch_put_bytes(client, keys, [k.encode() for k in keys]) == [0] * len(keys)
    client._set_members(members(five))
    assert client.batch_exists(keys) == [True] * len(keys)      # read through
    assert client.batch_delete(keys) == [0] * len(keys)
    assert client.batch_exists(keys) == [False] * len(keys)
