"""A server's entry in etcd (gdrkv serve --cluster; #40): what it holds and
does not (no secret), its lease (a killed server is gone from the table
within the lease's TTL and etcd's check, a lost lease is taken again), a
graceful leave (leaving, then gone), a three-member etcd losing one, and
`gdrkv cluster status`."""
import json
import signal

import pytest

import gdrkv

from gdrkv.cluster.etcd import Etcd
from gdrkv.cluster.members import prefix

from support.util import run_gdrkv, stat, wait_for
from support.etcd import TTL_MS, addresses

# etcd checks for expired leases every 500 ms; the tables follow at once.
GONE_WITHIN_S = TTL_MS / 1000 + 1.0


def entries(etcd, name):
    """{address: (entry as a dict, raw value, lease)} under the cluster's prefix."""
    found = Etcd(etcd.endpoints.split(",")).range_prefix(prefix(name))[1]
    return {json.loads(value)["addr"]: (json.loads(value), value, lease)
            for key, value, lease in found}


def test_the_entry_says_where_how_big_and_which_zone_and_nothing_secret(
        etcd, cluster_name, start_member, view, tmp_path):
    token = b"5e0d1c7a9b3f4e2d8c6a0b1f3e5d7c9a"
    token_file = tmp_path / "token"
    token_file.write_bytes(token)
    token_file.chmod(0o600)
    server = start_member(0, "--zone", "rack-7", "--auth-token-file", str(token_file),
                          memory="48MiB")
    wait_for(lambda: server.address in addresses(view), 10, "the entry")
    entry, raw, lease = entries(etcd, cluster_name)[server.address]
    assert entry.keys() == {"addr", "capacity", "zone", "state", "registered"}
    assert (entry["addr"], entry["capacity"], entry["zone"], entry["state"]) == \
        (server.address, 48 << 20, "rack-7", "serving")
    assert lease != 0
    assert token not in raw and str(token_file).encode() not in raw
    stats = server.stats()
    assert stat(stats, "cluster_state") == 2          # serving
    assert stat(stats, "cluster_etcd_errors") == 0
    assert stat(stats, "cluster_lease_age_ms") <= TTL_MS


def test_a_wildcard_listener_advertises_this_hosts_address(etcd, cluster_name, start_member,
                                                           view):
    """Listening on 0.0.0.0, the entry names the address of this host on its
    route to etcd (here loopback), with the port bound."""
    server = start_member(0, "--insecure-no-auth", listen="0.0.0.0:0")
    advertised = f"127.0.0.1:{server.port}"
    wait_for(lambda: advertised in addresses(view), 10, "the entry")
    assert entries(etcd, cluster_name)[advertised][0]["addr"] == advertised


def test_an_in_process_server_joins_and_its_metrics_say_so(etcd, cluster_name, view):
    """gdrkv.Server(cluster=...) registers too; /metrics' text shows the
    state, and close() leaves (leaving, then gone) before it stops."""
    with gdrkv.Server(memory="32MiB", pretouch=False, cluster=etcd.url(cluster_name),
                      zone="here", cluster_ttl_ms=TTL_MS, cluster_leave_ms=0) as server:
        wait_for(lambda: server.address in addresses(view), 10, "the entry")
        wait_for(lambda: "gdrkv_cluster_state 2" in server.metrics(), 5, "serving in metrics")
        assert "gdrkv_cluster_etcd_errors_total 0" in server.metrics()
    assert server.address not in addresses(view)


def test_a_killed_member_leaves_the_table_within_the_ttl(start_member, view):
    servers = [start_member(i) for i in range(3)]
    wait_for(lambda: addresses(view) == {s.address for s in servers}, 10, "three members")
    servers[1].kill()
    wait_for(lambda: servers[1].address not in addresses(view), GONE_WITHIN_S,
             "the killed member to leave the table")
    assert addresses(view) == {servers[0].address, servers[2].address}


def test_a_lost_lease_is_taken_again(etcd, cluster_name, start_member, view):
    server = start_member(0)
    wait_for(lambda: server.address in addresses(view), 10, "the entry")
    lease = entries(etcd, cluster_name)[server.address][2]
    Etcd(etcd.endpoints.split(",")).revoke(lease)      # as if it had expired
    wait_for(lambda: server.address not in addresses(view), 5, "the entry to go")
    wait_for(lambda: server.address in addresses(view), TTL_MS / 1000 + 1,
             "the server to register again")
    assert entries(etcd, cluster_name)[server.address][2] not in (0, lease)
    assert stat(server.stats(), "cluster_state") == 2


