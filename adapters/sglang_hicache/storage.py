"""GdrkvHiCacheStorage: SGLang's HiCache L3 storage on gdrkv servers.

SGLang calls a storage backend from several threads at once (prefetch, IO,
backup), never bounds a call's time and counts an exception as "no pages",
silently. So every data call here is one batched gdrkv call bounded by the
client's timeout_ms, and every failure becomes a False/0/None result and a
rate-limited log line, never an exception into SGLang's threads.
"""
import functools
import logging
import threading
import time

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, PoolName

import gdrkv
from gdrkv.keys import DTYPE_BYTES, KeyScheme, dtype_name, with_engine_namespace

from .options import ADAPTER_KEYS, SGLANG_KEYS, parse_extra_config
from .pages import HostPages

logger = logging.getLogger(__name__)

LOG_INTERVAL_S = 10.0


def _fail_soft(failed):
    """Makes a data method return failed(keys) instead of raising."""
    def wrap(method):
        @functools.wraps(method)
        def guarded(self, keys, *args, **kwargs):
            try:
                return method(self, keys, *args, **kwargs)
            except Exception as e:
                self._log.warning(method.__name__, "gdrkv %s of %d pages failed: %r",
                                  method.__name__, len(keys), e)
                return failed(keys)
        return guarded
    return wrap


