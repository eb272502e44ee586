"""gdrkv.Client's URL and options, and its life cycle."""
import time

import pytest

import gdrkv
from support.servers import drain
from support.util import unique
from gdrkv import errors

VALID_OPTIONS = ["namespace", "timeout_ms", "connect_timeout_ms", "conns", "transport",
                 "backoff_min_ms", "backoff_max_ms", "replicas", "settle_ms"]


@pytest.fixture(scope="module")
def embedded():
    with gdrkv.Server(memory="32MiB", pretouch=False) as server:
        yield server


def timed_get(client):
    started = time.monotonic()
    results = client.batch_exists(["k"])
    return time.monotonic() - started, results


def test_server_list_and_default_port(make_client):
    client = make_client("gdrkv://127.0.0.1:1,127.0.0.1:2,127.0.0.1", timeout_ms=300)
    stats = client.stats()
    assert sorted(stats["servers"]) == ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:7480"]
    assert "error" in stats["servers"]["127.0.0.1:1"]
    assert isinstance(stats["client"], dict)


def test_query_options_apply(embedded, make_client):
    ns = unique("query")
    writer = make_client(f"{embedded.url}?namespace={ns}&timeout_ms=2000&conns=2")
    writer.put("q", b"value")
    assert make_client(embedded.url, namespace=ns).get("q") == b"value"
    assert make_client(embedded.url).get("q") is None      # default namespace is another


def test_timeout_from_query_and_keyword_wins(fake_server, make_client):
    url = fake_server(drain).url
    slow = make_client(f"{url}?timeout_ms=1500")
    elapsed, results = timed_get(slow)
    assert results == [False] and 1.2 <= elapsed <= 2.5

    fast = make_client(f"{url}?timeout_ms=1500", timeout_ms=300)
    elapsed, results = timed_get(fast)
    assert results == [False] and 0.2 <= elapsed <= 1.3


@pytest.mark.parametrize("where", ["query", "keyword"])
def test_unknown_option_is_named(where, embedded):
    with pytest.raises(ValueError) as exc:
        if where == "query":
            gdrkv.Client(f"{embedded.url}?colour=blue")
        else:
            gdrkv.Client(embedded.url, colour="blue")
    message = str(exc.value)
    assert "colour" in message
    assert all(name in message for name in VALID_OPTIONS), message


@pytest.mark.parametrize("option, value", [
    ("timeout_ms", "soon"),
    ("timeout_ms", -1),
    ("timeout_ms", 0),
    ("conns", 0),
    ("conns", "four"),
    ("connect_timeout_ms", -5),
    ("backoff_min_ms", "x"),
    ("transport", "pigeon"),
    ("replicas", 0),
    ("replicas", 9),
    ("settle_ms", -1),
    ("namespace", "n" * 256),
    ("namespace", "tenant\0other"),
])
def test_bad_option_value_is_named(option, value, embedded):
    with pytest.raises(ValueError, match=option):
        gdrkv.Client(embedded.url, **{option: value})


@pytest.mark.parametrize("url", ["", "gdrkv://", "http://127.0.0.1:1",
                                 "gdrkv://127.0.0.1:notaport", "gdrkv://127.0.0.1:70000",
                                 "gdrkv://127.0.0.1:1,,127.0.0.1:2"])
def test_bad_url(url):
    with pytest.raises(ValueError):
        gdrkv.Client(url)


def test_rdma_to_a_server_without_rdma_fails_its_keys():
    # transport rdma never falls back to tcp: a server that has no rdma
    # refuses RDMA_HELLO and every key fails as unavailable.
    with gdrkv.Server(memory="64MiB", pretouch=False, unix_path="", rdma="off") as server, \
            gdrkv.Client(f"{server.url}?transport=rdma", namespace=unique(),
                         timeout_ms=2000) as client:
        assert client.batch_sizes(["k"]) == [errors.E_UNAVAILABLE]
        assert server.stats()["rdma_enabled"] == 0


def test_unknown_transport_is_refused(embedded):
    with pytest.raises(ValueError, match="transport must be one of"):
        gdrkv.Client(embedded.url, transport="udp")


@pytest.mark.parametrize("transport", ["auto", "tcp", "shm"])
def test_available_transports(transport, embedded):
    with gdrkv.Client(embedded.url, transport=transport, namespace=unique()) as client:
        client.put("t", b"x" * 100)
        assert client.get("t") == b"x" * 100
        assert client.ping() is True


def test_close_is_idempotent_and_later_calls_fail(embedded):
    client = gdrkv.Client(embedded.url, namespace=unique())
    client.put("c", b"v")
    client.close()
    client.close()
    calls = {
        "batch_put": lambda: client.batch_put(["c"], [0], [0]),
        "batch_get": lambda: client.batch_get(["c"], [0], [0]),
        "batch_exists": lambda: client.batch_exists(["c"]),
        "batch_sizes": lambda: client.batch_sizes(["c"]),
        "batch_delete": lambda: client.batch_delete(["c"]),
        "put": lambda: client.put("c", b"v"),
        "get": lambda: client.get("c"),
        "clear": client.clear,
        "ping": client.ping,
    }
    for name, call in calls.items():
        with pytest.raises(gdrkv.GdrkvError) as exc:
            call()
        assert exc.value.code == errors.E_CLOSED, name


def test_context_manager_closes(embedded):
    with gdrkv.Client(embedded.url) as client:
        assert client.ping() is True
    with pytest.raises(gdrkv.GdrkvError):
        client.ping()
