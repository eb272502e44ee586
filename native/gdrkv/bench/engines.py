"""The engine-level half of `gdrkv bench --compare`: gdrkv's adapters
against the storage the engines ship, each driven through the engine's own
storage interface the way the engine drives it.

SGLang: GdrkvHiCacheStorage against HiCacheFile (in /dev/shm) and SGLang's
Mooncake store backend (on the Mooncake cluster of the raw comparison), on
the same host pool, page size and layout. The cache controller calls a zero-copy backend's
batch_set_v1/batch_get_v1, and HiCacheFile (which has no v1 methods)
through batch_set/batch_get of flat page copies, so each is measured on the
path SGLang takes for it (Mooncake's zero-copy v1 like gdrkv's). "sglang-mamba" rows measure HiCache v2 side pools
the same way: a hybrid model's Mamba state slots through batch_set_v2 /
batch_get_v2 (batch_exists_v2 with the TRAILING_PAGES policy), which
HiCacheFile serves by copying each slot through a flat page. LMCache: the gdrkv plugin against its redis://
backend and its own lm:// server (started here), through RemoteBackend, on
the same chunks.

The host pool is a duck-typed page_first MHA pool (real SGLang host pools
need a GPU stack to import); its geometry and page methods are those of
SGLang 0.5.23's MHATokenToKVPoolHost for that layout.
"""
import asyncio
import contextlib
import os
import shutil
import statistics
import tempfile
import threading

from .harness import measure
from .peers import MOONCAKE_MASTER, MOONCAKE_METADATA, lmcache_server, redis_port

# SGLang's STORAGE_BATCH_SIZE: the most pages the controller passes at once.
SGLANG_PAGES_PER_CALL = 128
# A page of 16 tokens of an 8-layer model with 8 KV heads of 128 bf16 values:
# two 256 KiB segments (K and V) per page.
SGLANG_GEOMETRY = {"page_size": 16, "layer_num": 8, "head_num": 8, "head_dim": 128}
# A Mamba state slot of an 8-layer hybrid model: an fp32 SSM state of 8
# heads x 64 x 64 (128 KiB) and a bf16 conv state of 3 x 2048 (12 KiB) a
# layer, 1.1 MiB a slot; 32 slots a call.
MAMBA_GEOMETRY = {"layer_num": 8, "temporal": (8, 64, 64), "conv": (3, 2048)}
MAMBA_SLOTS_PER_CALL = 32
# LMCache chunks of 256 tokens, 8 layers, 2 KV heads of 64 bf16 values: 1 MiB.
LMCACHE_CHUNK_TOKENS = 256
LMCACHE_KV_SHAPE = (8, 2, LMCACHE_CHUNK_TOKENS, 2, 64)
LMCACHE_CHUNKS_PER_CALL = 64
LMCACHE_TIMEOUT_S = 30
LMCACHE_CLOSE_TIMEOUT_S = 5
MODEL = "gdrkv-bench/model"
_TMPFS = "/dev/shm" if os.path.isdir("/dev/shm") else None
OPS = ("set", "exists", "get")


def available(stores):
    """[(engine, system)] that can run here, and {engine: reason} for the
    engines that cannot; stores are peers.open_stores()'s."""
    # LMCache logs every backend it builds at INFO, over the progress bar.
    os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")
    runnable, reasons = [], {}
    # gdrkv runs over every transport the raw comparison could open.
    gdrkv = [name for name, store in stores.items()
             if name.startswith("gdrkv ") and not isinstance(store, str)]
    for engine, module, peer in (("sglang", "sglang.srt.mem_cache.hicache_storage", "file"),
                                 ("sglang-mamba", "sglang.srt.mem_cache.hicache_storage", "file"),
                                 ("lmcache", "lmcache.v1.storage_backend", "redis")):
        try:
            __import__(module)
        except ImportError:
            reasons[engine] = "not installed (tests/install_engines.sh)"
            continue
        runnable += [(engine, system) for system in gdrkv]
        if peer == "redis" and isinstance(stores["redis"], str):
            reasons[f"{engine} redis"] = stores["redis"]
        else:
            runnable.append((engine, peer))
        if engine == "lmcache":
            runnable.append((engine, "lm"))
        elif isinstance(stores["mooncake tcp"], str):
            reasons[f"{engine} mooncake"] = stores["mooncake tcp"]
        else:
            # SGLang's own Mooncake backend, on the cluster the raw
            # comparison started (its master and segment holder).
            why = _sglang_mooncake_missing()
            if why:
                reasons[f"{engine} mooncake"] = why
            else:
                runnable.append((engine, "mooncake"))
    return runnable, reasons


