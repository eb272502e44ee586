"""gdrkv.Client: batched transfers between caller memory and gdrkv servers.

Python only marshals arguments into flat arrays; the C client routes keys to
servers and moves the bytes, with the GIL released for the whole call.
"""
import threading
import weakref
from array import array
from urllib.parse import parse_qsl, urlsplit

from . import local
from .cluster.members import CLIENT_SCHEME, parse_cluster
from ._capi import read_address, read_counters, read_text, set_int_field, start_error
from ._native import ffi, lib
from .errors import E_CLOSED, E_NOT_FOUND, GdrkvError, check, strerror
from .sizes import parse_size

DEFAULT_PORT = 7480
_UNIX_URL = "gdrkv://unix:"
_MAX_NAMESPACE = 255
_ERRLEN = 512

# Integer options: default and smallest valid value.
_INT_OPTIONS = {
    "timeout_ms": (5000, 1),
    "connect_timeout_ms": (1000, 1),
    "conns": (4, 1),
    "backoff_min_ms": (100, 0),
    "backoff_max_ms": (5000, 0),
    "gpu_pin_limit": (0, 0),
    "gpu_pin_ahead": (0, 0),
    "replicas": (1, 1),
    "settle_ms": (10000, 0),
}
# Most copies of a key (PLACEMENT_MAX_REPLICAS in native/client/placement.h).
_MAX_REPLICAS = 8
# Of those, the ones that are sizes: "64GiB" as well as bytes.
_SIZE_OPTIONS = ("gpu_pin_limit", "gpu_pin_ahead")
# Transport names and their enum gdrkv_transport values.
_TRANSPORTS = {"auto": 0, "tcp": 1, "shm": 2, "rdma": 3}
# gpu_copy names and their enum gdrkv_gpu_copy values.
_GPU_COPY = {"auto": 0, "kernel": 1, "copy_engine": 2}
_OPTIONS = ("namespace", "transport", "gpu_copy", "token_file", *_INT_OPTIONS)


