"""The fixtures every area shares: real `gdrkv serve` processes, clients,
fake servers, and a guard against a test that hangs. Helpers that tests
import are in support/; each area's own fixtures are in its conftest.py."""
import faulthandler
import os
import tempfile

import pytest
from hypothesis import HealthCheck, settings

import gdrkv
# First: it points GDRKV_IBVERBS_LIB at softverbs before anything loads libibverbs.
import support.softverbs  # noqa: F401
from support.etcd import LEAVE_MS, TTL_MS, EtcdCluster
from support.servers import FakeServer, ServerSet
from support.util import TESTS_DIR, unique

# Children (servers, `gdrkv` commands, scripts of the tests) import support too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (TESTS_DIR, os.environ.get("PYTHONPATH")) if p)

settings.register_profile(
    "gdrkv",
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.function_scoped_fixture],
)
settings.load_profile("gdrkv")

TEST_TIMEOUT_S = 400.0          # above the slowest test (a native item's 300 s)


# Where the hang guard writes the stacks: pytest captures fd 2, and a
# process that exits from the guard never hands the capture back, so
# tests/run.sh prints this file when a pass fails.
HANG_LOG = open(os.path.join(tempfile.gettempdir(), f"gdrkv-hang-{os.getpid()}.log"), "w")


@pytest.fixture(autouse=True)
def hang_guard():
    """A call that never returns ends the run with every thread's stack
    instead of blocking CI forever (the servers die with it: see
    DIE_WITH_PARENT)."""
    faulthandler.dump_traceback_later(TEST_TIMEOUT_S, exit=True, file=HANG_LOG)
    yield
    faulthandler.cancel_dump_traceback_later()


def pytest_runtest_setup(item):
    """The pool-file pass (GDRKV_TEST_POOL_FILE=1) skips what holds only over
    a memfd pool, saying why."""
    mark = item.get_closest_marker("memfd_pool")
    if mark and os.environ.get("GDRKV_TEST_POOL_FILE") == "1":
        pytest.skip(f"memfd pool only: {mark.args[0]}")


# ---------------------------------------------------------------- servers

@pytest.fixture
def server_factory(tmp_path):
    """start(memory=..., args=[...]) -> ServerProcess; all are stopped with
    SIGTERM at teardown and must exit 0 (unless the test killed them)."""
    servers = ServerSet(str(tmp_path))
    yield servers.start
    servers.stop_all()


@pytest.fixture(scope="module")
def server(tmp_path_factory, request):
    """One server process per module; a module sets SERVER_MEMORY and
    SERVER_ARGS to change how it is started."""
    servers = ServerSet(str(tmp_path_factory.mktemp("servers")))
    memory = getattr(request.module, "SERVER_MEMORY", "128MiB")
    yield servers.start(memory, getattr(request.module, "SERVER_ARGS", ()))
    servers.stop_all()


@pytest.fixture
def make_client():
    """Client factory; every client is closed at teardown."""
    clients = []

    def make(url, **options):
        client = gdrkv.Client(url, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def client(server, make_client):
    """A client of the module's server in a namespace of its own, so tests
    sharing the server never see each other's keys."""
    return make_client(server.url, namespace=unique("ns"))


# ---------------------------------------------------------------- clusters

@pytest.fixture
def etcd(tmp_path):
    """A real one-member etcd of this test (support/etcd.py)."""
    cluster = EtcdCluster(str(tmp_path)).start()
    yield cluster
    cluster.stop_all()


@pytest.fixture
def cluster_name():
    return unique("c")


@pytest.fixture
def start_member(server_factory, etcd, cluster_name):
    """start_member(i, *args, memory=..., cluster=URL, listen=...) -> a
    `gdrkv serve` on 127.0.0.<i+2> (or listen) in the test's cluster (or
    cluster), with short leases
    and zone "z<i>" unless args give one. Its clients: etcd.url(cluster_name,
    "gdrkv+etcd")."""
    def start(i, *args, memory="64MiB", cluster=None, listen=None):
        zone = [] if "--zone" in args else ["--zone", f"z{i}"]
        return server_factory(memory, args=[
            "--cluster", cluster or etcd.url(cluster_name), "--cluster-ttl-ms", str(TTL_MS),
            "--cluster-leave-ms", str(LEAVE_MS), *zone, *args],
            listen=listen or f"127.0.0.{i + 2}:0")
    return start


# ---------------------------------------------------------------- fake servers

@pytest.fixture
def fake_server():
    """fake_server(behaviour) -> FakeServer, closed at teardown."""
    servers = []

    def start(behaviour):
        servers.append(FakeServer(behaviour))
        return servers[-1]

    yield start
    for server in servers:
        server.close()
