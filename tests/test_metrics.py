"""`gdrkv serve --metrics-listen`: the server's counters at GET /metrics in
the Prometheus text format (#19, first part): parsed by prometheus_client's
own parser, named gdrkv_* with units and _total on counters, moving with
the traffic, op latencies as histograms; a scraper that stalls holds up
neither the data path nor, for long, the next scrape."""
import re
import socket
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import batch_get_bytes, batch_put_bytes, content, unique

METRICS_LINE = re.compile(rb"metrics on http://(\S+?)/metrics")


@pytest.fixture
def server(server_factory):
    return server_factory("64MiB", args=["--metrics-listen", "127.0.0.1:0"])


def address_of(server):
    return METRICS_LINE.search(server.stdout()).group(1).decode()


def scrape(server, path="/metrics"):
    with urllib.request.urlopen(f"http://{address_of(server)}{path}", timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return answer.read().decode()


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams, name, **labels):
    for sample in fams[name].samples:
        if sample.name in (name, name + "_total") and sample.labels == labels:
            return sample.value
    raise KeyError((name, labels))


def test_metrics_parse_and_follow_the_conventions(server):
    fams = families(scrape(server))
    for name, fam in fams.items():
        assert re.fullmatch(r"gdrkv_[a-z0-9_]+", name), name
        assert fam.type in ("counter", "gauge", "histogram"), (name, fam.type)
    # Every server counter, named for its unit where it has one.
    for name in ("connections", "received_bytes", "sent_bytes", "frames_bad", "auth_denied",
                 "store_hits", "store_misses", "store_evictions", "store_evicted_bytes",
                 "ops", "keys"):
        assert fams["gdrkv_" + name].type == "counter", name
    for name in ("store_pool_bytes", "store_pinned_objects", "store_reserved_objects",
                 "connections_open", "buffered_request_bytes", "uptime_seconds"):
        assert fams["gdrkv_" + name].type == "gauge", name
    assert fams["gdrkv_op_duration_seconds"].type == "histogram"
    assert value(fams, "gdrkv_store_pool_bytes") == 64 << 20


def test_metrics_move_with_the_traffic(server, make_client):
    before = families(scrape(server))
    client = make_client(server.url, transport="tcp", namespace=unique("m"))
    keys = [unique("k") for _ in range(10)]
    assert batch_put_bytes(client, keys, [content(k, 4096) for k in keys]) == [0] * 10
    results, _ = batch_get_bytes(client, keys + ["missing"], [4096] * 11)
    assert results == [4096] * 10 + [-1]
    after = families(scrape(server))

    def moved(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("gdrkv_received_bytes") == 10 * 4096
    assert moved("gdrkv_sent_bytes") == 10 * 4096
    assert moved("gdrkv_store_hits") == 10 and moved("gdrkv_store_misses") == 1
    assert moved("gdrkv_ops", op="put") == 1 and moved("gdrkv_keys", op="get") == 11
    assert value(after, "gdrkv_connections_open", transport="tcp") >= 1
    # The GET's latency is in the histogram: cumulative buckets, +Inf = count.
    buckets = [s for s in after["gdrkv_op_duration_seconds"].samples
               if s.name.endswith("_bucket") and s.labels["op"] == "get"]
    counts = [s.value for s in buckets]
    assert counts == sorted(counts) and buckets[-1].labels["le"] == "+Inf"
    count = [s.value for s in after["gdrkv_op_duration_seconds"].samples
             if s.name.endswith("_count") and s.labels["op"] == "get"]
    assert counts[-1] == count[0] >= 1


def test_other_paths_are_not_found(server):
    with pytest.raises(urllib.error.HTTPError) as e:
        scrape(server, "/")
    assert e.value.code == 404


def test_a_stalled_scraper_holds_up_nothing_for_long(server, make_client):
    """A scraper that connects and says nothing: the data path goes on, and
    the next scrape is answered once its 2 s are up."""
    host, port = address_of(server).rsplit(":", 1)
    stalled = socket.create_connection((host, int(port)))
    try:
        client = make_client(server.url, transport="tcp", namespace=unique("s"))
        started = time.monotonic()
        for i in range(50):
            client.put(f"k{i}", b"v" * 100)
        assert time.monotonic() - started < 2.0
        started = time.monotonic()
        assert "gdrkv_store_objects" in scrape(server)
        assert time.monotonic() - started < 5.0
    finally:
        stalled.close()


def test_in_process_server_gives_the_same_text():
    import gdrkv
    with gdrkv.Server(memory="16MiB", pretouch=False, rdma="off", unix_path="") as plain:
        assert plain.metrics_address == ""
        assert "gdrkv_store_pool_bytes 16777216" in plain.metrics()
    with gdrkv.Server(memory="16MiB", pretouch=False, rdma="off", unix_path="",
                      metrics_listen="127.0.0.1:0") as served:
        with urllib.request.urlopen(f"http://{served.metrics_address}/metrics",
                                    timeout=10) as answer:
            over_http = families(answer.read().decode())
        assert set(over_http) == set(families(served.metrics()))
