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

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, PoolName, PoolTransferResult

import gdrkv
from gdrkv.keys import DTYPE_BYTES, dtype_name, with_engine_namespace

from .options import ADAPTER_KEYS, SGLANG_KEYS, parse_extra_config
from .page_keys import key_scheme
from .pages import HostPages
from .side_pools import SidePool, hit_result

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
        # HiCache v2: the KV dtype keys name, whether the anchor pool is
        # logical (DeepSeek V4: indices only, side pools hold the bytes), and
        # every side pool by name.
        self._kv_dtype = None
        self._logical_anchor = False
        self._side_pools = {}
        if storage_config.tp_lcm_size:
            logger.warning("gdrkv ignores tp_lcm_size: pages are keyed by TP rank and size, "
                           "so deployments of different TP sizes do not share them")

    # ------------------------------------------------------------ setup

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        if getattr(mem_pool_host, "kv_buffer", None) is None:
            # A logical anchor (SGLang's LogicalHostPool, as its Mooncake
            # store tells it): its pages have no bytes; the side pools
            # registered next carry them.
            self._logical_anchor = True
            self._kv_dtype = self._options.kv_cache_dtype
            logger.info("gdrkv HiCache storage: logical KV anchor, side pools hold the pages")
            return
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
        self._kv_dtype = dtype
        logger.info("gdrkv HiCache storage: %d-byte pages keyed %s<page hash>",
                    pages.page_bytes, self._exists_keys.prefix())

    # ------------------------------------------------------------ HiCache v2
    #
    # Hybrid models keep side pools next to the KV pages: Mamba/SWA states,
    # DSA indexer rows, DeepSeek V4 compressed pools, speculative draft KV.
    # A side pool's object of a page is keyed by the page's hash under the
    # pool's own prefix (pool name, layout, element types, geometry), so it
    # never meets a KV page or another pool's object (side_pools.py).

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        if host_pool_name == PoolName.KV:
            # The anchor, registered above (or here first by a caller that
            # only speaks v2).
            if self._pages is None and not self._logical_anchor:
                self.register_mem_pool_host(host_pool)
            return
        side = SidePool(host_pool, str(host_pool_name), self._config, self._kv_dtype)
        for ptr, nbytes in side.pages.memory_ranges():
            self._client.register(ptr, nbytes)
        self._side_pools[str(host_pool_name)] = side
        logger.info("gdrkv HiCache storage: %s side pool, %d-byte pages keyed %s<page hash>",
                    host_pool_name, side.pages.page_bytes, side.keys.prefix())

    def on_host_pools_registered(self):
        if self._logical_anchor and not self._side_pools:
            raise ValueError("the HiCache host pool is a logical anchor without side pools: "
                             "it holds no bytes that gdrkv could store")

    @_fail_soft(lambda keys: PoolTransferResult(0, {}, []))
    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The usable prefix over KV and every pool's hit policy, from one
        batch_exists round trip per server for all of them."""
        transfers = list(pool_transfers or [])
        if self._logical_anchor and not transfers:
            return PoolTransferResult(0, {}, [])
        queries = [] if self._logical_anchor else self._exists_keys.keys(keys)
        spans = []
        for transfer in transfers:
            side = self._side_pool(transfer.name)
            pool_keys = side.exists_keys(keys, transfer)
            spans.append((transfer, len(queries), len(pool_keys)))
            queries += side.keys.keys(pool_keys)
        found = self._client.batch_exists(queries) if queries else []
        kv_found = [True] * len(keys) if self._logical_anchor else found[:len(keys)]
        return hit_result(kv_found, [(transfer, found[start:start + n])
                                     for transfer, start, n in spans])

    @_fail_soft(lambda transfers: {t.name: [False] * len(t.keys or []) for t in transfers})
    def batch_get_v2(self, transfers, extra_info=None):
        return self._move_v2("get", transfers)

    @_fail_soft(lambda transfers: {t.name: [False] * len(t.keys or []) for t in transfers})
    def batch_set_v2(self, transfers, extra_info=None):
        return self._move_v2("put", transfers)

    def _side_pool(self, name):
        side = self._side_pools.get(str(name))
        if side is None:
            raise ValueError(f"no {str(name)!r} host pool was registered")
        return side

    def _move_v2(self, op, transfers):
        """Every transfer's pages in one batched call; per pool, whether each
        page arrived whole (get) or is stored (put)."""
        results, plan = {}, []
        keys, ptrs, sizes, expected = [], [], [], []
        for transfer in transfers:
            n = len(transfer.keys or [])
            if transfer.name == PoolName.KV and self._logical_anchor:
                results[transfer.name] = [True] * n         # nothing to move
                continue
            try:
                if transfer.name == PoolName.KV:
                    pages, scheme = self._pages, self._page_keys
                else:
                    side = self._side_pool(transfer.name)
                    pages, scheme = side.pages, side.keys
                pool_ptrs, pool_sizes = pages.segments(transfer.host_indices, n)
            except (ValueError, AttributeError) as e:
                self._log.warning(op + "_v2", "gdrkv %s of the %s pool refused: %s", op,
                                  transfer.name, e)
                results[transfer.name] = [False] * n
                continue
            plan.append((transfer.name, len(keys), n, pages.page_bytes))
            keys += scheme.keys(transfer.keys or [])
            ptrs += pool_ptrs
            sizes += pool_sizes
            expected += [pages.page_bytes] * n
        if keys:
            done = self._transfer(op, keys, ptrs, sizes, expected)
            for name, start, n, _ in plan:
                results[name] = done[start:start + n]
        return results

    # ------------------------------------------------------------ zero copy (v1)

    # A logical anchor's pages have no bytes: moving them is done at once
    # (the side pools move the state), but alone they never count as a hit.

    @_fail_soft(lambda keys: [False] * len(keys))
    def batch_get_v1(self, keys, host_indices, extra_info=None):
        if self._logical_anchor:
            return [True] * len(keys)
        return self._get(self._page_keys, keys, *self._pages.segments(host_indices, len(keys)))

    @_fail_soft(lambda keys: [False] * len(keys))
    def batch_set_v1(self, keys, host_indices, extra_info=None):
        if self._logical_anchor:
            return [True] * len(keys)
        return self._put(self._page_keys, keys, *self._pages.segments(host_indices, len(keys)))

    @_fail_soft(lambda keys: 0)
    def batch_exists(self, keys, extra_info=None):
        """How many pages from the start exist: one round trip per server."""
        if self._logical_anchor:
            return 0
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
        """One batched read of KV pages; per page whether it arrived whole."""
        return self._transfer("get", scheme.keys(keys), ptrs, sizes,
                              [self._pages.page_bytes] * len(keys))

    def _put(self, scheme, keys, ptrs, sizes):
        """One batched write of KV pages; per page whether it is stored (by anyone)."""
        return self._transfer("put", scheme.keys(keys), ptrs, sizes,
                              [self._pages.page_bytes] * len(keys))

    def _transfer(self, op, store_keys, ptrs, sizes, page_bytes):
        """One batched get or put of objects of page_bytes[i] bytes; per
        object whether it arrived whole or is stored. Logs failures other
        than misses; records pages and bandwidth."""
        start = time.perf_counter()
        if op == "get":
            results = self._client.batch_get(store_keys, ptrs, sizes)
            done = [r == n for r, n in zip(results, page_bytes)]
            metric = self._metrics and self._metrics.prefetch
        else:
            results = self._client.batch_put(store_keys, ptrs, sizes)
            done = [r == 0 for r in results]
            metric = self._metrics and self._metrics.backup
        errors = {r for r, ok in zip(results, done) if not ok and r != gdrkv.E_NOT_FOUND}
        if errors:
            self._log.warning(op, "gdrkv %s: %d of %d pages failed (%s)", op,
                              done.count(False), len(done),
                              ", ".join(gdrkv.strerror(r) if r < 0 else f"{r} bytes"
                                        for r in sorted(errors)))
        if metric is not None:
            moved = sum(n for n, ok in zip(page_bytes, done) if ok)
            metric.add(done.count(True), moved, time.perf_counter() - start)
        return done

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
