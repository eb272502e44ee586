"""`gdrkv serve --metrics-listen`: the server's counters at GET /metrics in
the Prometheus text format (#19, first part): parsed by prometheus_client's
own parser, named gdrkv_* with units and _total on counters, moving with
the traffic, op latencies as histograms; a scraper that stalls holds up
neither the data path nor, for long, the next scrape."""
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support import wire
from support.content import batch_get_bytes, batch_put_bytes, content
from support.util import counted, run_gdrkv, unique, wait_for

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

    after = None

    def moved(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    def gets_counted():
        nonlocal after
        after = families(scrape(server))
        return moved("gdrkv_ops", op="get"), moved("gdrkv_sent_bytes")

    assert counted(gets_counted, (1, 10 * 4096)) == (1, 10 * 4096)

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



def test_usage_by_namespace(server, make_client):
    """Objects and bytes per namespace; a name's odd bytes are
    percent-encoded so the text still parses."""
    plain, odd = unique("usage"), unique('od"d\\%') + "\u00e9"
    for ns, n in ((plain, 3), (odd, 2)):
        client = make_client(server.url, transport="tcp", namespace=ns)
        assert batch_put_bytes(client, [f"k{i}" for i in range(n)], [b"x" * 1000] * n) == [0] * n
    fams = families(scrape(server))
    assert value(fams, "gdrkv_namespace_objects", namespace=plain) == 3
    assert value(fams, "gdrkv_namespace_bytes", namespace=plain) == 3000
    encoded = odd.encode().replace(b"%", b"%25").replace(b'"', b"%22").replace(b"\\", b"%5C")
    encoded = b"".join(bytes([c]) if c < 0x80 else b"%%%02X" % c for c in encoded).decode()
    assert value(fams, "gdrkv_namespace_objects", namespace=encoded) == 2


def put_in_namespaces(server, namespaces, size=lambda i: 100):
    """One object in each namespace (any bytes), over the raw protocol."""
    with wire.connect(server.address) as conn:
        for i, ns in enumerate(namespaces):
            value = b"v" * size(i)
            hdr, results, _ = conn.call(wire.OP_PUT, [(b"k", len(value))], ns=ns, payload=value)
            assert hdr.status == 0 and results[0][0] == 0, (ns, hdr, results)


def namespace_series(text, name):
    """{decoded namespace: value}: label values unescaped by Prometheus'
    rules (prometheus_client's parser), then percent-decoded; a name that
    came twice fails."""
    series = {}
    for sample in families(text)[name].samples:
        decoded = urllib.parse.unquote_to_bytes(sample.labels["namespace"])
        assert decoded not in series, f"two series for {decoded!r}"
        series[decoded] = sample.value
    return series


def test_labels_are_exact_for_every_byte(server_factory):
    """The defect (#39, 3): labels stopped at 762 characters, so two long
    names that needed escaping gave one series, and neither decoded back.
    Now every byte value 0-255 makes a 255-byte name of its own, and names
    that differ only in their last byte after 254 bytes that all need
    escaping, each decodes back to exactly its name."""
    server = server_factory("64MiB", args=["--metrics-listen", "127.0.0.1:0",
                                           "--metrics-namespaces", "1000"])
    namespaces = [bytes([b]) * 255 for b in range(256)]
    namespaces += [b'"' * 254 + bytes([b]) for b in (0, 1, 0x25, 0x5C, 0x80, 0xFF)]
    namespaces += [bytes([b]) for b in range(256) if b != 0x22]
    put_in_namespaces(server, namespaces)
    text = scrape(server)
    for metric in ("gdrkv_namespace_objects", "gdrkv_namespace_bytes"):
        series = namespace_series(text, metric)
        assert set(series) == set(namespaces)
    assert all(v == 1 for v in namespace_series(text, "gdrkv_namespace_objects").values())


def test_namespace_series_are_capped(server_factory):
    """Only the metrics_namespaces namespaces with most bytes get series;
    the rest are summed, and the cap is reported."""
    server = server_factory("64MiB", args=["--metrics-listen", "127.0.0.1:0",
                                           "--metrics-namespaces", "2"])
    namespaces = [unique(f"cap{i}").encode() for i in range(5)]
    put_in_namespaces(server, namespaces, size=lambda i: 1000 * (i + 1))
    fams = families(scrape(server))
    assert namespace_series(scrape(server), "gdrkv_namespace_bytes") == \
        {namespaces[4]: 5000, namespaces[3]: 4000}
    assert value(fams, "gdrkv_namespace_series_max") == 2
    assert value(fams, "gdrkv_namespace_others") == 3
    assert value(fams, "gdrkv_namespace_others_objects") == 3
    assert value(fams, "gdrkv_namespace_others_bytes") == 1000 + 2000 + 3000


def metrics_token(tmp_path, mode=0o600):
    path = tmp_path / "metrics-token"
    path.write_text("metrics-secret-0123456789abcdef\n")
    path.chmod(mode)
    return path


def http_status(server, headers=()):
    request = urllib.request.Request(f"http://{address_of(server)}/metrics", headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_token_file_guards_the_endpoint(server_factory, tmp_path):
    """--metrics-token-file: 401 without the bearer token or with another,
    200 with it; the file must be private, as --auth-token-file's."""
    token = metrics_token(tmp_path)
    server = server_factory("32MiB", args=["--metrics-listen", "127.0.0.1:0",
                                           "--metrics-token-file", str(token)])
    assert http_status(server) == 401
    assert http_status(server, {"Authorization": "Bearer metrics-secret-0123456789abcdeX"}) == 401
    assert http_status(server, {"Authorization": "Bearer metrics-secret-0123456789abcde"}) == 401
    assert http_status(server, {"Authorization": "Basic bWV0cmljcw=="}) == 401
    assert http_status(server, {"Authorization": "Bearer metrics-secret-0123456789abcdef"}) == 200
    assert http_status(server, {"authorization": "bearer  metrics-secret-0123456789abcdef"}) == 200
    token.chmod(0o644)
    with pytest.raises(RuntimeError, match="chmod 600"):
        server_factory("16MiB", args=["--metrics-listen", "127.0.0.1:0",
                                      "--metrics-token-file", str(token)])


def test_a_port_alone_listens_on_loopback(server_factory):
    port = free_port()
    server = server_factory("16MiB", args=["--metrics-listen", str(port)])
    assert address_of(server) == f"127.0.0.1:{port}"


def test_other_paths_are_not_found(server):
    with pytest.raises(urllib.error.HTTPError) as e:
        scrape(server, "/")
    assert e.value.code == 404


def test_a_stalled_scraper_holds_up_nothing_for_long(server, make_client):
    """A scraper that connects and says nothing: the data path goes on."""
    host, port = address_of(server).rsplit(":", 1)
    stalled = socket.create_connection((host, int(port)))
    try:
        client = make_client(server.url, transport="tcp", namespace=unique("s"))
        started = time.monotonic()
        for i in range(50):
            client.put(f"k{i}", b"v" * 100)
        assert time.monotonic() - started < 2.0
        assert "gdrkv_store_objects" in scrape(server)
    finally:
        stalled.close()


def still_open(sock):
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def test_scrapers_are_served_at_once(server):
    """The defect (#39, 2): one thread served one scraper at a time, each
    silent one holding the next scrape for 2 s. Now a scrape is answered
    while five silent scrapers, connected before it, are still held."""
    host, port = address_of(server).rsplit(":", 1)
    silent = [socket.create_connection((host, int(port))) for _ in range(5)]
    try:
        assert "gdrkv_store_objects" in scrape(server)
        assert [still_open(s) for s in silent] == [True] * 5
    finally:
        for s in silent:
            s.close()


def test_a_trickled_request_is_cut_at_its_deadline(server):
    """The defect (#39, 2): the timeout was per recv, so a byte each second
    held the thread for as long as the request went on. Now the whole
    request has 2 s from the connect: the server closes the connection
    before 40 bytes sent 0.25 s apart are all in, and answers nothing."""
    host, port = address_of(server).rsplit(":", 1)
    request = b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 40 + b"\r\n\r\n"
    with socket.create_connection((host, int(port))) as sock:
        started = time.monotonic()
        sent = 0
        try:
            for byte in request:
                sock.sendall(bytes([byte]))
                sent += 1
                if not still_open(sock):
                    break
                sock.setblocking(True)
                time.sleep(0.25)            # the attack: a byte at a time, each well inside 2 s
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert sent < len(request), "the whole trickled request was read"
        assert time.monotonic() - started < 10
        sock.settimeout(5)
        try:
            assert sock.recv(100) == b""            # closed, nothing answered
        except ConnectionResetError:
            pass


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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(address, expr):
    url = f"http://{address}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as answer:
        result = json.loads(answer.read())["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def test_a_real_prometheus_scrapes_it(server_factory, make_client, tmp_path):
    """Debian's Prometheus (tests/run.sh installs it) scrapes the endpoint,
    which wants a bearer token, every second with the token from its
    credentials_file; its query API sees hits, misses and bytes move."""
    binary = shutil.which("prometheus")
    if binary is None:
        assert os.environ.get("GDRKV_REQUIRE_ENGINES") != "1", "prometheus is not installed"
        pytest.skip("prometheus is not installed (tests/run.sh installs it)")
    token = metrics_token(tmp_path)
    server = server_factory("64MiB", args=["--metrics-listen", "127.0.0.1:0",
                                           "--metrics-token-file", str(token)])
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                      "scrape_configs:\n  - job_name: gdrkv\n"
                      f"    authorization: {{credentials_file: '{token}'}}\n"
                      f"    static_configs: [{{targets: ['{address_of(server)}']}}]\n")
    web = f"127.0.0.1:{free_port()}"
    with open(tmp_path / "prometheus.log", "wb") as log:
        prom = subprocess.Popen([binary, f"--config.file={config}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}",
                                 f"--web.listen-address={web}"], stdout=log, stderr=log)
    try:
        def ready():
            try:
                with urllib.request.urlopen(f"http://{web}/-/ready", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False
        wait_for(ready, 60, "prometheus to start")
        client = make_client(server.url, transport="tcp", namespace=unique("prom"))
        keys = [unique("k") for _ in range(20)]
        assert batch_put_bytes(client, keys, [content(k, 4096) for k in keys]) == [0] * 20
        results, _ = batch_get_bytes(client, keys + ["nope"], [4096] * 21)
        assert results[:20] == [4096] * 20
        hits = 'gdrkv_store_hits_total{job="gdrkv"}'
        wait_for(lambda: (query(web, hits) or 0) >= 20, 60, "prometheus to see the hits")
        assert query(web, 'gdrkv_store_misses_total{job="gdrkv"}') >= 1
        assert query(web, 'gdrkv_received_bytes_total{job="gdrkv"}') >= 20 * 4096
        # More traffic, and the values it reports move with it.
        batch_get_bytes(client, keys, [4096] * 20)
        wait_for(lambda: (query(web, hits) or 0) >= 40, 60, "the hits to move")
        assert query(web, 'sum(gdrkv_op_duration_seconds_count{job="gdrkv",op="get"})') >= 2
    finally:
        prom.terminate()
        prom.wait(30)


def test_the_grafana_dashboard_queries_only_exported_series(server):
    """configs/grafana: every metric a panel's query names is one the server
    exports (a histogram's _bucket series included)."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "grafana",
                        "gdrkv-dashboard.json")
    with open(path) as f:
        dashboard = json.load(f)
    exported = set()
    for fam in families(scrape(server)).values():
        # A family may have no sample yet (no namespace has objects).
        exported |= {s.name for s in fam.samples} | {fam.name, fam.name + "_total"}
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    for expr in exprs:
        for name in re.findall(r"\bgdrkv_[a-z0-9_]+", expr):
            assert name in exported, f"{name} (in {expr!r}) is not exported"


def test_nic_counters(server_factory, tmp_path, monkeypatch):
    """The RDMA ports' own counters (sysfs, as `gdrkv stat --nic` reads
    them), here from a fake tree: the data words as bytes, the rest by name."""
    from support import fake_sysfs
    monkeypatch.setenv("GDRKV_SYSFS_ROOT", str(fake_sysfs.build(tmp_path / "root")))
    server = server_factory("32MiB", args=["--metrics-listen", "127.0.0.1:0", "--rdma", "off"])
    fams = families(scrape(server))
    for device in ("mlx5_0", "mlx5_1"):
        words = fake_sysfs.COUNTERS[device]
        assert value(fams, "gdrkv_nic_received_bytes", device=device, port="1") == \
            4 * words["port_rcv_data"]
        assert value(fams, "gdrkv_nic_sent_bytes", device=device, port="1") == \
            4 * words["port_xmit_data"]
    assert value(fams, "gdrkv_nic_counter", device="mlx5_1", port="1", group="hw_counters",
                 counter="np_cnp_sent") == 14
    assert value(fams, "gdrkv_nic_counter", device="mlx5_0", port="1", group="counters",
                 counter="port_rcv_packets") == 1000


def test_bench_scrape_reports_both_runs(tmp_path):
    """gdrkv bench --scrape: GETs timed with and without a scraper, each
    run's rate and p99 in the report, the scraper's rate measured."""
    report = tmp_path / "scrape.json"
    out = run_gdrkv("bench", "--scrape", "--scrape-namespaces", "20", "--scrape-seconds", "0.5",
                    "--repeat", "1", "--count", "8", "--json", str(report), timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    [row] = json.loads(report.read_text())["results"]
    assert row["size"] == 4096 and row["namespaces"] == 20
    for name in ("none", "scraping"):
        [run] = row["runs"][name]
        assert run["gets_per_s"] > 0 and run["p99_us"] > 0
    assert row["scrape_ms"] > 0
    assert "GET/s scraping" in out.stdout
