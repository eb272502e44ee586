"""Real etcd servers for the cluster tests: EtcdCluster starts one or three
members on free loopback ports in a temporary directory, each killed with
the test run (setpriv --pdeathsig, as support/servers.py does for gdrkv
servers). A member can be stopped (SIGKILL) and started again on the same
ports and data, as an outage and its end."""
import os
import shutil
import socket
import subprocess
import time

from support.servers import DIE_WITH_PARENT, STOP_TIMEOUT_S
from support.util import unique, wait_for

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
START_TIMEOUT_S = 30.0
# The members' leases in the tests: short, so that a lost member is gone
# within seconds; and how long a stopping one says "leaving".
TTL_MS = 2000
LEAVE_MS = 500


def wait_members(cluster, name, servers, timeout=10):
    """Waits until etcd holds an entry of each of servers in cluster name,
    so that a client opened next finds them all."""
    from gdrkv.cluster.etcd import Etcd
    from gdrkv.cluster.members import prefix
    client = Etcd(cluster.endpoints.split(","))
    wanted = {s.address for s in servers}
    wait_for(lambda: wanted <= {key.decode().rsplit("/", 1)[1]
                                for key, _, _ in client.range_prefix(prefix(name))[1]},
             timeout, f"{len(wanted)} members in etcd")


def addresses(membership, state=None):
    """The addresses in a Membership's table (of members in state)."""
    return {m.addr for m in membership.members() if state in (None, m.state)}


def free_ports(n):
    """n ports free now on 127.0.0.1 (bound together, so distinct)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_ready(members):
    """Waits until each etcd member answers a write."""
    from gdrkv.cluster.etcd import Etcd, EtcdError
    deadline = time.monotonic() + START_TIMEOUT_S
    for member in members:
        client = Etcd([member.endpoint], timeout_s=1.0)
        while True:
            try:
                client.put(b"/ready", b"1")
                break
            except EtcdError:
                if not member.alive or time.monotonic() > deadline:
                    raise RuntimeError(f"etcd {member.name} did not start:\n"
                                       f"{member.log_tail()}") from None
                time.sleep(0.05)


class EtcdMember:
    def __init__(self, workdir, name, client_port, peer_port, initial_cluster):
        self.name, self.workdir = name, workdir
        self.client_port, self.peer_port = client_port, peer_port
        self.initial_cluster = initial_cluster
        self.data_dir = os.path.join(workdir, name + ".etcd")
        self.log_path = os.path.join(workdir, name + ".etcd.log")
        self.proc = None

    @property
    def endpoint(self):
        return f"127.0.0.1:{self.client_port}"

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self):
        client = f"http://{self.endpoint}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [ETCD, "--name", self.name, "--data-dir", self.data_dir,
               "--listen-client-urls", client, "--advertise-client-urls", client,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", self.initial_cluster,
               "--initial-cluster-token", self.name.rsplit("-", 1)[0],
               "--initial-cluster-state", "new", "--log-outputs", "stderr",
               # Small and quick: heartbeats and elections on loopback.
               "--heartbeat-interval", "50", "--election-timeout", "500",
               "--quota-backend-bytes", str(64 << 20)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(DIE_WITH_PARENT + cmd, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log)
        return self

    def kill(self):
        if self.alive:
            self.proc.kill()
        if self.proc:
            self.proc.wait(STOP_TIMEOUT_S)

    def log_tail(self, nbytes=3000):
        with open(self.log_path, "rb") as f:
            return f.read()[-nbytes:].decode(errors="replace")


class EtcdCluster:
    """size members (1 or 3); endpoints: "127.0.0.1:P1,127.0.0.1:P2,..."."""

    def __init__(self, workdir, size=1):
        token = unique("etcd")
        ports = free_ports(2 * size)
        names = [f"{token}-{i}" for i in range(size)]
        initial = ",".join(f"{n}=http://127.0.0.1:{ports[2 * i + 1]}"
                           for i, n in enumerate(names))
        self.members = [EtcdMember(workdir, n, ports[2 * i], ports[2 * i + 1], initial)
                        for i, n in enumerate(names)]

    @property
    def endpoints(self):
        return ",".join(m.endpoint for m in self.members)

    def url(self, name, scheme="etcd"):
        return f"{scheme}://{self.endpoints}/{name}"

    def start(self):
        for member in self.members:
            member.start()
        self.wait_ready()
        return self

    def wait_ready(self, members=None):
        """Waits until each of members (default all) answers a write."""
        wait_ready(members or self.members)

    def stop_all(self):
        for member in self.members:
            member.kill()

    def restart_all(self):
        """Starts every stopped member again on its ports and data (etcd
        reads its membership from the data, ignoring --initial-*)."""
        for member in self.members:
            if not member.alive:
                member.start()
        self.wait_ready()
