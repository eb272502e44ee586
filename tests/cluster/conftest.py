"""The cluster tests' own fixture: a Membership (the clients' view of the
test's cluster) to watch what every client's table holds. etcd,
cluster_name and start_member are in tests/conftest.py."""
import pytest

from gdrkv.cluster import watcher


@pytest.fixture
def view(etcd, cluster_name):
    """The process's Membership of the test's cluster."""
    membership = watcher.shared(etcd.endpoints.split(","), cluster_name)
    yield membership
    watcher.release(membership)
