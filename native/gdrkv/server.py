"""gdrkv.Server: a store server running inside this process, on C threads."""
import threading
import weakref

from ._capi import read_address, read_counters, read_text, set_int_field, start_error
from ._native import ffi, lib
from .errors import E_CLOSED, GdrkvError
from .sizes import parse_size

# hugepages and rdma: try, never, require.
_HUGEPAGES = {"auto": -1, "off": 0, "on": 1}
_ERRLEN = 512


class Server:
    """Serves a DRAM pool of `memory` bytes on `listen` ("host:port"; port 0
    picks a free one) until close(). Use as a context manager.

    hugepages: "auto" (use them when the system has them), "on" (fail
    without them) or "off". pretouch faults the whole pool in at start, so
    the first writes do not pay for page faults. Above high_watermark of the
    pool in use, least recently used objects are evicted down to
    low_watermark. A connection stalled mid-frame for stall_timeout_ms is
    closed, and so is one whose request arrives slower than 1 MiB/s after
    that grace, whose GET values are read slower than lease_timeout_ms + 10
    ms per MiB, or that sends no frame for idle_timeout_ms (clients
    reconnect). max_connections tcp and as many local connections are
    served, at most max_connections_per_peer from one IP address; request
    bodies over max_buffered in all wait for room.

    Local clients reach the pool directly (the shm transport) through the
    unix socket at unix_path: None picks the default for the port
    ($GDRKV_RUNTIME_DIR/<port>.sock, else /tmp/gdrkv-<uid>/<port>.sock), ""
    turns shm off. An shm reader's lease on the objects it copies lasts at
    most lease_timeout_ms. An shm writer copies its values into a staging
    memfd of shm_staging bytes per connection (larger frames, and all with
    0, go on the socket), which the server copies into the pool.
    single_tenant=True lets local clients map the pool writable and copy
    straight into their reservations instead: one copy fewer, for a server
    whose local clients all trust each other (docs/transports.md).

    pool_file: keep the pool in this file (on tmpfs or hugetlbfs) rather
    than in memory that dies with the process: a server started on the file
    an earlier one left (same memory size) serves every object that one
    acknowledged, after a close, a crash or a SIGKILL. A file of another
    size or version is refused unless reset_pool_file=True, which starts it
    empty (docs/operations.md).

    disk ("PATH[,PATH...]" or a list of directories) and disk_size (per
    directory): a disk tier under the pool. Objects the pool evicts go to a
    file in each directory instead of being dropped, EXISTS sees them, and a
    read brings them back into the pool; the files are found again by the
    next server (docs/operations.md). reset_disk=True starts them empty.

    rdma: "auto" serves rdma clients when an RDMA device is there (libibverbs,
    or $GDRKV_IBVERBS_LIB), "on" requires it, "off" never registers the pool.

    auth_token_file: serve only clients that prove they hold the secret in
    this file (mode 0600; docs/protocol.md). A listen address other hosts
    can reach needs one, or insecure_no_auth=True.

    close() drains: no new connections, the frames in flight finish (for at
    most drain_timeout_ms), then every connection is closed.

    busy_poll_us: after an event a network worker polls this long (in
    microseconds) before it sleeps, so a busy client's next frame finds it
    awake; "auto" is 1000 on hosts of 8 CPUs or more and 0 (off) below,
    where the polling worker would take the client's core.

    metrics_listen ("host:port"): serve the counters in the Prometheus text
    format at http://host:port/metrics (metrics() returns the same text).
    """

    def __init__(self, listen="127.0.0.1:0", memory="1GiB", workers=0, hugepages="auto",
                 pretouch=True, high_watermark=0.95, low_watermark=0.90,
                 stall_timeout_ms=30000, max_connections=4096, unix_path=None,
                 lease_timeout_ms=5000, rdma="auto", auth_token_file=None,
                 insecure_no_auth=False, max_connections_per_peer=512,
                 idle_timeout_ms=300000, max_buffered="256MiB", metrics_listen=None,
                 drain_timeout_ms=5000, shm_staging="64MiB", single_tenant=False,
                 pool_file=None, reset_pool_file=False, disk=None, disk_size=None,
                 reset_disk=False, busy_poll_us="auto"):
        if hugepages not in _HUGEPAGES:
            raise ValueError(f"hugepages must be one of {', '.join(_HUGEPAGES)}, not {hugepages!r}")
        if rdma not in _HUGEPAGES:
            raise ValueError(f"rdma must be one of {', '.join(_HUGEPAGES)}, not {rdma!r}")
        opts = ffi.new("gdrkv_server_opts *")
        lib.gdrkv_server_opts_init(opts)
        listen_c = ffi.new("char[]", listen.encode())
        opts.listen = listen_c
        set_int_field(opts, "memory_bytes", parse_size(memory), "memory", minimum=1)
        set_int_field(opts, "workers", workers, "workers")
        if busy_poll_us != "auto":
            set_int_field(opts, "busy_poll_us", busy_poll_us, "busy_poll_us")
        set_int_field(opts, "stall_timeout_ms", stall_timeout_ms, "stall_timeout_ms", minimum=1)
        set_int_field(opts, "max_connections", max_connections, "max_connections", minimum=1)
        set_int_field(opts, "max_connections_per_peer", max_connections_per_peer,
                      "max_connections_per_peer", minimum=1)
        set_int_field(opts, "idle_timeout_ms", idle_timeout_ms, "idle_timeout_ms", minimum=1)
        set_int_field(opts, "drain_timeout_ms", drain_timeout_ms, "drain_timeout_ms")
        set_int_field(opts, "max_buffered_bytes", parse_size(max_buffered), "max_buffered",
                      minimum=8 << 20)
        set_int_field(opts, "lease_timeout_ms", lease_timeout_ms, "lease_timeout_ms", minimum=1)
        set_int_field(opts, "shm_staging_bytes", parse_size(shm_staging), "shm_staging")
        opts.single_tenant = bool(single_tenant)
        if unix_path is not None:
            unix_path_c = ffi.new("char[]", unix_path.encode())
            opts.unix_path = unix_path_c
        if auth_token_file:
            token_file_c = ffi.new("char[]", str(auth_token_file).encode())
            opts.auth_token_file = token_file_c
        opts.insecure_no_auth = bool(insecure_no_auth)
        if pool_file:
            pool_file_c = ffi.new("char[]", str(pool_file).encode())
            opts.pool_file = pool_file_c
        opts.reset_pool_file = bool(reset_pool_file)
        if disk:
            paths = disk.split(",") if isinstance(disk, str) else [str(p) for p in disk]
            disk_c = ffi.new("char[]", ",".join(paths).encode())
            opts.disk = disk_c
        if disk_size is not None:
            set_int_field(opts, "disk_size", parse_size(disk_size), "disk_size", minimum=1)
        opts.reset_disk = bool(reset_disk)
        if metrics_listen:
            metrics_listen_c = ffi.new("char[]", metrics_listen.encode())
            opts.metrics_listen = metrics_listen_c
        opts.hugepages = _HUGEPAGES[hugepages]
        opts.rdma = _HUGEPAGES[rdma]
        opts.pretouch = bool(pretouch)
        opts.high_watermark = high_watermark
        opts.low_watermark = low_watermark

        out = ffi.new("gdrkv_server **")
        err = ffi.new("char[]", _ERRLEN)
        rc = lib.gdrkv_server_start(opts, out, err, _ERRLEN)
        if rc < 0:
            raise start_error(rc, err)
        self._handle = out[0]
        # Stops the C threads even if close() is never called.
        self._stop = weakref.finalize(self, lib.gdrkv_server_stop, self._handle)
        # stats() must not run on a handle close() is freeing.
        self._lock = threading.Lock()
        self.address = read_address(lib.gdrkv_server_address, self._handle)
        self.url = "gdrkv://" + self.address
        # "" when shm is off.
        self.unix_path = read_address(lib.gdrkv_server_unix_path, self._handle)
        # "host:port" of GET /metrics (Prometheus text), "" when off.
        self.metrics_address = read_address(lib.gdrkv_server_metrics_address, self._handle)

    def metrics(self):
        """The counters in the Prometheus text format."""
        with self._lock:
            if not self._stop.alive:
                raise GdrkvError(E_CLOSED)
            return read_text(lib.gdrkv_server_metrics, self._handle)

    def stats(self):
        """The server's counters: {"name": int or float}."""
        with self._lock:
            if not self._stop.alive:
                raise GdrkvError(E_CLOSED)
            return read_counters(lib.gdrkv_server_stats, self._handle)

    def close(self):
        """Stops serving and frees the pool; closing twice is harmless."""
        with self._lock:
            self._stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "open" if self._stop.alive else "closed"
        return f"<gdrkv.Server {self.url} {state}>"
