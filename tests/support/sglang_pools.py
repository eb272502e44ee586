"""SGLang's real host pools and HiCache controller, on a CPU-only machine.

The pools are SGLang 0.5.23's own MHATokenToKVPoolHost and
MLATokenToKVPoolHost, built the way SGLang's pool assembler builds them:
over a CPU MHATokenToKVPool / MLATokenToKVPool device pool, from its
buffer info. Only pin_memory is off (pinning needs CUDA). The controller is
SGLang's HiCacheController, whose backup and prefetch threads call the
storage backend as a running server does. tests/install_engines.sh installs
what they import; torchvision comes from tests/stand_ins (engines.py).

Run as a script it writes or checks pages through the adapter in a fresh
process (the restart and DP/TP/dtype tests of docs/keys.md):

    python tests/support/sglang_pools.py write|read URL NAMESPACE JSON_LIST_OF_SETTINGS
"""
import hashlib
import importlib
import json
import sys
import threading

import torch

from support import engines

engines.torchvision_stand_in()
from sglang.srt.mem_cache.cpp_utils.native_hash import get_native_hash  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402


def _sglang(module, name):
    """SGLang's pool and controller classes, imported on first use: they
    pull in SGLang's model stack, which the key tests' fresh processes
    (tests/engines/test_keys.py) need not load."""
    return getattr(importlib.import_module("sglang.srt." + module), name)


# Every layout whose pages SGLang's host pools can hand to an L3 backend
# (get_page_buffer_meta): MLA has no page_head, and page_unified and MLA's
# page_first_kv_split (DSA indexer pools) have no L3 page form.
MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
DEVICE_PAGES = 2          # the device pool only lends its geometry


def _device_mha(page_size, layer_num, head_num, head_dim, dtype):
    pool = _sglang("mem_cache.memory_pool", "MHATokenToKVPool")
    return pool(DEVICE_PAGES * page_size, page_size, dtype, head_num=head_num,
                head_dim=head_dim, layer_num=layer_num, device="cpu",
                enable_memory_saver=False, start_layer=0, end_layer=layer_num - 1)


def _device_mla(page_size, layer_num, kv_lora_rank, qk_rope_head_dim, dtype):
    pool = _sglang("mem_cache.memory_pool", "MLATokenToKVPool")
    return pool(DEVICE_PAGES * page_size, page_size, dtype, kv_lora_rank=kv_lora_rank,
                qk_rope_head_dim=qk_rope_head_dim, layer_num=layer_num, device="cpu",
                enable_memory_saver=False, start_layer=0, end_layer=layer_num - 1)


def _host_args(device, page_size, pages, layout):
    return dict(host_to_device_ratio=1.0, host_size=0, page_size=page_size, layout=layout,
                pin_memory=False, device_capacity_tokens=device.size,
                start_layer=device.start_layer, end_layer=device.end_layer,
                host_token_capacity=pages * page_size)


def device_and_host(attention, layout, page_size, pages=8, layer_num=2, dtype=torch.bfloat16,
                    seed=0):
    """(device pool, host pool) of SGLang's own classes; the host pool has
    `pages` pages of seeded random bytes. MHA: 2 heads of 8; MLA: a
    kv_lora_rank of 16 and a rope dimension of 8."""
    if attention == "mla":
        device = _device_mla(page_size, layer_num, 16, 8, dtype)
        host_pool = _sglang("mem_cache.pool_host.mla", "MLATokenToKVPoolHost")
        host = host_pool(device.get_device_pool_infos()[0].buffer_info,
                         target_layer_num=device.layer_num,
                         override_kv_cache_dim=device.kv_cache_dim,
                         **_host_args(device, page_size, pages, layout))
    else:
        device = _device_mha(page_size, layer_num, 2, 8, dtype)
        host_pool = _sglang("mem_cache.pool_host.mha", "MHATokenToKVPoolHost")
        host = host_pool(device.get_device_pool_infos()[0].buffer_info,
                         write_back_staging=device.hicache_write_back_staging,
                         **_host_args(device, page_size, pages, layout))
    fill_random(host, seed)
    return device, host


def mha_pool(layout, page_size, **kwargs):
    """A real MHATokenToKVPoolHost (device_and_host)."""
    return device_and_host("mha", layout, page_size, **kwargs)[1]


def mla_pool(layout, page_size, **kwargs):
    """A real MLATokenToKVPoolHost (device_and_host)."""
    return device_and_host("mla", layout, page_size, **kwargs)[1]


def make_pool(attention, layout, page_size, **kwargs):
    return device_and_host(attention, layout, page_size, **kwargs)[1]