class Client:
    """A connection to one or more gdrkv servers.

    url is gdrkv://host:port[,host:port...][?option=value&...],
    gdrkv://unix:/path/to/server.sock for a local server's socket,
    gdrkv://local[:port] for this machine's daemon, started on first use
    (gdrkv.local), or gdrkv+etcd://E1:2379[,E2:2379...]/NAME[?...] for the
    members of cluster NAME in that etcd, followed as they come and go
    (gdrkv.cluster.watcher; docs/operations.md, "Cluster"); keyword
    arguments override the URL's options. Options: namespace (""),
    timeout_ms (5000, bounds every call), connect_timeout_ms (1000), conns
    (4 connections per server), transport ("auto": shm to a server on this
    host whose unix socket answers, tcp otherwise; "tcp"; or "shm"),
    backoff_min_ms (100) and backoff_max_ms (5000) for reconnecting to a
    server that failed, gpu_copy ("auto", "kernel" or "copy_engine": how
    values move to and from GPU memory, docs/gpu.md), gpu_pin_limit (0:
    the whole pool) and gpu_pin_ahead (0): how much of a local server's
    pool this client registers with CUDA for GPU copies, at most, and how
    much of it in the background before any copy asks (docs/gpu.md, "What
    each process pins"), token_file (the file
    holding the servers' secret, for servers started with
    --auth-token-file; default $GDRKV_TOKEN_FILE), replicas (1: copies of
    each key, in distinct failure domains where there are enough; reads
    fall over between them, docs/cluster.md) and settle_ms (10000: how
    long after a change of members a miss reads through to the previous
    owners).

    Batch calls report per-key results and never raise for a per-key
    failure; a server that is down turns into misses and failed puts. Many
    threads may share one client.
    """

    def __init__(self, url, _members_later=False, **options):
        # _members_later: the servers come from _set_members (the cluster
        # watcher does that); url may then be None, and its servers must
        # be left out.
        cluster = None
        if isinstance(url, str) and url.startswith(CLIENT_SCHEME):
            cluster = parse_cluster(url, CLIENT_SCHEME)
            url, _members_later = None, True
            options = {**_parse_query(cluster[2]), **options}
        if _members_later and url is None:
            servers, url_options = "", {}
        else:
            servers, url_options = _parse_url(url)
        if _members_later and servers:
            raise ValueError("a client whose members come later takes no servers in its URL")
        opts_values = _resolve_options({**url_options, **options})
        self.namespace = opts_values["namespace"]
        self.transport = opts_values["transport"]
        self.timeout_ms = opts_values["timeout_ms"]

        opts = ffi.new("gdrkv_client_opts *")
        lib.gdrkv_client_opts_init(opts)
        servers_c = ffi.new("char[]", servers.encode())
        ns_c = ffi.new("char[]", self.namespace.encode())
        opts.servers = servers_c
        opts.ns = ns_c
        opts.transport = _TRANSPORTS[self.transport]
        opts.gpu_copy = _GPU_COPY[opts_values["gpu_copy"]]
        opts.members_later = 1 if _members_later else 0
        if opts_values["token_file"]:
            token_file_c = ffi.new("char[]", opts_values["token_file"].encode())
            opts.token_file = token_file_c
        for name, (_, minimum) in _INT_OPTIONS.items():
            set_int_field(opts, name, opts_values[name], name, minimum)

        out = ffi.new("gdrkv_client **")
        err = ffi.new("char[]", _ERRLEN)
        rc = lib.gdrkv_client_open(opts, out, err, _ERRLEN)
        if rc < 0:
            raise start_error(rc, err)
        self._handle = out[0]
        self._calls = _CallGuard()
        # Also runs at interpreter exit, while daemon threads (SGLang's
        # prefetch and backup threads) may still be inside a call: it must
        # wait for them like close() does, never free the client under them.
        self._close_native = weakref.finalize(self, _close_handle, self._calls, self._handle)
        # address -> what keeps the registered memory alive and unmoved.
        self._registered = {}
        self._registered_lock = threading.Lock()
        # The cluster's members, followed in etcd; the first read waits at
        # most connect_timeout_ms (none: the members come when etcd answers).
        self._cluster = None
        if cluster:
            from .cluster.watcher import Follower
            self._cluster = Follower(self, cluster[0], cluster[1],
                                     opts_values["connect_timeout_ms"] / 1000)

    # ------------------------------------------------------------ memory

    def register(self, obj_or_ptr, nbytes=None):
        """Registers memory that batch calls will read from or write into and
        returns (ptr, nbytes). obj_or_ptr is a buffer-protocol object
        (bytearray, memoryview, mmap, numpy array), a torch tensor (CPU or
        CUDA), or an int address with nbytes (host or GPU memory: the C
        client asks the CUDA driver which). The object is kept alive until
        unregister().
        """
        ptr, size, keepalive = _memory_of(obj_or_ptr)
        if nbytes is None:
            if size is None:
                raise ValueError("nbytes is required when registering a raw pointer")
        elif nbytes < 0:
            raise ValueError(f"nbytes must not be negative, not {nbytes}")
        elif size is not None and nbytes > size:
            raise ValueError(f"nbytes={nbytes} is larger than the object ({size} bytes)")
        else:
            size = nbytes
        with self._calls, self._registered_lock:
            check(lib.gdrkv_client_register(self._handle, ptr, size), "register")
            self._registered[ptr] = keepalive
        return ptr, size

    def unregister(self, obj_or_ptr):
        """Forgets memory registered from obj_or_ptr (the object or its
        address) and drops the reference register() kept."""
        ptr = _memory_of(obj_or_ptr)[0]
        with self._calls, self._registered_lock:
            check(lib.gdrkv_client_unregister(self._handle, ptr), "unregister")
            self._registered.pop(ptr, None)

    # ------------------------------------------------------------ batches

    def batch_put(self, keys, ptrs, sizes, stream=None):
        """Stores object i from ptrs[i]/sizes[i] (ints, or lists of ints for
        an object made of several segments) under keys[i] (str or bytes).
        Returns 0 or a negative error code per key; a key already stored
        keeps its value and reports 0. Segments may be registered GPU
        memory; stream (a torch.cuda.Stream, or a cudaStream_t as an int)
        orders the reads of GPU memory after the work queued on it. The
        call returns once the values are stored either way."""
        return self._keyed_call(lib.gdrkv_batch_put_stream, keys,
                                _segments(ptrs, sizes, len(keys)), _stream(stream))

    def batch_put_copies(self, keys, ptrs, sizes, stream=None):
        """batch_put, but each key's result is the number of copies written
        (1..replicas) when it was stored, or a negative error code when no
        copy was."""
        return self._keyed_call(lib.gdrkv_batch_put_copies, keys,
                                _segments(ptrs, sizes, len(keys)), _stream(stream))

    def batch_get(self, keys, ptrs, sizes, stream=None):
        """Reads object i into ptrs[i]/sizes[i]. Returns the bytes read, or a
        negative error code (E_NOT_FOUND, E_TOO_SMALL, ...) per key. Raises
        GdrkvError only when the call could not run at all (E_CLOSED, ...).
        Segments may be registered GPU memory; with stream (a
        torch.cuda.Stream, or a cudaStream_t as an int) the copies into it
        are queued there, after the work queued before the call. The call
        returns once the bytes are in place either way."""
        return self._keyed_call(lib.gdrkv_batch_get_stream, keys,
                                _segments(ptrs, sizes, len(keys)), _stream(stream))

    def batch_exists(self, keys):
        """Whether each key is stored; a server that cannot be asked reads as
        False."""
        return [r >= 0 for r in self._keyed_call(lib.gdrkv_batch_exists, keys, ())]

    def batch_sizes(self, keys):
        """The size of each object, or a negative error code (E_NOT_FOUND)."""
        return self._keyed_call(lib.gdrkv_batch_exists, keys, ())

    def batch_delete(self, keys):
        """0 or a negative error code (E_NOT_FOUND) per key."""
        return self._keyed_call(lib.gdrkv_batch_delete, keys, ())

    def _keyed_call(self, c_function, keys, segments, *extra):
        """Runs a batch C call over keys; the per-key results as a list."""
        key_bytes = [k.encode() if isinstance(k, str) else k for k in keys]
        key_lens = array("I", map(len, key_bytes))
        n = len(key_bytes)
        results = ffi.new("int64_t[]", n)
        with self._calls:
            if n:
                check(c_function(self._handle, n, b"".join(key_bytes),
                                 ffi.from_buffer("uint32_t[]", key_lens), *segments, results,
                                 *extra))
        return ffi.unpack(results, n)

    # ------------------------------------------------------------ one object

    def put(self, key, data):
        """Stores bytes-like data under key; raises GdrkvError on failure."""
        view = ffi.from_buffer(data)
        result = self.batch_put([key], [_address(view)], [len(view)])[0]
        check(result, f"put {key!r}")

    def get(self, key):
        """The bytes stored under key, or None when there are none; raises
        GdrkvError for any other failure."""
        key_bytes = key.encode() if isinstance(key, str) else key
        value = ffi.new("uint8_t **")
        result = ffi.new("int64_t *")
        # One GET whatever the size (the C client allocates the memory once
        # the answer tells it): one round trip, one hit or miss counted.
        with self._calls:
            check(lib.gdrkv_get_alloc(self._handle, key_bytes, len(key_bytes), value, result),
                  f"get {key!r}")
        if result[0] < 0:
            return _none_if_missing(result[0], key)
        try:
            return ffi.buffer(value[0], result[0])[:]
        finally:
            lib.gdrkv_free(value[0])

    # ------------------------------------------------------------ whole store

    def clear(self):
        """Removes every object of this client's namespace; returns how many."""
        with self._calls:
            return check(lib.gdrkv_clear(self._handle), "clear")

    def ping(self):
        """Whether every server answered."""
        with self._calls:
            return lib.gdrkv_ping(self._handle) == 0

    def stats(self):
        """{"client": {counter: value}, "servers": {"host:port": {counter:
        value} or {"error": "..."}}}."""
        with self._calls:
            servers = {}
            for i in range(lib.gdrkv_client_nservers(self._handle)):
                try:
                    name = read_address(lib.gdrkv_client_server_name, self._handle, i)
                except GdrkvError:
                    break           # the members changed meanwhile (_set_members)
                try:
                    servers[name] = read_counters(lib.gdrkv_client_server_stats, self._handle, i)
                except GdrkvError as e:
                    servers[name] = {"error": strerror(e.code)}
            client = read_counters(lib.gdrkv_client_stats, self._handle)
            if self._cluster:
                client["etcd_errors"] = self._cluster.etcd_errors
            return {"client": client, "servers": servers}

    def members(self):
        """The "host:port" of each server in the client's table now (a
        cluster URL's members change under it)."""
        with self._calls:
            return read_text(lib.gdrkv_client_members_text, self._handle).splitlines()

    def _set_members(self, members):
        """Replaces the servers with members, a list of (addr "host:port",
        capacity in bytes, zone or None, leaving): calls in flight finish
        on the old ones, servers in both keep their connections. Private:
        the cluster watcher calls it. ValueError for a bad member; the old
        members stay then."""
        array_c, _keep = _members_c(members)
        err = ffi.new("char[]", _ERRLEN)
        with self._calls:
            rc = lib.gdrkv_client_set_members(self._handle, array_c, len(members), err, _ERRLEN)
        if rc < 0:
            raise start_error(rc, err)

    def close(self):
        """Waits for calls in flight, then disconnects; later calls raise
        GdrkvError(E_CLOSED). Closing twice is harmless."""
        cluster, self._cluster = self._cluster, None
        if cluster:
            cluster.stop()
        self._close_native()
        with self._registered_lock:
            self._registered.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _close_handle(calls, handle):
    calls.close()
    lib.gdrkv_client_close(handle)


