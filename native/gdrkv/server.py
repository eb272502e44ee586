"""gdrkv.Server: a store server running inside this process, on C threads.

OPTIONS describes its keywords, taken from the C library's options table
(native/server/server_options.c), which `gdrkv serve`'s flags, its TOML
file and --print-config are made from too: a keyword left at None keeps
the C default shown there."""
import threading
import weakref
from typing import NamedTuple

from ._capi import read_address, read_counters, read_text, set_int_field, start_error
from ._native import ffi, lib
from .errors import E_CLOSED, GdrkvError
from .sizes import format_size, parse_size

# The "mode" kind: try, never, require.
MODES = {"auto": -1, "off": 0, "on": 1}
_ERRLEN = 512


class Option(NamedTuple):
    """One server option: name is the keyword and TOML key, field its
    gdrkv_server_opts field, kind how its value is written (gdrkv.h, struct
    gdrkv_server_option), default the C default as it is written in a TOML
    file (None: none)."""
    name: str
    field: str
    kind: str
    help: str
    default: object


def _default(kind, value):
    """A field of a fresh gdrkv_server_opts as it is written in TOML."""
    if kind == "text":
        return ffi.string(value).decode() if value != ffi.NULL else None
    if kind == "flag":
        return bool(value)
    if kind == "mode":
        return {code: word for word, code in MODES.items()}[value]
    if kind == "int_or_auto" and value == -1:
        return "auto"
    if kind == "size":
        # Whole units read best ("256MiB"); 0 bytes is no size at all.
        return (format_size(value) if parse_size(format_size(value)) == value else value) \
            if value else None
    return value


def _options():
    defaults = ffi.new("gdrkv_server_opts *")
    lib.gdrkv_server_opts_init(defaults)
    options = {}
    i = 0
    while (entry := lib.gdrkv_server_option_at(i)) != ffi.NULL:
        name, field, kind, help_text = (ffi.string(text).decode() for text in
                                        (entry.name, entry.field, entry.kind, entry.help))
        options[name] = Option(name, field, kind, help_text,
                               _default(kind, getattr(defaults, field)))
        i += 1
    return options


OPTIONS = _options()


def _set(opts, option, value, keep):
    """opts.<field> = value, written the way the option's kind is; C strings
    go into keep, which must outlive opts."""
    name, field, kind = option.name, option.field, option.kind
    if kind == "text":
        if isinstance(value, (list, tuple)):
            value = ",".join(str(part) for part in value)
        keep.append(ffi.new("char[]", str(value).encode()))
        setattr(opts, field, keep[-1])
    elif kind == "flag":
        setattr(opts, field, bool(value))
    elif kind == "mode":
        if value not in MODES:
            raise ValueError(f"{name} must be one of {', '.join(MODES)}, not {value!r}")
        setattr(opts, field, MODES[value])
    elif kind == "ratio":
        setattr(opts, field, float(value))
    else:
        if kind == "size":
            value = parse_size(value)
        elif kind == "int_or_auto" and value == "auto":
            value = -1
        set_int_field(opts, field, value, name, minimum=None)


