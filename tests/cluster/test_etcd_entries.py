"""What is read from etcd is checked, never trusted (#40): a member entry
of any other shape is left out (and logged), whatever its bytes; cluster
URLs are parsed or refused by name."""
import http.server
import json
import os
import threading

import pytest
from hypothesis import given, strategies as st

from gdrkv.cluster.etcd import Etcd, EtcdError
from gdrkv.cluster.members import (CLIENT_SCHEME, Member, entry_key, make_entry, parse_cluster,
                                   parse_entry)

NAME = "prod"
ADDR = "10.0.0.5:7480"
GOOD = {"addr": ADDR, "capacity": 1 << 30, "zone": "rack-1", "state": "serving",
        "registered": 1.5}


def test_a_good_entry_is_a_member():
    assert parse_entry(NAME, entry_key(NAME, ADDR), make_entry(ADDR, 1 << 30, "rack-1",
                                                                "leaving", 2.0)) == \
        Member(ADDR, 1 << 30, "rack-1", "leaving", 2.0)


@pytest.mark.parametrize("change", [
    {"addr": "10.0.0.6:7480"},                  # not the address its key names
    {"addr": "10.0.0.5"}, {"addr": "10.0.0.5:0"}, {"addr": "10.0.0.5:70000"},
    {"addr": "a b:1"}, {"addr": 7480},
    {"capacity": 0}, {"capacity": -1}, {"capacity": "1GiB"}, {"capacity": True},
    {"capacity": 1 << 64}, {"capacity": 1.5},
    {"zone": ""}, {"zone": None}, {"zone": "x" * 256}, {"zone": "a\0b"},
    {"state": "gone"}, {"state": None}, {"registered": "yesterday"},
])
def test_a_bad_field_leaves_the_entry_out(change, caplog):
    value = json.dumps({**GOOD, **change}).encode()
    assert parse_entry(NAME, entry_key(NAME, ADDR), value) is None
    assert "ignoring the bad entry" in caplog.text


@given(st.binary(max_size=600))
def test_any_bytes_are_a_member_or_left_out(value):
    member = parse_entry(NAME, entry_key(NAME, ADDR), value)
    assert member is None or member.addr == ADDR


@given(st.dictionaries(st.sampled_from(sorted(GOOD)), st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=40))))
def test_any_json_is_a_member_or_left_out(fields):
    member = parse_entry(NAME, entry_key(NAME, ADDR), json.dumps({**GOOD, **fields}).encode())
    assert member is None or (member.capacity > 0 and member.state in ("serving", "leaving"))


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers every POST with the server's `body`, whatever was asked."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(self.server.status)
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def fake_etcd():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["kvs", "key", "value", "lease", "ID",
                                                       "TTL", "result", "header", "revision",
                                                       "events", "kv", "created", "type",
                                                       "canceled", "code", "error"]),
                                      inner, max_size=5), max_leaves=20)


@given(st.one_of(st.binary(max_size=300), JSON.map(lambda v: json.dumps(v).encode())),
       st.sampled_from([200, 200, 400, 500]))
def test_any_answer_of_etcd_is_a_result_or_an_etcd_error(fake_etcd, body, status):
    """What an endpoint answers is never trusted: each call returns or
    raises EtcdError, whatever the bytes."""
    fake_etcd.body, fake_etcd.status = body, status
    client = Etcd([f"127.0.0.1:{fake_etcd.server_address[1]}"], timeout_s=5)
    for call in (lambda: client.range_prefix(b"/p/"), lambda: client.grant(5),
                 lambda: client.keepalive(7), lambda: client.time_to_live(7),
                 lambda: client.revoke(7), lambda: client.put(b"k", b"v", 7)):
        try:
            call()
        except EtcdError:
            pass
    try:
        watch = client.watch(b"/p/", 1, idle_s=5)
        try:
            for _ in watch.events():
                pass
        finally:
            watch.close()
    except EtcdError:
        pass


def test_cluster_urls():
    assert parse_cluster("etcd://e1,e2:2380/prod") == (["e1:2379", "e2:2380"], "prod", "")
    assert parse_cluster(CLIENT_SCHEME + "[::1]:2379/a.b-c_d?replicas=2", CLIENT_SCHEME) == \
        (["[::1]:2379"], "a.b-c_d", "replicas=2")
    for bad in ("etcd://e1/", "etcd://e1", "etcd://e1/a/b", "etcd://,e2/x", "etcd://e1:x/x",
                "http://e1/x", "etcd://e1/" + "n" * 65):
        with pytest.raises(ValueError):
            parse_cluster(bad)


CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs")


def test_the_engines_cluster_examples_name_a_cluster():
    """configs/*/ has a cluster example per engine; each URL is a cluster's."""
    with open(os.path.join(CONFIGS, "sglang", "sglang_hicache_cluster.json")) as f:
        urls = [json.load(f)["url"]]
    with open(os.path.join(CONFIGS, "vllm", "kv_transfer_config_cluster.json")) as f:
        urls.append(json.load(f)["kv_connector_extra_config"]["url"])
    with open(os.path.join(CONFIGS, "lmcache", "cluster.yaml")) as f:
        urls += [line.split(": ", 1)[1].strip().strip('"') for line in f
                 if line.strip().startswith("remote_storage_plugin.gdrkv.url")]
    assert len(urls) == 3
    for url in urls:
        endpoints, name, _ = parse_cluster(url, CLIENT_SCHEME)
        assert len(endpoints) == 3 and name == "prefix-cache"