class _CallGuard:
    """Counts the calls in flight so close() can wait for them (each is
    bounded by timeout_ms) before the C client is freed under them."""

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._active = 0
        self._closed = False

    def __enter__(self):
        with self._cond:
            if self._closed:
                raise GdrkvError(E_CLOSED)
            self._active += 1

    def __exit__(self, *exc):
        with self._cond:
            self._active -= 1
            if self._active == 0:
                self._cond.notify_all()

    def close(self):
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._active == 0)


# ---------------------------------------------------------------- members

def place(key, members, replicas=1):
    """The indices into members (a list of (addr, capacity, zone, leaving))
    of the servers a PUT of key goes to under `replicas` copies, best first:
    weighted rendezvous hashing, the same in every process (docs/cluster.md)."""
    key = key.encode() if isinstance(key, str) else bytes(key)
    array_c, _keep = _members_c(members)
    out = ffi.new("uint32_t[]", max(1, replicas))
    n = lib.gdrkv_place(key, len(key), array_c, len(members), replicas, out)
    if n < 0:
        raise ValueError(f"bad members for placement: {strerror(n)}")
    return list(out[0:n])


def _members_c(members):
    """(gdrkv_member[] for members, what keeps its strings alive)."""
    array_c = ffi.new("gdrkv_member[]", max(1, len(members)))
    keep = []
    for i, member in enumerate(members):
        try:
            addr, capacity, zone, leaving = member
        except (TypeError, ValueError):
            raise ValueError(f"member {i} must be (addr, capacity, zone, leaving), "
                             f"not {member!r}") from None
        if not isinstance(addr, str) or "\0" in addr:
            raise ValueError(f"member {i}: address must be a string, not {addr!r}")
        if zone is not None and (not isinstance(zone, str) or "\0" in zone):
            raise ValueError(f"member {i}: zone must be a string or None, not {zone!r}")
        keep.append(ffi.new("char[]", addr.encode()))
        array_c[i].addr = keep[-1]
        set_int_field(array_c[i], "capacity", capacity, f"member {i} capacity", 1)
        if zone:
            keep.append(ffi.new("char[]", zone.encode()))
            array_c[i].zone = keep[-1]
        array_c[i].leaving = 1 if leaving else 0
    return array_c, keep


