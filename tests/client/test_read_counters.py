"""Hits and misses, on the server and in the client, for every read call of
the API over every transport: get, batch_get (its shm and rdma lease paths
included) and batch_exists. A get is one GET frame, so one lookup: a
missing key counts one miss. EXISTS keeps counters of its own
(docs/operations.md, "What the read counters count"). GPU destinations:
tests/gpu/test_gpu.py."""
import pytest

from gdrkv import errors
from support.content import batch_get_bytes, batch_put_bytes, content
from support.softverbs import TRANSPORTS
from support.util import stat, unique

SERVER_MEMORY = "64MiB"
# Every read frame the server may be sent for a GET: tcp's GET, shm's and
# rdma's LEASE, and the RELEASE that follows a lease.
GET_FRAMES = ("ops_get", "ops_lease")


@pytest.fixture(params=TRANSPORTS)
def reader(request, server, make_client):
    """(client, transport) of the module's server in a fresh namespace."""
    return make_client(server.url, transport=request.param, namespace=unique("reads")), \
        request.param


def deltas(server, client, body):
    """Runs body(); the changes it made to the server's and the client's
    counters, as two dicts."""
    before_s, before_c = server.stats(), client.stats()["client"]
    body()
    after_s, after_c = server.stats(), client.stats()["client"]
    return ({k: v - before_s[k] for k, v in after_s.items() if isinstance(v, int)},
            {k: v - before_c[k] for k, v in after_c.items()})


def store(client, present):
    values = [content(k, 3000 + 100 * i) for i, k in enumerate(present)]
    assert batch_put_bytes(client, present, values) == [0] * len(present)
    return dict(zip(present, values))


def test_get_is_one_frame_and_counts_each_miss(server, reader):
    """8 gets of which 3 miss: 5 hits and 3 misses on both sides, one GET
    call and one read frame per get, no EXISTS (the issue saw misses 0:
    get asked for the size with EXISTS first, then read)."""
    client, transport = reader
    values = store(client, [f"here-{i}" for i in range(5)])
    keys = [*values, "gone-0", "gone-1", "gone-2"]
    got = {}
    server_d, client_d = deltas(server, client,
                                lambda: got.update((k, client.get(k)) for k in keys))
    assert got == {**values, "gone-0": None, "gone-1": None, "gone-2": None}
    assert (stat(server_d, "hits"), stat(server_d, "misses")) == (5, 3)
    assert sum(stat(server_d, op) for op in GET_FRAMES) == 8
    assert stat(server_d, "ops_exists") == 0
    assert (stat(client_d, "calls_get"), stat(client_d, "calls_exists")) == (8, 0)
    assert (stat(client_d, "hits"), stat(client_d, "misses")) == (5, 3)


def test_get_of_large_and_empty_objects_is_one_frame(server, reader):
    """The size comes with the answer whatever it is: a 5 MiB object (more
    than a tcp socket buffer, striped nowhere) and an empty one."""
    client, _ = reader
    big = content("big", 5 << 20)
    client.put("big", big)
    client.put("empty", b"")
    server_d, client_d = deltas(server, client, lambda: (
        assert_equal(client.get("big"), big), assert_equal(client.get("empty"), b"")))
    assert sum(stat(server_d, op) for op in GET_FRAMES) == 2
    assert (stat(server_d, "hits"), stat(server_d, "misses")) == (2, 0)
    assert stat(client_d, "calls_get") == 2 and stat(client_d, "calls_exists") == 0


def assert_equal(got, want):
    assert got == want


def test_batch_get_counts_hits_and_misses(server, reader):
    """One batch_get of 8 keys, 3 missing; a destination too small is
    neither (the object is there: it counts as a hit on the server, which
    found it, and as an error, not a miss, in the client)."""
    client, transport = reader
    values = store(client, [f"b-{i}" for i in range(5)])
    keys = [*values, "no-0", "no-1", "no-2"]
    sizes = [len(values.get(k, b"")) or 64 for k in keys]
    result = {}
    server_d, client_d = deltas(server, client,
                                lambda: result.update(r=batch_get_bytes(client, keys, sizes)))
    results, got = result["r"]
    assert results == [len(values[k]) for k in values] + [errors.E_NOT_FOUND] * 3
    assert got[:5] == list(values.values())
    assert (stat(server_d, "hits"), stat(server_d, "misses")) == (5, 3)
    assert (stat(client_d, "hits"), stat(client_d, "misses")) == (5, 3)
    if transport == "shm":
        assert stat(server_d, "ops_lease") >= 1 and stat(server_d, "ops_get") == 0

    small = {}
    server_d, client_d = deltas(server, client, lambda: small.update(
        r=batch_get_bytes(client, ["b-0", "no-0"], [16, 16])))
    assert small["r"][0] == [errors.E_TOO_SMALL, errors.E_NOT_FOUND]
    assert (stat(server_d, "hits"), stat(server_d, "misses")) == (1, 1)
    assert (stat(client_d, "hits"), stat(client_d, "misses")) == (0, 1)


def test_exists_counts_apart_from_reads(server, reader):
    """batch_exists is a lookup, but not a read: it counts in exists_hits
    and exists_misses, and leaves hits and misses to the reads (an engine
    checks, then reads what it found: counted together, every page read
    would count twice)."""
    client, _ = reader
    values = store(client, [f"e-{i}" for i in range(4)])
    keys = [*values, "absent-0", "absent-1"]
    found = {}
    server_d, client_d = deltas(server, client,
                                lambda: found.update(r=client.batch_exists(keys)))
    assert found["r"] == [True] * 4 + [False] * 2
    assert (stat(server_d, "exists_hits"), stat(server_d, "exists_misses")) == (4, 2)
    assert (stat(server_d, "hits"), stat(server_d, "misses")) == (0, 0)
    assert (stat(client_d, "exists_hits"), stat(client_d, "exists_misses")) == (4, 2)
    assert (stat(client_d, "hits"), stat(client_d, "misses")) == (0, 0)


def test_a_server_that_cannot_answer_is_no_miss(server_factory, make_client):
    """Keys of a server that is down fail UNAVAILABLE: errors, not misses."""
    down = server_factory()
    client = make_client(down.url, transport="tcp", timeout_ms=2000)
    down.kill()
    with pytest.raises(errors.GdrkvError) as failed:
        client.get("k")
    assert failed.value.code == errors.E_UNAVAILABLE
    counters = client.stats()["client"]
    assert (stat(counters, "hits"), stat(counters, "misses")) == (0, 0)
    assert stat(counters, "errors_unavailable") == 1