def fill_random(pool, seed):
    """Seeded random bytes in every buffer of the pool (the KV buffer, or a
    side pool's state, indexer or compressed buffers)."""
    generator = torch.Generator().manual_seed(seed)
    buffers = pool.get_hybrid_pool_buffer() if hasattr(pool, "get_hybrid_pool_buffer") \
        else [pool.kv_buffer]
    for buffer in buffers:
        flat = buffer.view(-1).view(torch.uint8)
        flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, generator=generator))


def zero(pool):
    buffers = pool.get_hybrid_pool_buffer() if hasattr(pool, "get_hybrid_pool_buffer") \
        else [pool.kv_buffer]
    for buffer in buffers:
        buffer.zero_()


# ---------------------------------------------------------------- side pools
#
# The HiCache v2 side pools of hybrid models, SGLang's own classes built on
# CPU tensors the way its pool assembler builds them.

def mamba_pool(slots=8, layers=2, seed=0, conv_states=2, temporal_dtype=torch.float32,
               conv_dtype=torch.bfloat16):
    """A MambaPoolHost (page_first, one state slot a page) over device
    state of `layers` layers: an SSM (temporal) state of 4x8 and
    conv_states conv states of 6x3."""
    info = _sglang("mem_cache.device_pool_info", "MambaStateBufferInfo")(
        temporal=torch.zeros(layers, slots, 4, 8, dtype=temporal_dtype),
        conv=tuple(torch.zeros(layers, slots, 6, 3, dtype=conv_dtype)
                   for _ in range(conv_states)))
    pool = _sglang("mem_cache.pool_host.mamba", "MambaPoolHost")(
        info, 1.0, 0, device_capacity=slots, pin_memory=False, layout="page_first")
    fill_random(pool, seed)
    return pool


def dsa_pools(page_size, pages=8, layer_num=2, seed=0, layout="page_first"):
    """(device pool, MLA KV host pool, DSA indexer host pool) of a DeepSeek-V3.2-style
    model: the indexer pool rides on the KV pool's pages (indices_from_pool
    KV) with 128-wide index keys and their scales per token and layer."""
    device_pool = _sglang("mem_cache.memory_pool", "DSATokenToKVPool")
    parallel = _sglang("runtime_context", "get_parallel")()
    with parallel.override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_dcp_size=1,
                           attn_dcp_rank=0):
        device = device_pool(DEVICE_PAGES * page_size, page_size, 16, torch.bfloat16, 8,
                             layer_num, "cpu", 128, False, 24, start_layer=0,
                             end_layer=layer_num - 1)
    host_pool = _sglang("mem_cache.pool_host.mla", "MLATokenToKVPoolHost")
    kv = host_pool(device.get_device_pool_infos()[0].buffer_info,
                   target_layer_num=device.layer_num, override_kv_cache_dim=device.kv_cache_dim,
                   **_host_args(device, page_size, pages, layout))
    decl = _sglang("mem_cache.pool_host.dsa", "make_dsa_indexer_pool_decl")(device)
    indexer = _sglang("mem_cache.pool_host.dsa", "DSAIndexerPoolHost")(decl, kv,
                                                                      pin_memory=False)
    fill_random(kv, seed)
    fill_random(indexer, seed + 1)
    return device, kv, indexer


def deepseek_v4_pools(names, page_size=4, pages=8, seed=0):
    """(logical anchor, {name: DeepSeekV4PagedHostPool}) as SGLang builds
    DeepSeek V4's HiCache: the anchor holds page indices only, each
    compressed pool a 128-byte row per page and layer (two layers)."""
    anchor = _sglang("mem_cache.memory_pool_host", "LogicalHostPool")(
        pages * page_size, page_size, "page_first")
    paged = _sglang("mem_cache.memory_pool_host", "DeepSeekV4PagedHostPool")
    pools = {}
    for i, name in enumerate(names):
        pools[name] = paged(name, [torch.zeros(DEVICE_PAGES, 256, dtype=torch.uint8)
                                   for _ in range(2)],
                            item_bytes=64, num_host_pages=pages, slot_page_size=page_size,
                            layout="page_first", pin_memory=False)
        fill_random(pools[name], seed + i)
    return anchor, pools


def page_bytes(pool, page):
    """The bytes of page number `page`, in SGLang's own flat page order."""
    return pool.get_data_page(page * pool.page_size).view(torch.uint8).numpy().tobytes()


def indices(pool, pages):
    """host_indices of the given page numbers, as SGLang passes them."""
    return torch.cat([torch.arange(p * pool.page_size, (p + 1) * pool.page_size)
                      for p in pages]).to(torch.int64)