def _sglang_mooncake_missing():
    """Why SGLang's Mooncake backend cannot be imported here, or None."""
    try:
        __import__("sglang.srt.mem_cache.storage.mooncake_store.mooncake_store")
    except ImportError as e:
        # Its module pulls in SGLang's model configs, which import
        # torchvision; PyPI has no CPU torchvision for CPU torch, and
        # tests/stand_ins holds an import-only one for such machines.
        return (f"not importable: {e} (on a CPU-only machine, run with "
                "PYTHONPATH=tests/stand_ins)")
    return None


def run(url, stores, runnable, args, progress, logs):
    """Measures every (engine, system) of runnable: (result rows, {"engine
    system": why it failed}). A peer engine's failure must not cost the
    rest of the comparison, so each is caught and reported instead."""
    results, failures = [], {}
    for engine, system in runnable:
        measure = {"sglang": _sglang, "sglang-mamba": _sglang_mamba}.get(engine, _lmcache)
        try:
            results += measure(url, stores, system, args, progress, logs)
        except Exception as e:  # noqa: BLE001 (whatever the engine raises)
            failures[f"{engine} {system}"] = f"failed: {e!r}"
    return results, failures


def _transport(system):
    """"tcp" of "gdrkv tcp"."""
    return system.split()[1]


def _rounds(engine, system, page_bytes, batch_pages, batches, args, progress):
    """Times batches["set"/"exists"/"get"](j); result rows in pages/s."""
    rows = []
    for op in OPS:
        batch, max_batches, reset = batches[op]

        def after_round(label=f"{engine} {system} {op}"):
            progress.step(label)

        rounds, latencies = measure(batch, args.repeat, max_batches, reset, after_round)
        pages_per_s = statistics.median(n * batch_pages / s for n, s in rounds)
        rows.append({"engine": engine, "system": system, "op": op, "page_bytes": page_bytes,
                     "pages_per_call": batch_pages, "pages_per_s": pages_per_s,
                     "gb_per_s": pages_per_s * page_bytes / 1e9 if op != "exists" else None,
                     "call_ms_p50": statistics.median(latencies) * 1e3})
    return rows


# ---------------------------------------------------------------- SGLang

class PageFirstHostPool:
    """SGLang's MHA host pool in the page_first layout, on CPU: kv_buffer is
    (2, tokens, layers, heads, head_dim), and a page's K and V are each one
    contiguous run of page_size tokens."""

    layout = "page_first"

    def __init__(self, pages, page_size, layer_num, head_num, head_dim):
        import torch
        self.page_size, self.layer_num = page_size, layer_num
        self.head_num, self.head_dim = head_num, head_dim
        self.page_num, self.size, self.dtype = pages, pages * page_size, torch.bfloat16
        self.device = "cpu"
        self.kv_buffer = torch.randint(-(1 << 15), 1 << 15, (2, self.size, layer_num, head_num,
                                       head_dim), dtype=torch.int16).view(self.dtype)

    def get_ksize_per_token(self):
        return self.layer_num * self.head_num * self.head_dim * self.dtype.itemsize

    def get_page_buffer_meta(self, indices):
        token_bytes = self.layer_num * self.head_num * self.head_dim * self.dtype.itemsize
        v_offset = self.size * token_bytes
        base, ptrs = self.kv_buffer.data_ptr(), []
        for first in indices.tolist()[::self.page_size]:
            ptrs += [base + first * token_bytes, base + first * token_bytes + v_offset]
        return ptrs, [self.page_size * token_bytes] * len(ptrs)

    def get_data_page(self, index, flat=True):
        page = self.kv_buffer[:, index:index + self.page_size]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        import torch
        return torch.zeros(2 * self.page_size * self.layer_num * self.head_num * self.head_dim,
                           dtype=self.dtype)

    def set_from_flat_data_page(self, index, data_page):
        self.kv_buffer[:, index:index + self.page_size] = data_page.reshape(
            2, self.page_size, self.layer_num, self.head_num, self.head_dim)

    def first_indices(self, pages):
        """host_indices for the given page numbers, as SGLang passes them."""
        import torch
        return torch.cat([torch.arange(p * self.page_size, (p + 1) * self.page_size)
                          for p in pages])

    def same_pages(self, a, b):
        # Compared as integers: random bits include NaNs, never equal as floats.
        def bits(page):
            return self.get_data_page(page * self.page_size).view(torch.int16)
        import torch
        return all(bits(p).equal(bits(q)) for p, q in zip(a, b))