# ---------------------------------------------------------------- options

def _parse_url(url):
    """("host:port,host:port" or "unix:PATH", {option: text}) from a gdrkv:// URL."""
    if url.startswith(_UNIX_URL):
        path, _, query = url[len(_UNIX_URL):].partition("?")
        if not path:
            raise ValueError(f"no socket path in {url!r} (expected {_UNIX_URL}/path/to.sock)")
        return "unix:" + path, _parse_query(query)
    parts = urlsplit(url)
    if parts.scheme != "gdrkv" or not parts.netloc or parts.path not in ("", "/"):
        raise ValueError(f"not a gdrkv URL: {url!r} "
                         "(expected gdrkv://host:port[,host:port...][?option=value&...])")
    if parts.hostname == "local":
        return local.ensure_server(parts.port or local.DEFAULT_PORT), _parse_query(parts.query)
    servers = parts.netloc.split(",")
    if "" in servers:
        raise ValueError(f"empty server address in {url!r}")
    return ",".join(map(_with_default_port, servers)), _parse_query(parts.query)


def _parse_query(query):
    return dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))


def _with_default_port(address):
    host, bracket, rest = address.rpartition("]")
    has_port = ":" in (rest if bracket else address)
    return address if has_port else f"{address}:{DEFAULT_PORT}"


