"""The cluster tests' fixtures: a real etcd (support/etcd.py) per test,
`gdrkv serve --cluster` members of a cluster named for the test, each on
a loopback address of its own, and a Membership (the clients' view of the
cluster) to watch what every client's table holds."""
import pytest

from gdrkv.cluster import watcher
from support.etcd import LEAVE_MS, TTL_MS, EtcdCluster
from support.util import unique


@pytest.fixture
def etcd(tmp_path):
    cluster = EtcdCluster(str(tmp_path)).start()
    yield cluster
    cluster.stop_all()


@pytest.fixture
def cluster_name():
    return unique("c")


@pytest.fixture
def start_member(server_factory, etcd, cluster_name):
    """start_member(i, *args) -> a `gdrkv serve` on 127.0.0.<i+2> in the
    cluster (zone "z<i>" unless args give one)."""
    def start(i, *args, memory="64MiB", cluster=None):
        zone = [] if "--zone" in args else ["--zone", f"z{i}"]
        return server_factory(memory, args=[
            "--cluster", cluster or etcd.url(cluster_name), "--cluster-ttl-ms", str(TTL_MS),
            "--cluster-leave-ms", str(LEAVE_MS), *zone, *args], listen=f"127.0.0.{i + 2}:0")
    return start


@pytest.fixture
def view(etcd, cluster_name):
    """The process's Membership of the test's cluster."""
    membership = watcher.shared(etcd.endpoints.split(","), cluster_name)
    yield membership
    watcher.release(membership)
