"""Clients of gdrkv+etcd://E1,E2/NAME follow the members in etcd (#40):
they find them at open (or later, when etcd was away), drop a killed one
within the lease's TTL, send a leaving one no PUTs and fail no call while
it goes, and ride out an etcd outage under load without a failed call;
`gdrkv stat` takes the URL too."""
import json
import signal
import threading
import time

import numpy as np
import pytest

import gdrkv
from gdrkv import errors

from support.etcd import TTL_MS, addresses
from support.util import background, run_gdrkv, stat, wait_for

GONE_WITHIN_S = TTL_MS / 1000 + 1.0
VALUE = 4096
# How long etcd stays away under load.
OUTAGE_S = 30.0


def table(client):
    """The addresses in the client's own server table."""
    return set(client.stats()["servers"])


class Load:
    """Puts fresh keys and reads back earlier ones in a loop until stop is
    set; every result that is neither stored, read nor a miss is kept in
    failures, as (op, key, code)."""

    def __init__(self, client, stop):
        self.client, self.stop = client, stop
        self.failures, self.misses = [], 0
        self.puts = self.gets = 0
        self.stored = []
        self.out = np.zeros(VALUE, np.uint8)
        self.src = np.full(VALUE, 7, np.uint8)
        self.src_ptr = client.register(self.src)[0]
        self.out_ptr = client.register(self.out)[0]

    def run(self):
        i = 0
        while not self.stop.is_set():
            keys = [f"load-{i + j}" for j in range(8)]
            i += 8
            for key, r in zip(keys, self.client.batch_put(keys, [self.src_ptr] * 8,
                                                          [VALUE] * 8)):
                if r < 0:
                    self.failures.append(("put", key, r))
                else:
                    self.stored.append(key)
            self.puts += len(keys)
            for key in self.stored[-64::8]:
                r = self.client.batch_get([key], [self.out_ptr], [VALUE])[0]
                self.gets += 1
                if r == errors.E_NOT_FOUND:
                    self.misses += 1
                elif r != VALUE:
                    self.failures.append(("get", key, r))

    def wait_progress(self, calls, what):
        target = self.puts + calls
        wait_for(lambda: self.puts >= target or self.failures, 30, what)


def test_a_client_finds_the_members_and_follows_joins_and_kills(etcd, cluster_name,
                                                                start_member, make_client):
    servers = [start_member(i) for i in range(2)]
    url = etcd.url(cluster_name, "gdrkv+etcd")
    wait_for(lambda: table(make_client(url, connect_timeout_ms=2000)) ==
             {s.address for s in servers}, 10, "a client opened with both members")
    client = make_client(url + "?replicas=2")
    assert table(client) == {s.address for s in servers}
    third = start_member(2)
    wait_for(lambda: third.address in table(client), 10, "the joining member")
    keys = [f"k{i}" for i in range(30)]
    for key in keys:
        client.put(key, key.encode() * 100)
    servers[0].kill()
    wait_for(lambda: servers[0].address not in table(client), GONE_WITHIN_S,
             "the killed member to leave the client's table")
    # Each key's second copy: the survivors keep their order of preference.
    assert [client.get(key) for key in keys] == [key.encode() * 100 for key in keys]
    counters = client.stats()["client"]
    assert stat(counters, "membership_changes") >= 3 and stat(counters, "etcd_errors") == 0


def test_a_client_opened_while_etcd_is_away_gets_the_members_when_it_returns(
        etcd, cluster_name, start_member, make_client):
    server = start_member(0)
    etcd.stop_all()
    client = make_client(etcd.url(cluster_name, "gdrkv+etcd"))
    assert table(client) == set()
    assert client.batch_put(["k"], [0], [0]) == [errors.E_UNAVAILABLE]
    etcd.restart_all()
    wait_for(lambda: table(client) == {server.address}, 10, "the members after etcd's return")
    client.put("k", b"x")
    assert client.get("k") == b"x"
    assert stat(client.stats()["client"], "etcd_errors") > 0