def storage_config(*, model="meta-llama/Llama-3.1-8B-Instruct", mla=False, tp_rank=0,
                   tp_size=1, dp_rank=0, pp_rank=0, pp_size=1, dcp_size=1,
                   logical_page_size=None, metrics=False, extra=None):
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size,
        attn_cp_rank=0, attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=metrics,
        is_page_first_layout=True, model_name=model, dp_rank=dp_rank,
        dcp_size=dcp_size, dcp_rank=tp_rank % dcp_size, logical_page_size=logical_page_size,
        extra_config=dict(extra or {}))


def extra_config(url, **options):
    return {"backend_name": "gdrkv", "module_path": "gdrkv.adapters.sglang_hicache",
            "class_name": "GdrkvHiCacheStorage", "interface_v1": 1, "url": url, **options}


def page_hashes(tokens, page_size):
    """SGLang's SHA-256 chain hashes of the full pages of tokens (the
    function behind the controller's get_storage_hash_str)."""
    return get_native_hash(tokens, None, page_size)


def hashes(n, page_size=4, salt=0):
    """The page hashes of n pages of distinct tokens (salt picks the tokens)."""
    return page_hashes([salt * 1_000_003 + t for t in range(n * page_size)], page_size)


# ---------------------------------------------------------------- controller