class _ZeroCopyPages:
    """What SGLang's cache controller calls on a backend with interface_v1."""

    def __init__(self, backend):
        self.backend = backend

    def set(self, keys, indices):
        return all(self.backend.batch_set_v1(keys, indices))

    def get(self, keys, indices):
        return all(self.backend.batch_get_v1(keys, indices))

    def exists(self, keys):
        return self.backend.batch_exists(keys)


class _CopiedPages:
    """What the controller calls on a backend without it (its
    _generic_page_set and _generic_page_get): flat page copies."""

    def __init__(self, backend, pool):
        self.backend, self.pool = backend, pool

    def set(self, keys, indices):
        page = self.pool.page_size
        return self.backend.batch_set(
            keys, [self.pool.get_data_page(indices[i * page]) for i in range(len(keys))])

    def get(self, keys, indices):
        pages = self.backend.batch_get(keys, [self.pool.get_dummy_flat_data_page()
                                              for _ in keys])
        if pages is None or any(p is None for p in pages):
            return False
        for i, data in enumerate(pages):
            self.pool.set_from_flat_data_page(int(indices[i * self.pool.page_size]), data)
        return True

    def exists(self, keys):
        return self.backend.batch_exists(keys)


def _sglang(url, stores, system, args, progress, logs):
    npages = min(args.count, SGLANG_PAGES_PER_CALL)
    # Pages [0, npages) are stored; gets land in [npages, 2 npages).
    pool = PageFirstHostPool(2 * npages, **SGLANG_GEOMETRY)
    with contextlib.ExitStack() as stack:
        backend = _sglang_backend(stack, system, url)
        backend.register_mem_pool_host(pool)
        return _sglang_rounds(system, backend, kv_pages(system, backend, pool), pool, npages,
                              args, progress)


def kv_pages(system, backend, pool):
    """How the controller moves KV pages with this backend: zero copy where
    it has v1 methods (gdrkv, Mooncake), flat copies for the file backend."""
    return _CopiedPages(backend, pool) if system == "file" else _ZeroCopyPages(backend)


def sglang_config(extra, model=MODEL):
    """The HiCacheStorageConfig of one TP rank of an MHA model with this
    extra config, as SGLang builds it for a storage backend."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=model, extra_config=extra)


def _sglang_backend(stack, system, url):
    """GdrkvHiCacheStorage over system's transport, or HiCacheFile in a
    fresh folder; closed or removed when stack closes."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    from ..adapters.sglang_hicache import GdrkvHiCacheStorage

    if system.startswith("gdrkv "):
        backend = GdrkvHiCacheStorage(sglang_config({
            "interface_v1": 1, "url": url, "transport": _transport(system),
            "namespace": f"gdrkv-compare-sglang-{os.getpid()}"}), {})
        stack.callback(backend.close)
        return backend
    if system == "mooncake":
        from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

        # No segment of its own: objects go to the segment holder's, as the
        # raw Mooncake rows' do.
        return MooncakeStore(sglang_config({
            "master_server_address": MOONCAKE_MASTER, "metadata_server": MOONCAKE_METADATA,
            "protocol": "tcp", "global_segment_size": 0, "local_hostname": "127.0.0.1",
            "check_server": False}))
    # On tmpfs where there is one: the file backend at memory speed, as its
    # users who benchmark it run it.
    folder = tempfile.mkdtemp(prefix="gdrkv-compare-hicache-", dir=_TMPFS)
    stack.callback(shutil.rmtree, folder, ignore_errors=True)
    return HiCacheFile(sglang_config({"file_storage_path": folder}))