def _resolve_options(given):
    """Every option's value, defaults filled in; ValueError for unknown
    options or bad values."""
    unknown = sorted(set(given) - set(_OPTIONS))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}; valid options: {', '.join(_OPTIONS)}")
    values = {"namespace": "", "transport": "auto", "gpu_copy": "auto", "token_file": None}
    values.update((name, default) for name, (default, _) in _INT_OPTIONS.items())
    values.update(given)
    for name in _SIZE_OPTIONS:
        if isinstance(values[name], str):
            try:
                values[name] = parse_size(values[name])
            except ValueError:
                raise ValueError(f"{name} must be a size (bytes, or e.g. 64GiB), "
                                 f"not {values[name]!r}") from None

    ns = values["namespace"]
    # The C client takes the namespace as a C string: a NUL would cut it
    # short and merge two namespaces.
    if not isinstance(ns, str) or len(ns.encode()) > _MAX_NAMESPACE or "\0" in ns:
        raise ValueError(f"namespace must be a string of at most {_MAX_NAMESPACE} UTF-8 bytes "
                         "without NUL characters")
    transport = values["transport"]
    if transport not in _TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(_TRANSPORTS)}, not {transport!r}")
    if values["gpu_copy"] not in _GPU_COPY:
        raise ValueError(f"gpu_copy must be one of {', '.join(_GPU_COPY)}, "
                         f"not {values['gpu_copy']!r}")
    if values["token_file"] is not None and not isinstance(values["token_file"], str):
        raise ValueError(f"token_file must be a path, not {values['token_file']!r}")
    for name in _INT_OPTIONS:
        if isinstance(values[name], str):
            try:
                values[name] = int(values[name])
            except ValueError:
                raise ValueError(f"{name} must be an integer, not {values[name]!r}") from None
    replicas = values["replicas"]
    if isinstance(replicas, int) and not isinstance(replicas, bool) and replicas > _MAX_REPLICAS:
        raise ValueError(f"replicas must be 1..{_MAX_REPLICAS}, not {replicas}")
    return values


# ---------------------------------------------------------------- marshalling

def _segments(ptrs, sizes, n):
    """(seg_ptrs, seg_lens, seg_counts) as C arrays for n objects."""
    if len(ptrs) != n or len(sizes) != n:
        raise ValueError(f"got {n} keys, {len(ptrs)} ptrs and {len(sizes)} sizes")
    try:
        seg_ptrs, seg_lens, seg_counts = _flatten(ptrs, sizes, n)
    except OverflowError:
        raise ValueError("pointers and sizes must be integers in [0, 2**64)") from None
    return (ffi.from_buffer("uint64_t[]", seg_ptrs), ffi.from_buffer("uint64_t[]", seg_lens),
            ffi.from_buffer("uint32_t[]", seg_counts))


def _flatten(ptrs, sizes, n):
    try:
        # The common case, one segment per object, never loops in Python.
        return array("Q", ptrs), array("Q", sizes), array("I", [1]) * n
    except TypeError:
        pass            # some object is a list of segments
    seg_ptrs, seg_lens, seg_counts = array("Q"), array("Q"), array("I")
    for i, (obj_ptrs, obj_sizes) in enumerate(zip(ptrs, sizes)):
        if not isinstance(obj_ptrs, (list, tuple)):
            obj_ptrs, obj_sizes = [obj_ptrs], [obj_sizes]
        if len(obj_ptrs) != len(obj_sizes):
            raise ValueError(f"object {i} has {len(obj_ptrs)} segment pointers "
                             f"and {len(obj_sizes)} segment sizes")
        seg_ptrs.extend(obj_ptrs)
        seg_lens.extend(obj_sizes)
        seg_counts.append(len(obj_ptrs))
    return seg_ptrs, seg_lens, seg_counts


def _memory_of(obj):
    """(address, nbytes or None for a raw pointer, what keeps the memory
    alive and in place)."""
    if isinstance(obj, int) and not isinstance(obj, bool):
        if obj < 0:
            raise ValueError(f"a pointer must not be negative, not {obj}")
        return obj, None, None
    if _is_tensor(obj):
        if obj.device.type not in ("cpu", "cuda"):
            raise ValueError(f"cannot register memory of a {obj.device.type} tensor")
        if not obj.is_contiguous():
            raise ValueError("only contiguous tensors can be registered")
        return obj.data_ptr(), obj.numel() * obj.element_size(), obj
    try:
        view = ffi.from_buffer(obj)   # holding it also stops a bytearray from resizing
    except TypeError:
        raise ValueError(f"cannot register a {type(obj).__name__}: expected a buffer-protocol "
                         "object, a torch tensor or an int pointer with nbytes") from None
    return _address(view), len(view), view


def _stream(stream):
    """A CUDA stream as the integer handle the C API takes (0: none)."""
    if stream is None:
        return 0
    handle = getattr(stream, "cuda_stream", stream)     # torch.cuda.Stream
    if isinstance(handle, bool) or not isinstance(handle, int) or handle < 0:
        raise ValueError(f"stream must be a torch.cuda.Stream or an int handle, not {stream!r}")
    return handle


def _is_tensor(obj):
    # Duck-typed so torch is never imported here.
    return hasattr(obj, "data_ptr") and hasattr(obj, "element_size") and hasattr(obj, "device")


def _address(cdata):
    return int(ffi.cast("uintptr_t", cdata))


def _none_if_missing(code, key):
    if code == E_NOT_FOUND:
        return None
    raise GdrkvError(code, f"get {key!r}: {strerror(code)}")