class Controller:
    """SGLang's HiCacheController over a host pool, with storage attached
    through the dynamic backend factory, driven the way SGLang's radix tree
    drives it (write_storage for backup; prefetch, then host indices and the
    prefetch buffer for a hit). One TP rank of tp_size, without process
    groups: each rank's hit counts are its own."""

    TIMEOUT_S = 60

    def __init__(self, attention, layout, page_size, extra, *, tp_rank=0, tp_size=1,
                 model="test/model", **pool_args):
        device, self.pool = device_and_host(attention, layout, page_size, **pool_args)
        allocator = _sglang("mem_cache.allocator.paged", "PagedTokenToKVPoolAllocator")(
            device.size, page_size, device.dtype, "cpu", device, False)
        controller = _sglang("managers.cache_controller", "HiCacheController")
        # The controller reads the rank from SGLang's parallel context when
        # it builds the storage config, here at attach.
        parallel = _sglang("runtime_context", "get_parallel")()
        with parallel.override(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
                               attn_dcp_size=1, attn_dcp_rank=0):
            self.cc = controller(allocator, self.pool, page_size, None, threading.Event(),
                                 storage_backend="dynamic", model_name=model,
                                 storage_backend_extra_config=extra)

    @property
    def backend(self):
        return self.cc.storage_backend

    def backup(self, tokens, pages):
        """Writes the pages of tokens held in host pages `pages` to storage
        through the backup thread; the tokens it reports stored."""
        page_size = self.pool.page_size
        self.cc.write_storage(indices(self.pool, pages), tokens,
                              hash_value=page_hashes(tokens, page_size))
        operation = self.cc.ack_backup_queue.get(timeout=self.TIMEOUT_S)
        return operation.completed_tokens

    def prefetch(self, tokens, pages):
        """Asks storage for tokens through the prefetch thread and lands the
        hit in host pages `pages`: (tokens the hit query found, tokens the
        transfer completed)."""
        operation = self.cc.prefetch("rid", tokens)
        hit = self.cc.prefetch_hit_queue.get(timeout=self.TIMEOUT_S)
        assert hit is operation
        found = operation.storage_hit_count
        if found == 0:
            return 0, 0
        operation.host_indices = indices(self.pool, pages[:found // self.pool.page_size])
        self.cc.prefetch_buffer.put(operation)
        completed = 0
        while True:
            ack = self.cc.ack_prefetch_queue.get(timeout=self.TIMEOUT_S)
            if ack.completed_req:
                return found, completed
            completed = ack.completed_tokens

    def close(self):
        self.cc.detach_storage_backend()


class HybridController(Controller):
    """SGLang's HybridCacheController (the hybrid models' controller) over a
    HostPoolGroup of a KV host pool and side pools {name: host pool},
    attached through the dynamic factory; backup and prefetch carry the
    side pools' PoolTransfers the way SGLang's radix tree builds them."""

    def __init__(self, device, kv, sides, extra, *, tp_rank=0, tp_size=1, model="test/model"):
        self.pool, self.sides = kv, sides
        group = _sglang("mem_cache.pool_host.group", "HostPoolGroup")
        entry = _sglang("mem_cache.pool_host.group", "PoolEntry")
        pools = group([entry(name="kv", host_pool=kv, device_pool=device,
                             layer_mapper=lambda i: i, is_primary_index_anchor=True),
                       *(entry(name=name, host_pool=pool, device_pool=None,
                               layer_mapper=lambda i: i) for name, pool in sides.items())])
        allocator = _sglang("mem_cache.allocator.paged", "PagedTokenToKVPoolAllocator")(
            device.size, kv.page_size, device.dtype, "cpu", device, False)
        controller = _sglang("mem_cache.hybrid_cache.hybrid_cache_controller",
                             "HybridCacheController")
        parallel = _sglang("runtime_context", "get_parallel")()
        with parallel.override(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
                               attn_dcp_size=1, attn_dcp_rank=0):
            self.cc = controller(allocator, pools, kv.page_size, None, threading.Event(),
                                 storage_backend="dynamic", model_name=model,
                                 storage_backend_extra_config=extra)

    def backup(self, tokens, pages, extra_pools):
        """Backs up the pages of tokens held in KV host pages `pages` and the
        side pools' transfers: (tokens stored, pages stored per side pool)."""
        self.cc.write_storage(indices(self.pool, pages), tokens,
                              hash_value=page_hashes(tokens, self.pool.page_size),
                              extra_pools=extra_pools)
        operation = self.cc.ack_backup_queue.get(timeout=self.TIMEOUT_S)
        return operation.completed_tokens, operation.pool_storage_result.extra_pool_hit_pages

    def prefetch(self, tokens, pages, extra_pools, side_indices):
        """Asks for tokens with the side pools' transfers and lands the hit in
        KV host pages `pages` and each side pool's host indices
        side_indices[name]: (tokens found, tokens completed, pages loaded
        per side pool)."""
        handle = _sglang("mem_cache.base_prefix_cache", "CacheRequestHandle")("rid", 0)
        operation = self.cc.prefetch(handle, tokens, extra_pools=extra_pools)
        assert self.cc.prefetch_hit_queue.get(timeout=self.TIMEOUT_S) is operation
        found = operation.storage_hit_count
        if found == 0:
            return 0, 0, {}
        operation.host_indices = indices(self.pool, pages[:found // self.pool.page_size])
        for transfer in operation.pool_transfers:
            if transfer.name in side_indices:
                transfer.host_indices = side_indices[transfer.name]
        self.cc.prefetch_buffer.put(operation)
        completed, loaded = 0, {}
        while True:
            ack = self.cc.ack_prefetch_queue.get(timeout=self.TIMEOUT_S)
            if ack.completed_tokens is not None:
                completed = ack.completed_tokens
            if ack.pool_hits:
                loaded = {name: n for name, n in ack.pool_hits.items() if n}
            if ack.completed_req:
                return found, completed, loaded


# ---------------------------------------------------------------- subprocess

def _fresh_process(mode, url, namespace, runs):
    """For each settings dict in runs: writes pages 0..n-1 of a pool seeded
    by the page hashes, and the Mamba state slot of each page (a hybrid
    model's side pool, through HiCache v2), or reads them into zeroed pools
    and reports which arrived byte-exact: [KV pages, Mamba states]."""
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    from gdrkv.adapters.sglang_hicache import GdrkvHiCacheStorage

    report = []
    for settings in runs:
        hashes = page_hashes(settings["tokens"], settings["page_size"])
        seed = int(hashlib.sha256(hashes[0].encode()).hexdigest()[:8], 16)
        pool = make_pool("mla" if settings["mla"] else "mha", settings["layout"],
                         settings["page_size"], pages=len(hashes),
                         dtype=getattr(torch, settings["dtype"]), seed=seed)
        states = mamba_pool(len(hashes), seed=seed + 1)
        expected = [[page_bytes(p, i) for i in range(len(hashes))] for p in (pool, states)]
        config = storage_config(mla=settings["mla"], tp_rank=settings["tp_rank"],
                                tp_size=settings["tp_size"], dp_rank=settings["dp_rank"],
                                extra=extra_config(url, namespace=namespace))
        backend = GdrkvHiCacheStorage(config, {})
        if mode == "read":
            zero(pool)
            zero(states)
        backend.register_mem_pool_host(pool)
        backend.register_mem_host_pool_v2(states, PoolName.MAMBA)
        host_indices = indices(pool, range(len(hashes)))
        mamba = [PoolTransfer(name=PoolName.MAMBA, keys=hashes,
                              host_indices=indices(states, range(len(hashes))))]
        if mode == "write":
            report.append([backend.batch_set_v1(hashes, host_indices),
                           backend.batch_set_v2(mamba)[PoolName.MAMBA]])
        else:
            done = [backend.batch_get_v1(hashes, host_indices),
                    backend.batch_get_v2(mamba)[PoolName.MAMBA]]
            report.append([[ok and page_bytes(p, i) == want[i] for i, ok in enumerate(oks)]
                           for p, oks, want in zip((pool, states), done, expected)])
        backend.close()
    print(json.dumps(report))


if __name__ == "__main__":
    _fresh_process(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
