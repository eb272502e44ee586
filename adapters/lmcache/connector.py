"""GdrkvConnector: LMCache's RemoteConnector over a gdrkv client.

Chunks move without a copy: LMCache's CPU allocator buffer is registered
with the client once, puts send straight from each MemoryObj, and gets land
straight in MemoryObjs allocated here, one batched client call per LMCache
call. Blocking client calls run on the connector's own threads (the C call
releases the GIL), never on LMCache's event loop; the synchronous lookup
calls run on the caller's thread. Every client call ends within the
client's timeout_ms, and the C client reconnects by itself when a server
comes back.
"""
import asyncio
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from lmcache.logging import init_logger
from lmcache.v1.exceptions import IrrecoverableException
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

import gdrkv
from gdrkv.keys import with_engine_namespace

from .chunk_keys import ChunkKeys, require_deterministic_hashing

logger = init_logger(__name__)

# Client calls in flight at once: enough for a put batch, a get batch and a
# lookup to overlap; each call already fans out over every server and
# connection in C.
CALL_THREADS = 4


def config_error(message):
    """The exception for a configuration that can never work. It is the one
    LMCache lets out of a backend's construction, so the backend is dropped
    with this message logged (or the engine stops, for the external:// form)
    instead of being retried forever."""
    return IrrecoverableException("gdrkv: " + message)