def test_sigterm_publishes_leaving_then_withdraws(start_member, view):
    server = start_member(0)
    wait_for(lambda: server.address in addresses(view, "serving"), 10, "the entry")
    seen = []
    recorder = _Recorder(seen)
    view.subscribe(recorder.record)
    assert server.stop(signal.SIGTERM) == 0
    assert server.address not in addresses(view)
    states = [state for members in seen for addr, state in members if addr == server.address]
    assert "leaving" in states and states[-1] == "leaving"
    view.unsubscribe(recorder.record)


class _Recorder:
    def __init__(self, seen):
        self.seen = seen

    def record(self, members):
        self.seen.append([(m.addr, m.state) for m in members])


def test_a_server_that_cannot_reach_etcd_serves_and_registers_when_it_can(
        etcd, cluster_name, start_member, view):
    etcd.stop_all()
    server = start_member(0)
    wait_for(lambda: stat(server.stats(), "cluster_etcd_errors") > 0, 10, "etcd errors")
    assert stat(server.stats(), "cluster_state") == 1    # unregistered
    etcd.restart_all()
    wait_for(lambda: server.address in addresses(view), 10, "the entry after etcd's return")
    assert stat(server.stats(), "cluster_state") == 2


def test_a_three_member_etcd_losing_one(tmp_path, cluster_name, start_member):
    from gdrkv.cluster import watcher
    from support.etcd import EtcdCluster
    three = EtcdCluster(str(tmp_path), size=3).start()
    try:
        membership = watcher.shared(three.endpoints.split(","), cluster_name)
        try:
            url = three.url(cluster_name)
            first = start_member(0, cluster=url)
            wait_for(lambda: first.address in addresses(membership), 10, "the first member")
            lease = entries(three, cluster_name)[first.address][2]
            three.members[0].kill()
            second = start_member(1, cluster=url)
            wait_for(lambda: second.address in addresses(membership), 10,
                     "a member joining after the loss")
            # The first one's lease lived through the loss: kept alive by the others.
            assert entries(three, cluster_name)[first.address][2] == lease
            assert stat(first.stats(), "cluster_state") == 2
        finally:
            watcher.release(membership)
    finally:
        three.stop_all()


def test_cluster_status_lists_the_members(etcd, cluster_name, start_member, view):
    servers = [start_member(i, memory=f"{32 * (i + 1)}MiB") for i in range(2)]
    wait_for(lambda: len(addresses(view)) == 2, 10, "two members")
    out = run_gdrkv("cluster", "status", "--json", etcd.url(cluster_name, "gdrkv+etcd"))
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["addr"], r["zone"], r["state"], r["capacity"]) for r in rows] == sorted(
        (s.address, f"z{i}", "serving", (32 * (i + 1)) << 20) for i, s in enumerate(servers))
    for row in rows:
        assert 0 <= row["used"] < 1 and row["hit_ratio"] is None
        assert 0 < row["lease_ttl_s"] <= TTL_MS / 1000 and row["lease_age_s"] >= 0
    table = run_gdrkv("cluster", "status", etcd.url(cluster_name, "gdrkv+etcd"))
    assert table.returncode == 0 and all(s.address in table.stdout for s in servers)


@pytest.mark.parametrize("options, message", [
    (dict(cluster_ttl_ms=1500), "cluster_ttl_ms must be whole seconds, at least 2000"),
    (dict(cluster_ttl_ms=2500), "cluster_ttl_ms must be whole seconds, at least 2000"),
    (dict(cluster_leave_ms=700000), "cluster_leave_ms must be at most 600000"),
    (dict(zone="x" * 256), "zone must be 1 to 255 bytes"),
    (dict(cluster=None, advertise="10.0.0.1:7480"), "advertise and zone need a cluster"),
    (dict(cluster="etcd://127.0.0.1:1/"), "needs a name"),
    (dict(cluster="http://127.0.0.1:1/x"), "not a cluster URL"),
    (dict(advertise="10.0.0.1"), "advertise must be host:port"),
])
def test_bad_cluster_options_are_refused_by_name(options, message):
    settings = {"memory": "16MiB", "pretouch": False, "cluster": "etcd://127.0.0.1:1/x",
                **options}
    with pytest.raises(ValueError, match=message):
        gdrkv.Server(**settings)
