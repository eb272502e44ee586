"""Placement (gdrkv.place, the C client's native/client/placement.c):
weighted rendezvous hashing by capacity, replicas over failure domains.
Properties checked with hypothesis: the same answer in every process,
minimal movement on a join or a leave, shares that follow the weights,
replicas in distinct domains whenever there are enough."""
import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

import gdrkv
from support.util import python_child

GIB = 1 << 30
MAX_REPLICAS = 8


@st.composite
def clusters(draw, min_members=1, max_members=12):
    """(members, replicas): distinct addresses, capacities, zones (some
    None: the member's host), some members leaving."""
    n = draw(st.integers(min_members, max_members))
    hosts = draw(st.lists(st.integers(1, 250), min_size=n, max_size=n))
    ports = draw(st.lists(st.integers(1024, 65535), min_size=n, max_size=n, unique=True))
    members = []
    for i in range(n):
        capacity = draw(st.integers(1, 64)) * GIB
        zone = draw(st.one_of(st.none(), st.sampled_from(["a", "b", "c", "d", "e"])))
        leaving = draw(st.booleans()) and draw(st.booleans())
        members.append((f"10.0.0.{hosts[i]}:{ports[i]}", capacity, zone, leaving))
    return members, draw(st.integers(1, MAX_REPLICAS))


keys = st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=40, unique=True)

PLACE_SCRIPT = """
import json
cases = json.loads(ARGS[0])
out = [[gdrkv.place(bytes.fromhex(k), [tuple(m) for m in members], r) for k in ks]
       for members, r, ks in cases]
print(json.dumps(out))
"""


@settings(max_examples=4)
@given(st.lists(st.tuples(clusters(), keys), min_size=5, max_size=10))
def test_the_same_in_every_process(cases):
    """Two other processes, with other hash seeds (Python's own hashing must
    not leak into placement), place every key where this one does."""
    mine = [[gdrkv.place(k, members, r) for k in ks] for (members, r), ks in cases]
    payload = json.dumps([[members, r, [k.hex() for k in ks]] for (members, r), ks in cases])
    for hash_seed in ("1", "4242"):
        theirs = python_child(PLACE_SCRIPT, payload, env={"PYTHONHASHSEED": hash_seed})
        assert json.loads(theirs) == mine


def domain(member):
    addr, _, zone, _ = member
    return zone or addr.rsplit(":", 1)[0]


@given(clusters(), keys)
def test_replicas_in_distinct_domains_whenever_there_are_enough(cluster, ks):
    members, replicas = cluster
    writable = [m for m in members if not m[3]]
    domains = {domain(m) for m in writable}
    for key in ks:
        placed = gdrkv.place(key, members, replicas)
        assert len(placed) == min(replicas, len(writable))
        assert len(set(placed)) == len(placed)
        assert not any(members[i][3] for i in placed), "a leaving member took a PUT"
        first = [domain(members[i]) for i in placed[:min(replicas, len(domains))]]
        assert len(set(first)) == len(first), f"replicas share a domain: {first}"


@given(clusters(min_members=2), keys, st.data())
def test_a_join_or_leave_moves_only_the_keys_it_must(cluster, ks, data):
    """Removing a member changes only the keys it owned; its other keys keep
    their owner. With every member its own domain, the same holds for the
    whole replica list: the others keep their copies."""
    members, replicas = cluster
    members = [(a, c, a, False) for a, c, _, _ in members]     # each its own domain
    gone = data.draw(st.integers(0, len(members) - 1))
    rest = members[:gone] + members[gone + 1:]
    renumber = [i for i in range(len(members)) if i != gone]
    for key in ks:
        before = gdrkv.place(key, members, replicas)
        after = [renumber[i] for i in gdrkv.place(key, rest, replicas)]
        if before[0] != gone:
            assert after[0] == before[0], "a key moved between members that stayed"
        # The replicas that stayed are still replicas (a join is the reverse).
        assert set(before) - {gone} <= set(after)


@settings(max_examples=8)
@given(st.lists(st.integers(1, 8), min_size=2, max_size=6))
def test_the_load_follows_the_weights(weights):
    members = [(f"10.0.1.{i + 1}:7480", w * GIB, None, False) for i, w in enumerate(weights)]
    n_keys = 20000
    counts = [0] * len(members)
    for i in range(n_keys):
        counts[gdrkv.place(f"page-{i}".encode(), members, 1)[0]] += 1
    total = sum(weights)
    for count, weight in zip(counts, weights):
        share = weight / total
        # Five standard deviations of a binomial share: sampling, not placement.
        slack = 5 * math.sqrt(share * (1 - share) / n_keys)
        assert abs(count / n_keys - share) <= slack, (counts, weights)


def test_bad_members_are_refused():
    ok = ("10.0.0.1:7480", GIB, None, False)
    for bad in ([ok, ok], [("10.0.0.1:7480", 0, None, False)], [("no port:x", GIB, None, False)],
                [("10.0.0.1:7480", GIB)]):
        try:
            gdrkv.place(b"k", bad, 1)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad}")
    assert gdrkv.place(b"k", [], 2) == []