def test_a_leaving_member_takes_no_puts_and_no_call_fails(etcd, cluster_name, start_member,
                                                         make_client, view):
    servers = [start_member(i) for i in range(3)]
    leaving = servers[1]
    leaving.args += ["--cluster-leave-ms", "3000"]      # time for many puts while leaving
    leaving.stop()
    leaving.start(leaving.address)
    client = make_client(etcd.url(cluster_name, "gdrkv+etcd") + "?replicas=2")
    wait_for(lambda: len(table(client)) == 3, 10, "three members")
    seen_leaving = threading.Event()

    class Watch:
        def record(self, members):              # called after the client's own update
            if any(m.addr == leaving.address and m.leaving for m in members):
                seen_leaving.set()
    watch = Watch()
    view.subscribe(watch.record)
    stop = threading.Event()
    load = Load(client, stop)
    with background(load.run, stop=stop):
        load.wait_progress(200, "puts before the leave")
        leaving.proc.send_signal(signal.SIGTERM)
        wait_for(seen_leaving.is_set, 10, "the member to say it is leaving")
        puts_then = stat(leaving.stats(), "puts")
        load.wait_progress(200, "puts while it leaves")
        assert stat(leaving.stats(), "puts") == puts_then
        wait_for(lambda: leaving.address not in table(client), 10, "the member to be gone")
        load.wait_progress(200, "puts after the leave")
    assert leaving.stop() == 0
    view.unsubscribe(watch.record)
    assert load.failures == [] and load.misses == 0


def test_etcd_away_under_load_fails_no_call_and_membership_resumes(
        etcd, cluster_name, start_member, make_client):
    servers = [start_member(i) for i in range(3)]
    client = make_client(etcd.url(cluster_name, "gdrkv+etcd") + "?replicas=2")
    wait_for(lambda: len(table(client)) == 3, 10, "three members")
    stop = threading.Event()
    load = Load(client, stop)
    with background(load.run, stop=stop):
        load.wait_progress(100, "puts before the outage")
        etcd.stop_all()
        outage_end = time.monotonic() + OUTAGE_S
        wait_for(lambda: time.monotonic() > outage_end or load.failures, OUTAGE_S + 5,
                 "the outage to end")
        assert table(client) == {s.address for s in servers}
        puts_during = load.puts
        etcd.restart_all()
        joining = start_member(3)
        wait_for(lambda: joining.address in table(client), 10,
                 "a member joining after etcd's return")
        servers[2].kill()
        wait_for(lambda: servers[2].address not in table(client), GONE_WITHIN_S + TTL_MS / 1000,
                 "a killed member to leave after etcd's return")
        load.wait_progress(100, "puts after the outage")
    assert load.failures == []
    assert puts_during > 100
    assert stat(client.stats()["client"], "etcd_errors") > 0


def test_a_three_member_etcd_losing_one_keeps_clients_following(tmp_path, cluster_name,
                                                                start_member, make_client):
    from support.etcd import EtcdCluster
    three = EtcdCluster(str(tmp_path), size=3).start()
    try:
        url = three.url(cluster_name)
        first = start_member(0, cluster=url)
        client = make_client(three.url(cluster_name, "gdrkv+etcd"))
        wait_for(lambda: table(client) == {first.address}, 10, "the first member")
        three.members[0].kill()
        second = start_member(1, cluster=url)
        wait_for(lambda: table(client) == {first.address, second.address}, 10,
                 "a member joining after etcd lost one of three")
        first.kill()
        wait_for(lambda: table(client) == {second.address}, GONE_WITHIN_S,
                 "a killed member to leave")
    finally:
        three.stop_all()


def test_gdrkv_stat_takes_a_cluster_url(etcd, cluster_name, start_member, view):
    servers = [start_member(i) for i in range(2)]
    wait_for(lambda: len(addresses(view)) == 2, 10, "two members")
    out = run_gdrkv("stat", "--json", etcd.url(cluster_name, "gdrkv+etcd"))
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)
    assert set(stats["servers"]) == {s.address for s in servers}
    assert stats["client"]["etcd_errors"] == 0


@pytest.mark.parametrize("bad", ["gdrkv+etcd://127.0.0.1:1/", "gdrkv+etcd://127.0.0.1:1/a/b",
                                 "gdrkv+etcd://127.0.0.1:1/a?replicas=x",
                                 "gdrkv+etcd://127.0.0.1:1/a?nope=1"])
def test_bad_cluster_urls_are_refused_by_name(bad):
    with pytest.raises(ValueError):
        gdrkv.Client(bad)
