"""A server's entry in its cluster (gdrkv serve --cluster etcd://E1,E2/NAME):
a thread keeps it in etcd on a lease of ttl seconds, renewed every third
of it. When the lease is lost (etcd says so, or no renewal got through
for a whole ttl) a new one is granted and the entry written again as soon
as etcd answers. leave() publishes "leaving", waits, then revokes the
lease, which deletes the entry at once.

Every change of state and every failed etcd request is reported through
report(state, lease_renewed_ns, etcd_errors), which the server shows in
its stats and /metrics.
"""
import logging
import socket
import threading
import time

from .etcd import Etcd, EtcdError
from .members import entry_key, make_entry, parse_cluster

log = logging.getLogger("gdrkv.cluster")

# enum gdrkv_cluster_state (gdrkv.h).
UNREGISTERED, SERVING, LEAVING = 1, 2, 3
# How often a server without a lease asks etcd again.
_RETRY_S = 0.25
_LOG_EVERY_S = 10.0


def default_advertise(listen_address, endpoints):
    """listen_address ("host:port" as bound), or, when it is a wildcard,
    this host's address on the route to the first etcd endpoint."""
    host, _, port = listen_address.rpartition(":")
    if host.strip("[]") not in ("0.0.0.0", "::", ""):
        return listen_address
    etcd_host, _, etcd_port = endpoints[0].rpartition(":")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((etcd_host.strip("[]"), int(etcd_port)))     # sends nothing
            return f"{probe.getsockname()[0]}:{port}"
    except OSError:
        return f"{socket.gethostbyname(socket.gethostname())}:{port}"


class Registration:
    def __init__(self, cluster, advertise, capacity, zone, ttl_ms, report):
        endpoints, self.name, query = parse_cluster(cluster)
        if query:
            raise ValueError(f"cluster {cluster!r}: no options are taken after '?'")
        self.ttl_s = max(1, ttl_ms // 1000)
        # A request to one endpoint may take a third of the renewal period.
        self.etcd = Etcd(endpoints, timeout_s=max(0.2, self.ttl_s / 9))
        self.advertise = advertise or default_advertise("", endpoints)
        self.capacity, self.zone = capacity, zone or socket.gethostname()
        self.registered = 0.0           # when the entry was put on its lease
        self.key = entry_key(self.name, self.advertise)
        self._report = report
        self._state = UNREGISTERED
        self._lease = 0
        self._renewed_ns = 0
        self.etcd_errors = 0
        self._last_log = 0.0
        self._lock = threading.Lock()        # _lease and _state, between thread and leave()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._publish()
        self._thread = threading.Thread(target=self._run, name=f"gdrkv-cluster-{self.name}",
                                        daemon=True)
        self._thread.start()

    def entry(self, state):
        return make_entry(self.advertise, self.capacity, self.zone,
                          "leaving" if state == LEAVING else "serving", self.registered)

    def _publish(self):
        self._report(self._state, self._renewed_ns, self.etcd_errors)

    def _failed(self, what, error):
        self.etcd_errors += 1
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY_S:
            self._last_log = now
            log.warning("gdrkv cluster %s: %s: %s (%d etcd errors so far)", self.name, what,
                        error, self.etcd_errors)
        self._publish()

    def _register(self):
        lease = self.etcd.grant(self.ttl_s)
        with self._lock:
            self.registered = time.time()
            state = LEAVING if self._state == LEAVING else SERVING
            self.etcd.put(self.key, self.entry(state), lease)
            self._lease, self._state = lease, state
            self._renewed_ns = time.monotonic_ns()
        log.info("gdrkv cluster %s: registered %s (lease %x, ttl %d s)", self.name,
                 self.advertise, lease, self.ttl_s)

    def _renew(self):
        ttl = self.etcd.keepalive(self._lease)
        with self._lock:
            if ttl > 0:
                self._renewed_ns = time.monotonic_ns()
            else:
                self._lost("etcd no longer knows it")

    def _lost(self, why):
        log.warning("gdrkv cluster %s: lease %x lost (%s); registering again", self.name,
                    self._lease, why)
        self._lease = 0
        if self._state == SERVING:
            self._state = UNREGISTERED

    def _run(self):
        while not self._stop.is_set():
            try:
                if self._lease:
                    self._renew()
                else:
                    self._register()
            except Exception as e:      # etcd's failures; a bug too must not stop the thread
                if not isinstance(e, (EtcdError, OSError)):
                    log.exception("gdrkv cluster %s: keeping the entry", self.name)
                self._failed("keeping the lease" if self._lease else "registering", e)
                expired = time.monotonic_ns() - self._renewed_ns > self.ttl_s * 1e9
                with self._lock:
                    if self._lease and expired:
                        self._lost(f"not renewed for {self.ttl_s} s")
            self._publish()
            self._wake.wait(self.ttl_s / 3 if self._lease else _RETRY_S)
            self._wake.clear()

    def leave(self, leave_s):
        """Publishes "leaving" (clients stop sending PUTs, reads go on), waits
        leave_s, then revokes the lease: the entry is gone from every
        client's table at once. Bounded: each etcd request by its timeout."""
        with self._lock:
            self._state = LEAVING
            lease = self._lease
        self._publish()
        if lease:
            try:
                self.etcd.put(self.key, self.entry(LEAVING), lease)
                self._stop.wait(leave_s)
            except EtcdError as e:
                self._failed("publishing leaving", e)
        self.close()

    def close(self):
        """Stops renewing and revokes the lease (its entry goes with it)."""
        self._stop.set()
        self._wake.set()
        self._thread.join()
        if self._lease:
            try:
                self.etcd.revoke(self._lease)
            except EtcdError as e:
                self._failed("revoking the lease", e)
            self._lease = 0