def _sglang_rounds(system, backend, pages, pool, npages, args, progress, engine="sglang"):
    page_bytes = sum(pool.get_page_buffer_meta(pool.first_indices([0]))[1])
    stored_pages, landing_pages = range(npages), range(npages, 2 * npages)
    source, landing = pool.first_indices(stored_pages), pool.first_indices(landing_pages)
    # Fresh page hashes for every call of a round: SGLang never stores a page twice.
    window = max(2, (256 << 20) // (npages * page_bytes))
    keys = [[f"{j:08x}{i:056x}" for i in range(npages)] for j in range(window)]

    def expect(ok, what):
        if not ok:
            raise RuntimeError(f"sglang {system}: {what} failed")

    def set_batch(j):
        expect(pages.set(keys[j], source), "set")

    def reset():
        expect(backend.clear() is not False, "clear")       # Mooncake's returns None
        set_batch(0)            # what exists and get read
        if hasattr(pages, "stored"):
            expect(pages.stored(keys[0]), "the KV pages under the side pool's")

    def exists_batch(j):
        expect(pages.exists(keys[0]) == npages, "exists")

    def get_batch(j):
        expect(pages.get(keys[0], landing), "get")

    rows = _rounds(engine, system, page_bytes, npages, {
        "set": (lambda j: set_batch(j + 1), window - 1, reset),
        "exists": (exists_batch, float("inf"), None),
        "get": (get_batch, float("inf"), None)}, args, progress)
    expect(pool.same_pages(stored_pages, landing_pages), "the byte check of the pages read")
    backend.clear()
    return rows


class MambaStateHostPool:
    """SGLang's MambaPoolHost in the page_first layout, on CPU: one state
    slot a page, each slot's SSM (temporal) state and conv state contiguous
    runs of their buffers, and the flat page form HiCacheFile copies."""

    layout = "page_first"
    page_size = 1

    def __init__(self, slots, layer_num, temporal, conv):
        import torch
        self.size, self.dtype = slots, torch.bfloat16
        self.temporal_buffer = torch.randn(slots, layer_num, 1, *temporal, dtype=torch.float32)
        self.conv_buffer = [torch.randn(slots, layer_num, 1, *conv, dtype=torch.bfloat16)]
        self.kv_buffer = [self.temporal_buffer, *self.conv_buffer]

    def get_hybrid_pool_buffer(self):
        return self.kv_buffer

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        for slot in indices.tolist():
            for buffer in self.kv_buffer:
                ptrs.append(buffer[slot].data_ptr())
                sizes.append(buffer[slot].nbytes)
        return ptrs, sizes

    def get_data_page(self, index, flat=True):
        import torch
        return torch.cat([b[index].flatten().view(torch.uint8) for b in self.kv_buffer])

    def get_dummy_flat_data_page(self):
        import torch
        return torch.empty(sum(b[0].nbytes for b in self.kv_buffer), dtype=torch.uint8)

    def set_from_flat_data_page(self, index, data_page):
        import torch
        start = 0
        for buffer in self.kv_buffer:
            n = buffer[index].nbytes
            buffer[index].view(-1).view(torch.uint8).copy_(data_page[start:start + n])
            start += n

    def first_indices(self, slots):
        import torch
        return torch.tensor(list(slots), dtype=torch.int64)

    def same_pages(self, a, b):
        return all(self.get_data_page(p).equal(self.get_data_page(q)) for p, q in zip(a, b))


class _SidePoolPages:
    """What the hybrid controller calls for a side pool: batch_set_v2 and
    batch_get_v2 of one PoolTransfer, batch_exists_v2 with its policy."""

    def __init__(self, backend, kv_pages, kv_pool):
        from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer
        self.backend, self.name = backend, PoolName.MAMBA
        self.kv_pages, self.kv_pool = kv_pages, kv_pool
        self.transfer = lambda keys, indices: [PoolTransfer(
            name=self.name, host_indices=indices, keys=keys,
            hit_policy=PoolHitPolicy.TRAILING_PAGES)]

    def stored(self, keys):
        """Stores the KV pages of keys (copies of one page) the way the
        controller does: a state counts only where its prefix's KV pages
        exist."""
        return self.kv_pages.set(keys, self.kv_pool.first_indices([0] * len(keys)))

    def set(self, keys, indices):
        return all(self.backend.batch_set_v2(self.transfer(keys, indices))[self.name])

    def get(self, keys, indices):
        return all(self.backend.batch_get_v2(self.transfer(keys, indices))[self.name])

    def exists(self, keys):
        # The KV pages are not what is measured: every prefix length whose
        # state exists is restorable when the KV pages exist too.
        found = self.backend.batch_exists_v2(keys, self.transfer(keys[-1:], None))
        return found.extra_pool_hit_pages.get(self.name, 0)


def _sglang_mamba(url, stores, system, args, progress, logs):
    from sglang.srt.mem_cache.hicache_storage import PoolName

    nslots = min(args.count, MAMBA_SLOTS_PER_CALL)
    pool = MambaStateHostPool(2 * nslots, **MAMBA_GEOMETRY)
    # Every stored slot's KV page exists, as where the controller checks a
    # state: the side pool's policy decides.
    kv_pool = PageFirstHostPool(2, **SGLANG_GEOMETRY)
    with contextlib.ExitStack() as stack:
        backend = _sglang_backend(stack, system, url)
        backend.register_mem_pool_host(kv_pool)
        backend.register_mem_host_pool_v2(kv_pool, PoolName.KV)
        backend.register_mem_host_pool_v2(pool, PoolName.MAMBA)
        pages = _SidePoolPages(backend, kv_pages(system, backend, kv_pool), kv_pool)
        return _sglang_rounds(system, backend, pages, pool, nslots, args, progress,
                              engine="sglang-mamba")


# ---------------------------------------------------------------- LMCache

def _lmcache(url, stores, system, args, progress, logs):
    nchunks = min(args.count, LMCACHE_CHUNKS_PER_CALL)
    with contextlib.ExitStack() as stack:
        if system.startswith("gdrkv "):
            namespace = f"gdrkv-compare-lmcache-{os.getpid()}"
            target = {"plugin": f"{url}?namespace={namespace}&transport={_transport(system)}"}
            clear = _gdrkv_clearer(url, namespace)
        elif system == "lm":
            target = {"remote_url": f"lm://127.0.0.1:{lmcache_server(stack, logs)}"}
            # The lm:// server can't be emptied; a put of a key it holds
            # replaces the value, which costs what a fresh put does.
            clear = _nothing
        else:
            target = {"remote_url": f"redis://127.0.0.1:{redis_port(stores['redis'])}"}
            clear = stores["redis"].redis.flushdb
        with _LMCacheWorker(target, nchunks) as worker:
            return _lmcache_rounds(system, worker, clear, nchunks, args, progress)


def _nothing():
    pass


def _gdrkv_clearer(url, namespace):
    from ..client import Client

    def clear():
        with Client(url, namespace=namespace) as client:
            client.clear()
    return clear


class _LMCacheWorker:
    """One LMCache worker's storage backends, built from LMCache's config
    as an engine builds them, and a set of chunks to move."""

    def __init__(self, target, nchunks):
        import torch
        from lmcache.utils import start_loop_in_thread_with_exceptions
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.memory_management import MemoryFormat
        from lmcache.v1.metadata import LMCacheMetadata
        from lmcache.v1.storage_backend import CreateStorageBackends
        from lmcache.v1.token_database import ChunkedTokenDatabase

        self.torch = torch
        chunk_bytes = 2 * int(torch.tensor(LMCACHE_KV_SHAPE).prod())
        extra, settings = {"save_chunk_meta": False}, {}
        if "plugin" in target:
            prefix = "remote_storage_plugin.gdrkv."
            extra.update({prefix + "module_path": "gdrkv.adapters.lmcache",
                          prefix + "class_name": "GdrkvConnectorAdapter",
                          prefix + "url": target["plugin"]})
            settings["remote_storage_plugins"] = ["gdrkv"]
        else:
            settings["remote_url"] = target["remote_url"]
        # Room for the chunks put and those a get allocates, twice over.
        buffer_gib = 4 * nchunks * chunk_bytes / (1 << 30)
        config = LMCacheEngineConfig.from_defaults(
            chunk_size=LMCACHE_CHUNK_TOKENS, local_cpu=False, max_local_cpu_size=buffer_gib,
            remote_serde="naive", extra_config=extra, save_unfull_chunk=True,
            blocking_timeout_secs=LMCACHE_TIMEOUT_S, **settings)
        self.metadata = LMCacheMetadata(
            model_name=MODEL, world_size=1, local_world_size=1, worker_id=0,
            local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=LMCACHE_KV_SHAPE,
            use_mla=False, chunk_size=LMCACHE_CHUNK_TOKENS)
        # LMCache's storage event loop, on its own thread as in the engine.
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=start_loop_in_thread_with_exceptions,
                                       args=(self.loop,), daemon=True)
        self.thread.start()
        self.backends = CreateStorageBackends(config, self.metadata, self.loop)
        self.remote = next(b for name, b in self.backends.items()
                           if name.startswith("RemoteBackend"))
        self.local_cpu = self.backends["LocalCPUBackend"]
        self.token_db = ChunkedTokenDatabase(config, self.metadata)
        self.chunk_bytes, self.fmt = chunk_bytes, MemoryFormat.KV_2LTD
        self.chunks = [self._random_chunk() for _ in range(nchunks)]

    def _random_chunk(self):
        torch = self.torch
        obj = self.local_cpu.allocate(self.metadata.get_shapes(LMCACHE_CHUNK_TOKENS),
                                      self.metadata.get_dtypes(), self.fmt)
        obj.raw_data.view(torch.uint8).copy_(torch.randint(0, 256, (obj.get_size(),),
                                                           dtype=torch.uint8))
        return obj

    def keys(self, first_token, nchunks):
        tokens = self.torch.arange(first_token, first_token + nchunks * LMCACHE_CHUNK_TOKENS)
        return [key for _, _, key in self.token_db.process_tokens(tokens)]

    def put(self, keys):
        done, all_done = [], threading.Condition()

        def completed(key):
            with all_done:
                done.append(key)
                all_done.notify()

        self.remote.batched_submit_put_task(keys, self.chunks, on_complete_callback=completed)
        with all_done:
            if not all_done.wait_for(lambda: len(done) == len(keys), LMCACHE_TIMEOUT_S):
                raise RuntimeError(f"lmcache: {len(keys) - len(done)} puts did not complete")

    def get(self, keys, verify=False):
        objs = self.remote.batched_get_blocking(keys)
        try:
            if any(obj is None for obj in objs):
                raise RuntimeError(f"lmcache: {objs.count(None)} of {len(keys)} chunks missing")
            if verify and any(bytes(got.byte_array) != bytes(put.byte_array)
                              for got, put in zip(objs, self.chunks)):
                raise RuntimeError("lmcache: a chunk read back differs")
        finally:
            for obj in objs:
                if obj is not None:
                    obj.ref_count_down()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for obj in self.chunks:
            obj.ref_count_down()
        # lmcache 0.5.6's redis connector deadlocks in close(): it waits, on
        # the event loop, for a job that needs that loop. So closing gets a
        # bounded wait, and a loop stuck that way is left to the process exit.
        closing = threading.Thread(target=self._close_backends, daemon=True)
        closing.start()
        closing.join(LMCACHE_CLOSE_TIMEOUT_S)
        if closing.is_alive():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(LMCACHE_CLOSE_TIMEOUT_S)
        if not self.thread.is_alive():
            self.loop.close()

    def _close_backends(self):
        for backend in reversed(list(self.backends.values())):
            backend.close()


def _lmcache_rounds(system, worker, clear, nchunks, args, progress):
    # Fresh chunk keys for every call of a put round: a stored chunk is
    # never stored again.
    window = max(2, (256 << 20) // (nchunks * worker.chunk_bytes))
    keys = [worker.keys(j * nchunks * LMCACHE_CHUNK_TOKENS + 1, nchunks) for j in range(window)]

    def reset():
        clear()
        worker.put(keys[0])     # what exists and get read

    def exists_batch(j):
        found = worker.remote.batched_contains(keys[0])
        if found != nchunks:
            raise RuntimeError(f"lmcache {system}: {found} of {nchunks} chunks found")

    rows = _rounds("lmcache", system, worker.chunk_bytes, nchunks, {
        "set": (lambda j: worker.put(keys[j + 1]), window - 1, reset),
        "exists": (exists_batch, float("inf"), None),
        "get": (lambda j: worker.get(keys[0]), float("inf"), None)}, args, progress)
    worker.get(keys[0], verify=True)
    clear()
    return rows