class GdrkvConnector(RemoteConnector):
    """Stores LMCache chunks in gdrkv servers.

    Built by GdrkvConnectorAdapter with the plugin's url, or by LMCache's
    deprecated external:// adapter, which passes only loop,
    local_cpu_backend and config; the url then comes from remote_url. The
    loop goes unused: calls run on whichever loop awaits them (LMCache's).
    """

    def __init__(self, loop, local_cpu_backend, config, metadata=None, url=None):
        if metadata is None:
            metadata = local_cpu_backend.metadata
        super().__init__(config, metadata)
        if config.remote_serde != "naive":
            raise config_error(f"remote_serde must be naive, not {config.remote_serde!r}: "
                               "chunks travel as the allocator's raw bytes")
        if config.use_layerwise:
            raise config_error("use_layerwise is not supported: a layer's bytes would be "
                               "read back as a partial chunk")
        require_deterministic_hashing(config.pre_caching_hash_algorithm)
        if url is None:
            url = _url_from_external(config.remote_url)
        try:
            self.client = gdrkv.Client(url, **with_engine_namespace(url, {}, "lmcache",
                                                                    metadata.model_name))
        except (ValueError, gdrkv.GdrkvError) as e:
            raise config_error(f"cannot use {url!r}: {e}") from e
        self.local_cpu_backend = local_cpu_backend
        self._keys = ChunkKeys(self.meta_fmt, metadata.chunk_size, self.full_chunk_size_bytes,
                               mla=bool(metadata.use_mla))
        self._threads = ThreadPoolExecutor(CALL_THREADS, thread_name_prefix="gdrkv-lmcache")
        self._register_cpu_buffer()
        logger.info("gdrkv connector for %s: chunks of %d bytes", url, self.full_chunk_size_bytes)

    def _register_cpu_buffer(self):
        """Registers the allocator's whole CPU buffer once (transports other
        than tcp map it at registration, never per transfer)."""
        allocator = getattr(self.local_cpu_backend, "memory_allocator", None)
        # MixedMemoryAllocator calls it buffer, PagedCpuGpuMemoryAllocator cpu_buffer.
        for name in ("buffer", "cpu_buffer"):
            buffer = getattr(allocator, name, None)
            if buffer is not None and buffer.numel() > 0:
                ptr, nbytes = self.client.register(buffer)
                logger.info("gdrkv registered LMCache's CPU buffer: %d bytes at %#x", nbytes, ptr)
                return
        logger.info("gdrkv: %s has no single CPU buffer to register", type(allocator).__name__)

    async def _call(self, method, *args):
        """Runs a blocking client call on the connector's threads.

        The call is awaited to its end even when the awaiting task is
        cancelled (LMCache cancels gets that outlast blocking_timeout_secs):
        callers release or reuse the buffers as soon as this returns, and
        the client must not be writing into them or reading from them by
        then. The wait is bounded by the client's timeout_ms.
        """
        call = asyncio.get_running_loop().run_in_executor(self._threads, method, *args)
        cancelled = False
        while not call.done():
            try:
                await asyncio.wait((call,))
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError
        return call.result()

    # ---------------------------------------------------------------- lookups

    async def exists(self, key):
        return await self.batched_async_contains("", [key]) == 1

    def exists_sync(self, key):
        return self.client.batch_exists([self._keys.one(key)])[0]

    def support_batched_async_contains(self):
        return True

    async def batched_async_contains(self, lookup_id, keys, pin=False):
        """Hits as a prefix count. pin is ignored: gdrkv pins objects only
        while it reads them, so a chunk evicted before the get is a miss."""
        return _leading_true(await self._call(self.client.batch_exists, self._keys.of(keys)))

    def support_batched_contains(self):
        return True

    def batched_contains(self, keys):
        """Hits as a prefix count, on the caller's thread: LMCache's lookup
        path waits on this without a timeout of its own, and the client's
        timeout_ms bounds it."""
        return _leading_true(self.client.batch_exists(self._keys.of(keys)))

    # ---------------------------------------------------------------- gets

    async def get(self, key):
        return (await self.batched_get([key]))[0]

    def support_batched_get(self):
        return True

    async def batched_get(self, keys):
        """A MemoryObj (refcount 1, the caller's) or None per key."""
        objs = self._allocate(len(keys))
        try:
            results = await self._call(self.client.batch_get, self._keys.of(keys[:len(objs)]),
                                       [obj.data_ptr for obj in objs],
                                       [obj.get_size() for obj in objs])
        except BaseException:
            for obj in objs:
                obj.ref_count_down()
            raise
        chunks = [self._chunk_read(obj, n) for obj, n in zip(objs, results)]
        return chunks + [None] * (len(keys) - len(chunks))

    def support_batched_get_non_blocking(self):
        return True

    async def batched_get_non_blocking(self, lookup_id, keys):
        """The leading run of hits; LMCache has no use for a chunk after a
        miss."""
        chunks = await self.batched_get(keys)
        hits = _leading_true([chunk is not None for chunk in chunks])
        for chunk in chunks[hits:]:
            if chunk is not None:
                chunk.ref_count_down()
        return chunks[:hits]

    def _allocate(self, count):
        """Up to count full-chunk MemoryObjs, without waiting for memory
        (LMCache's default busy loop would block the event loop while memory
        is full). Stops at the first failure: allocate() has already evicted
        what it could, so the next would fail too."""
        objs = []
        for _ in range(count):
            obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes,
                                                  self.meta_fmt, busy_loop=False)
            if obj is None:
                break
            objs.append(obj)
        return objs

    def _chunk_read(self, obj, result):
        """obj trimmed to the tokens read (a partial last chunk is shorter),
        or None with obj released when nothing usable was read."""
        if result > 0:
            try:
                return self.reshape_partial_chunk(obj, result)
            except ValueError as e:     # a size that no chunk of this geometry has
                logger.warning("gdrkv: dropping a chunk read: %s", e)
        obj.ref_count_down()
        return None

    # ---------------------------------------------------------------- puts

    async def put(self, key, memory_obj):
        await self.batched_put([key], [memory_obj])

    def support_batched_put(self):
        return True

    async def batched_put(self, keys, memory_objs):
        """Sends straight from the objects; when this returns the client no
        longer touches them, even after a timeout. Raises GdrkvError when
        some puts failed, for LMCache to log and count."""
        # A chunk is at most chunk_size tokens (the reads allocate that
        # much): anything longer could be stored but never read back.
        fits = [obj.get_size() <= self.full_chunk_size_bytes for obj in memory_objs]
        keys = [key for key, ok in zip(keys, fits) if ok]
        memory_objs = [obj for obj, ok in zip(memory_objs, fits) if ok]
        results = await self._call(self.client.batch_put, self._keys.of(keys),
                                   [obj.data_ptr for obj in memory_objs],
                                   [obj.get_size() for obj in memory_objs]) if keys else []
        failed = [r for r in results if r < 0]
        if failed:
            raise gdrkv.GdrkvError(failed[0], f"{len(failed)} of {len(results)} puts failed, "
                                              f"first with: {gdrkv.strerror(failed[0])}")
        if not all(fits):
            raise gdrkv.GdrkvError(gdrkv.E_TOO_LARGE, f"{fits.count(False)} objects longer "
                                   f"than a full chunk ({self.full_chunk_size_bytes} bytes) "
                                   "were not stored")

    # ---------------------------------------------------------------- the rest

    def remove_sync(self, key):
        return self.client.batch_delete([self._keys.one(key)])[0] == 0

    def support_ping(self):
        return True

    async def ping(self):
        """0 when every server answered, else gdrkv's E_UNAVAILABLE."""
        return 0 if await self._call(self.client.ping) else gdrkv.E_UNAVAILABLE

    async def list(self):
        """Always empty: gdrkv servers look objects up by key and have no
        way to enumerate them (LMCache lists keys only to load fs:// chunk
        files)."""
        return []

    async def close(self):
        await asyncio.to_thread(self._close)

    def _close(self):
        self._threads.shutdown(wait=True)
        self.client.close()


def _leading_true(flags):
    """How many flags are true before the first false one."""
    return next((i for i, flag in enumerate(flags) if not flag), len(flags))


def _url_from_external(remote_url):
    """gdrkv://host:port[?options] from the deprecated
    external://host:port/gdrkv.adapters.lmcache/?connector_name=GdrkvConnector[&options]."""
    parts = urlsplit(remote_url or "")
    if parts.scheme != "external":
        raise config_error("no server url: set extra_config "
                           "remote_storage_plugin.gdrkv.url to gdrkv://host:port")
    options = [(k, v) for k, v in parse_qsl(parts.query) if k != "connector_name"]
    return urlunsplit(("gdrkv", parts.netloc, "", urlencode(options), ""))