class GdrkvHiCacheStorage(HiCacheStorage):
    """Load with --hicache-storage-backend dynamic and the extra config
    {"backend_name": "gdrkv", "module_path": "gdrkv.adapters.sglang_hicache",
    "class_name": "GdrkvHiCacheStorage", "interface_v1": 1,
    "url": "gdrkv://host:port"} plus any gdrkv.Client option (namespace,
    timeout_ms, conns, transport, ...). Without url, an embedded server
    private to this process is started (embedded_memory, default 1GiB).
    """

    def __init__(self, storage_config, kwargs=None):
        if not storage_config.model_name:
            raise ValueError("gdrkv keys pages by model, but the storage config names none")
        self._config = storage_config
        self._options = parse_extra_config(storage_config.extra_config)
        self._log = _RateLimitedLog(LOG_INTERVAL_S)
        self._metrics = _Metrics() if storage_config.enable_storage_metrics else None
        self._server, self._client = _connect(self._options, storage_config.model_name)
        # Set by register_mem_pool_host: the pool's page geometry and the key
        # schemes of its zero-copy, copied (flat) and raw-pointer objects.
        self._pages = self._page_keys = self._flat_keys = self._exists_keys = None
        self._raw_keys = None
        if storage_config.tp_lcm_size:
            logger.warning("gdrkv ignores tp_lcm_size: pages are keyed by TP rank and size, "
                           "so deployments of different TP sizes do not share them")

    # ------------------------------------------------------------ setup

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        pages = HostPages(mem_pool_host)
        dtype = self._options.kv_cache_dtype or pages.dtype()
        if dtype_name(dtype) == "u8":
            raise ValueError('the host pool stores packed uint8 KV (fp8 or fp4), whose formats '
                             'keys must tell apart: set "kv_cache_dtype" (e.g. "fp8_e4m3") in '
                             "the extra config")
        pool_bytes = DTYPE_BYTES[dtype_name(pages.dtype())]
        if DTYPE_BYTES[dtype_name(dtype)] != pool_bytes:
            raise ValueError(f'"kv_cache_dtype": {dtype!r} takes {DTYPE_BYTES[dtype_name(dtype)]} '
                             f"byte(s) an element, but the host pool holds {pages.dtype()} "
                             f"({pool_bytes}): it names another cache's dtype")
        for ptr, nbytes in pages.memory_ranges():
            self._client.register(ptr, nbytes)
        self._page_keys = key_scheme(self._config, layout=pages.layout, dtype=dtype,
                                     page_tokens=pages.page_size,
                                     segment_bytes=pages.segment_bytes)
        # The copying methods store a page as one flat tensor in its own order.
        self._flat_keys = key_scheme(self._config, layout=pages.layout + ".flat", dtype=dtype,
                                     page_tokens=pages.page_size,
                                     segment_bytes=[pages.page_bytes])
        # What the raw-pointer forms of get/set store: bytes of any size the
        # caller points at (reads check the size), keyed apart from pages.
        self._raw_keys = key_scheme(self._config, layout=pages.layout + ".raw", dtype=dtype,
                                    page_tokens=pages.page_size,
                                    segment_bytes=pages.segment_bytes)
        self._exists_keys = self._page_keys if self._options.zero_copy else self._flat_keys
        self._pages = pages
        logger.info("gdrkv HiCache storage: %d-byte pages keyed %s<page hash>",
                    pages.page_bytes, self._exists_keys.prefix())

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        # The KV pool arrives here too and is the one registered above.
        if host_pool_name != PoolName.KV:
            raise NotImplementedError(
                f"gdrkv does not store the {str(host_pool_name)!r} host pool yet: hybrid "
                "models (Mamba/SWA state, DSA indexer) and speculative draft pools need "
                "HiCache storage v2, which gdrkv does not implement")
        super().register_mem_host_pool_v2(host_pool, host_pool_name)

    # ------------------------------------------------------------ zero copy (v1)

    @_fail_soft(lambda keys: [False] * len(keys))
    def batch_get_v1(self, keys, host_indices, extra_info=None):
        return self._get(self._page_keys, keys, *self._pages.segments(host_indices, len(keys)))

    @_fail_soft(lambda keys: [False] * len(keys))
    def batch_set_v1(self, keys, host_indices, extra_info=None):
        return self._put(self._page_keys, keys, *self._pages.segments(host_indices, len(keys)))

    @_fail_soft(lambda keys: 0)
    def batch_exists(self, keys, extra_info=None):
        """How many pages from the start exist: one round trip per server."""
        found = self._client.batch_exists(self._exists_keys.keys(keys))
        return found.index(False) if False in found else len(found)

    # ------------------------------------------------------------ copying (legacy)
    #
    # Two forms, as SGLang's own backends take them: flat page tensors
    # (values, target_locations), or raw pointers (target_location(s) ints,
    # or lists of ints for scattered pieces, with target_sizes in bytes, as
    # SGLang's Mooncake store and its test use them). The pointer form
    # answers as Mooncake's does: get and set True or False, batch_get how
    # many keys from the start were read whole, batch_set whether all were
    # stored.

    def get(self, key, target_location=None, target_sizes=None):
        if _pointers([target_location]):
            return self._raw_get([key], [target_location], [target_sizes]) == 1
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Fills each target (a flat page tensor); None where it is missing."""
        if _pointers(target_locations):
            return self._raw_get(keys, target_locations, target_sizes)
        return self._flat_get(keys, target_locations)

    def set(self, key, value=None, target_location=None, target_sizes=None):
        if value is None and _pointers([target_location]):
            return self._raw_set([key], [target_location], [target_sizes])
        return self.batch_set([key], [value])

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """Stores flat page tensors; True when all are stored."""
        if values is None and _pointers(target_locations):
            return self._raw_set(keys, target_locations, target_sizes)
        return self._flat_set(keys, values)

    def exists(self, key):
        """Whether the page, or an object the pointer form stored, is there."""
        if self._raw_keys is None:
            return self.batch_exists([key]) == 1
        return self._any_exists([key])

    @_fail_soft(lambda keys: [None] * len(keys))
    def _flat_get(self, keys, targets):
        done = self._get(self._flat_keys, keys, *self._flat_pages(targets, len(keys)))
        return [target if ok else None for target, ok in zip(targets, done)]

    @_fail_soft(lambda keys: False)
    def _flat_set(self, keys, values):
        return all(self._put(self._flat_keys, keys, *self._flat_pages(values, len(keys))))

    @_fail_soft(lambda keys: 0)
    def _raw_get(self, keys, ptrs, sizes):
        expected = _raw_sizes(keys, ptrs, sizes)
        results = self._client.batch_get(self._raw_keys.keys(keys), list(ptrs), list(sizes))
        done = [r == n for r, n in zip(results, expected)]
        return done.index(False) if False in done else len(done)

    @_fail_soft(lambda keys: False)
    def _raw_set(self, keys, ptrs, sizes):
        _raw_sizes(keys, ptrs, sizes)
        return self._client.batch_put(self._raw_keys.keys(keys), list(ptrs),
                                      list(sizes)) == [0] * len(keys)

    @_fail_soft(lambda keys: False)
    def _any_exists(self, keys):
        found = self._client.batch_exists(self._exists_keys.keys(keys) + self._raw_keys.keys(keys))
        return any(found)

    def _flat_pages(self, tensors, n):
        """(ptrs, sizes) of n flat page tensors."""
        if len(tensors) != n:
            raise ValueError(f"{len(tensors)} page tensors for {n} keys")
        nbytes = self._pages.page_bytes
        for t in tensors:
            if not t.is_contiguous() or t.numel() * t.element_size() != nbytes:
                raise ValueError(f"a page tensor must be {nbytes} contiguous bytes")
        return [t.data_ptr() for t in tensors], [nbytes] * n

    # ------------------------------------------------------------ transfers

    def _get(self, scheme, keys, ptrs, sizes):
        """One batched read; per page whether it arrived whole."""
        start = time.perf_counter()
        results = self._client.batch_get(scheme.keys(keys), ptrs, sizes)
        done = [r == self._pages.page_bytes for r in results]
        self._account("get", results, done, self._metrics and self._metrics.prefetch, start)
        return done

    def _put(self, scheme, keys, ptrs, sizes):
        """One batched write; per page whether it is stored (by anyone)."""
        start = time.perf_counter()
        results = self._client.batch_put(scheme.keys(keys), ptrs, sizes)
        done = [r == 0 for r in results]
        self._account("put", results, done, self._metrics and self._metrics.backup, start)
        return done

    def _account(self, op, results, done, metric, start):
        """Logs failures other than misses; records pages and bandwidth."""
        errors = {r for r, ok in zip(results, done) if not ok and r != gdrkv.E_NOT_FOUND}
        if errors:
            self._log.warning(op, "gdrkv %s: %d of %d pages failed (%s)", op,
                              done.count(False), len(done),
                              ", ".join(gdrkv.strerror(r) if r < 0 else f"{r} bytes"
                                        for r in sorted(errors)))
        if metric is not None:
            pages = done.count(True)
            metric.add(pages, pages * self._pages.page_bytes, time.perf_counter() - start)

    # ------------------------------------------------------------ the rest

    def clear(self):
        """Removes every object of the namespace: by default this model's
        SGLang pages alone (every rank's), but everything engines sharing a
        namespace set in the config wrote."""
        try:
            removed = self._client.clear()
        except Exception as e:
            logger.warning("gdrkv clear failed: %r", e)
            return False
        logger.info("gdrkv clear removed %d objects", removed)
        return True

    def get_stats(self):
        return self._metrics.drain() if self._metrics else None

    def close(self):
        self._client.close()
        if self._server:
            self._server.close()


def _pointers(targets):
    """Whether targets are raw pointers (ints, or lists of ints) rather than tensors."""
    return bool(targets) and all(isinstance(t, int) or (isinstance(t, (list, tuple)) and t and
                                                        all(isinstance(p, int) for p in t))
                                 for t in targets)


def _raw_sizes(keys, ptrs, sizes):
    """The byte count of each key's pointer(s); ValueError where they do not match."""
    if sizes is None or not (len(keys) == len(ptrs) == len(sizes)):
        raise ValueError("the pointer form needs one target_location and one target_sizes "
                         "per key")
    totals = []
    for ptr, size in zip(ptrs, sizes):
        pieces = size if isinstance(size, (list, tuple)) else [size]
        if isinstance(ptr, (list, tuple)) != isinstance(size, (list, tuple)) or \
                (isinstance(ptr, (list, tuple)) and len(ptr) != len(pieces)) or \
                not all(isinstance(n, int) and n > 0 for n in pieces):
            raise ValueError(f"target_sizes {size!r} do not match target_location {ptr!r}")
        totals.append(sum(pieces))
    return totals


def key_scheme(config, *, layout, dtype, page_tokens, segment_bytes):
    """The KeyScheme of pages of one geometry for a HiCacheStorageConfig:
    the model, and the TP (not for MLA, whose pages are the same on every TP
    rank), PP, context-parallel and decode-context-parallel coordinates;
    never the DP rank. Under DCP each MLA rank of a DCP group holds another
    shard of the logical page, so the DCP rank and the logical page size
    are part of the key (SGLang's own file backend keys them the same way)."""
    tp = (None, None) if config.is_mla_model else (config.tp_rank, config.tp_size)
    cp = (config.attn_cp_rank, config.attn_cp_size) if config.attn_cp_size > 1 else (None, None)
    dcp_size = getattr(config, "dcp_size", 1) or 1
    dcp = (config.dcp_rank, dcp_size) if dcp_size > 1 else (None, None)
    logical = config.logical_page_size if dcp_size > 1 else None
    return KeyScheme(engine="sglang", model=config.model_name, dtype=dtype, layout=layout,
                     page_tokens=page_tokens, segments=len(segment_bytes),
                     segment_bytes=list(segment_bytes), tp_rank=tp[0], tp_size=tp[1],
                     pp_rank=config.pp_rank, pp_size=config.pp_size,
                     cp_rank=cp[0], cp_size=cp[1], dcp_rank=dcp[0], dcp_size=dcp[1],
                     logical_page_tokens=logical)


def _connect(options, model):
    """(embedded server or None, client) for the parsed extra config; the
    namespace is SGLang's and the model's unless the config names one."""
    server = None
    url = options.url
    if url is None:
        server = gdrkv.Server(memory=options.embedded_memory)
        url = server.url
        logger.info("gdrkv: no url in the HiCache extra config, so pages go to an embedded "
                    "%s server at %s that lives and dies with this process and is shared "
                    "with no other (not with other TP ranks, DP replicas or restarts); run "
                    "`gdrkv serve` and set url to share them", options.embedded_memory, url)
    try:
        return server, gdrkv.Client(url, **with_engine_namespace(
            url, options.client_options, "sglang", model))
    except ValueError as e:
        if server:
            server.close()
        raise ValueError(f"gdrkv HiCache extra config: {e}; besides client options it "
                         f"takes {', '.join(ADAPTER_KEYS)} and SGLang's "
                         f"{', '.join(SGLANG_KEYS)}") from None


class _Metrics:
    """Pages moved and bandwidth since SGLang last polled get_stats()."""

    def __init__(self):
        self.prefetch = _Series()
        self.backup = _Series()

    def drain(self):
        # Imported here: the module pulls in SGLang's metrics stack.
        from sglang.srt.observability.metrics_collector import StorageMetrics

        metrics = StorageMetrics()
        metrics.prefetch_pgs, metrics.prefetch_bandwidth = self.prefetch.drain()
        metrics.backup_pgs, metrics.backup_bandwidth = self.backup.drain()
        return metrics


class _Series:
    def __init__(self):
        self._lock = threading.Lock()
        self._pages, self._gbps = [], []

    def add(self, pages, nbytes, seconds):
        with self._lock:
            self._pages.append(pages)
            self._gbps.append(nbytes / seconds / 1e9 if seconds > 0 else 0.0)

    def drain(self):
        with self._lock:
            drained = self._pages, self._gbps
            self._pages, self._gbps = [], []
        return drained


class _RateLimitedLog:
    """At most one warning per kind every interval_s, so a dead server does
    not flood the log from every thread on every call; the next one that
    gets through says how many were held back."""

    def __init__(self, interval_s):
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._last = {}
        self._held = {}

    def warning(self, kind, message, *args):
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(kind, -self._interval_s) < self._interval_s:
                self._held[kind] = self._held.get(kind, 0) + 1
                return
            self._last[kind] = now
            held = self._held.pop(kind, 0)
        if held:
            message += " (%d similar warnings held back)"
            args += (held,)
        logger.warning(message, *args)