class Server:
    """Serves a DRAM pool of `memory` bytes on `listen` ("host:port"; port 0,
    the default here, picks a free one) until close(). Use as a context
    manager. Every keyword is one of OPTIONS (`gdrkv serve --help` lists
    them with their defaults); one left out or None keeps the C default.

    workers network threads serve the connections (0: one per CPU, at
    most 16).

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
    bodies over max_buffered in all wait for room. What one peer's reads
    hold pinned at a time (tcp GET values being sent, shm and rdma leases;
    a peer is an IP address, or a local process) is at most peer_pin_share
    of the pool: keys past it are answered E_BUSY (docs/protocol.md).

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
    disk_full_policy: "throttle" (the default) slows a writer that finds the
    pool full of objects not on disk yet to the disk's speed, for up to
    disk_full_wait_ms, so nothing acknowledged is dropped while the disk has
    room; "drop" evicts them instead.

    rdma: "auto" serves rdma clients when an RDMA device is there (libibverbs,
    or $GDRKV_IBVERBS_LIB), "on" requires it, "off" never registers the pool.

    auth_token_file: serve only clients that prove they hold the secret in
    this file (mode 0600; docs/protocol.md). A listen address other hosts
    can reach needs one, or insecure_no_auth=True. Until it authenticates
    a tcp connection holds none of max_connections but one of
    max_unauthenticated (at most max_unauthenticated_per_peer from one IP
    address; when they are full the address with most gives up its oldest),
    and is closed auth_timeout_ms after it opened.

    close() drains: no new connections, the frames in flight finish (for at
    most drain_timeout_ms), then every connection is closed.

    busy_poll_us: after an event a network worker polls this long (in
    microseconds) before it sleeps, so a busy client's next frame finds it
    awake; "auto" is 1000 on hosts of 8 CPUs or more and 0 (off) below,
    where the polling worker would take the client's core.

    metrics_listen ("host:port", or a port alone for 127.0.0.1): serve the
    counters in the Prometheus text format at http://host:port/metrics
    (metrics() returns the same text). metrics_token_file: answer only
    requests carrying "Authorization: Bearer" and the secret in this file
    (mode 0600; Prometheus' authorization credentials_file), 401 others.
    metrics_namespaces: the namespaces with most bytes that get series of
    their own; the others are summed in gdrkv_namespace_others_*.

    cluster ("etcd://H1:2379[,H2:2379...]/NAME"): keep an entry for this
    server in that etcd (gdrkv.cluster.registration; docs/operations.md,
    "Cluster"): advertise ("host:port" clients reach it on; default the
    listen address), its pool size as capacity, zone (its failure domain;
    default the host name) and its state, on a lease of cluster_ttl_ms.
    close() then first publishes "leaving" for cluster_leave_ms (reads go
    on, PUTs go elsewhere), withdraws the entry, then drains.
    """

    def __init__(self, listen="127.0.0.1:0", **options):
        opts = ffi.new("gdrkv_server_opts *")
        lib.gdrkv_server_opts_init(opts)
        keep = []
        for name, value in {"listen": listen, **options}.items():
            if name not in OPTIONS:
                raise TypeError(f"Server() got an unexpected keyword argument {name!r}")
            if value is not None:
                _set(opts, OPTIONS[name], value, keep)

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
        self._registration = None
        if options.get("cluster"):
            self._join(opts, options)

    def _join(self, opts, options):
        from .cluster.registration import Registration, default_advertise
        from .cluster.etcd import EtcdError
        from .cluster.members import parse_cluster, valid_addr

        def report(state, lease_renewed_ns, etcd_errors):
            with self._lock:
                if self._stop.alive:
                    lib.gdrkv_server_set_cluster(self._handle, state, lease_renewed_ns,
                                                 etcd_errors)
        try:
            endpoints = parse_cluster(options["cluster"])[0]
            advertise = options.get("advertise") or default_advertise(self.address, endpoints)
            if not valid_addr(advertise):
                raise ValueError(f"advertise must be host:port, not {advertise!r}")
            self._registration = Registration(options["cluster"], advertise,
                                              opts.memory_bytes, options.get("zone"),
                                              opts.cluster_ttl_ms, report)
        except (ValueError, EtcdError):
            self._stop()
            raise
        self._leave_s = opts.cluster_leave_ms / 1000

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
        """Stops serving and frees the pool; closing twice is harmless. In a
        cluster it first leaves it (see the class's doc)."""
        registration, self._registration = self._registration, None
        if registration:
            registration.leave(self._leave_s)
        with self._lock:
            self._stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "open" if self._stop.alive else "closed"
        return f"<gdrkv.Server {self.url} {state}>"
