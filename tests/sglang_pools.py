"""SGLang host pools for CPU-only tests, running SGLang's own page code.

The real MHATokenToKVPoolHost and MLATokenToKVPoolHost cannot be imported
without a GPU stack (their modules pull in model configs, transformers and
torchvision). Their page methods are plain torch arithmetic, though, so this
module compiles those methods straight from the installed sglang package into
small duck-typed pools: buffer shapes, segment pointers and flat pages are
exactly SGLang 0.5.23's.

Run as a script it writes or checks pages through the adapter in a fresh
process (the restart and DP/TP/dtype tests of docs/keys.md):

    python tests/sglang_pools.py write|read URL NAMESPACE JSON_LIST_OF_SETTINGS
"""
import __future__
import ast
import collections
import dataclasses
import hashlib
import json
import os
import sys
import typing

import torch

import sglang

_SGLANG = os.path.dirname(sglang.__file__)
_PAGE_METHODS = ("init_kv_buffer", "get_page_buffer_meta", "get_data_page",
                 "set_from_flat_data_page", "get_dummy_flat_data_page")
MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")


def sglang_definitions(relpath, names, class_name=None):
    """{name: object} for the top-level definitions (or the methods of
    class_name) called names in sglang/relpath, compiled from its source."""
    path = os.path.join(_SGLANG, relpath)
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    body = tree.body
    if class_name:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == class_name).body
    found = [n for n in body if getattr(n, "name", None) in names]
    missing = set(names) - {n.name for n in found}
    assert not missing, f"sglang {relpath} has no {sorted(missing)}"
    namespace = {"torch": torch, "ALLOC_MEMORY_FUNCS": collections.defaultdict(
        lambda: _cpu_alloc), "_is_npu": False, "dataclass": dataclasses.dataclass,
        "field": dataclasses.field, "List": typing.List, "Optional": typing.Optional,
        "os": os, "json": json}
    code = compile(ast.Module(body=found, type_ignores=[]), path, "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)
    return {name: namespace[name] for name in names}


def _cpu_alloc(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
    return torch.empty(dims, dtype=dtype, device=device)


_MHA = sglang_definitions("srt/mem_cache/pool_host/mha.py",
                          _PAGE_METHODS + ("k_buffer", "v_buffer"), "MHATokenToKVPoolHost")
_MLA = sglang_definitions("srt/mem_cache/pool_host/mla.py",
                          _PAGE_METHODS + ("_storage_page_index",), "MLATokenToKVPoolHost")


class _HostPool:
    """The state SGLang's page methods read, for a CPU pool of `pages`
    pages of random bytes."""

    def __init__(self, layout, page_size, pages, layer_num, dtype):
        self.layout, self.page_size, self.layer_num, self.dtype = layout, page_size, layer_num, dtype
        self.page_num = pages
        self.size = self.logical_size = pages * page_size
        self.logical_page_size = page_size
        self.dcp_size = 1
        self.device, self.pin_memory, self.allocator = "cpu", False, None
        self._transfer_device = torch.device("cpu")

    def fill_random(self, seed):
        flat = self.kv_buffer.view(-1).view(torch.uint8)
        flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8,
                                 generator=torch.Generator().manual_seed(seed)))

    def page_bytes(self, page):
        """The bytes of page number `page`, in SGLang's flat page order."""
        return self.get_data_page(page * self.page_size).view(torch.uint8).numpy().tobytes()

    def indices(self, pages):
        """host_indices of the given page numbers, as SGLang passes them."""
        return torch.cat([torch.arange(p * self.page_size, (p + 1) * self.page_size)
                          for p in pages]).to(torch.int64)


MHAHostPool = type("MHAHostPool", (_HostPool,), dict(_MHA))
MLAHostPool = type("MLAHostPool", (_HostPool,), dict(_MLA))


def mha_pool(layout, page_size, pages=8, layer_num=2, head_num=2, head_dim=8,
             dtype=torch.bfloat16, seed=0):
    pool = MHAHostPool(layout, page_size, pages, layer_num, dtype)
    pool.head_num, pool.head_dim = head_num, head_dim
    pool.kv_buffer = pool.init_kv_buffer()
    pool.fill_random(seed)
    return pool


def mla_pool(layout, page_size, pages=8, layer_num=2, kv_cache_dim=24,
             dtype=torch.bfloat16, seed=0):
    pool = MLAHostPool(layout, page_size, pages, layer_num, dtype)
    pool.kv_cache_dim = kv_cache_dim
    pool.kv_buffer = pool.init_kv_buffer()
    pool.fill_random(seed)
    return pool


def storage_config(*, model="meta-llama/Llama-3.1-8B-Instruct", mla=False, tp_rank=0,
                   tp_size=1, dp_rank=0, pp_rank=0, pp_size=1, dcp_size=1,
                   logical_page_size=None, metrics=False, extra=None):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

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
    function behind get_storage_hash_str, importable on CPU)."""
    from sglang.srt.mem_cache.cpp_utils.native_hash import get_native_hash

    return get_native_hash(tokens, None, page_size)


# ---------------------------------------------------------------- subprocess

def _fresh_process(mode, url, namespace, runs):
    """For each settings dict in runs: writes pages 0..n-1 of a pool seeded
    by the page hashes, or reads them into a zeroed pool and reports which
    arrived byte-exact."""
    from gdrkv.adapters.sglang_hicache import GdrkvHiCacheStorage

    report = []
    for settings in runs:
        mla = settings["mla"]
        make = mla_pool if mla else mha_pool
        hashes = page_hashes(settings["tokens"], settings["page_size"])
        pool = make(settings["layout"], settings["page_size"], pages=len(hashes),
                    dtype=getattr(torch, settings["dtype"]),
                    seed=int(hashlib.sha256(hashes[0].encode()).hexdigest()[:8], 16))
        expected = [pool.page_bytes(p) for p in range(len(hashes))]
        config = storage_config(mla=mla, tp_rank=settings["tp_rank"],
                                tp_size=settings["tp_size"], dp_rank=settings["dp_rank"],
                                extra=extra_config(url, namespace=namespace))
        backend = GdrkvHiCacheStorage(config, {})
        if mode == "read":
            pool.kv_buffer.zero_()
        backend.register_mem_pool_host(pool)
        indices = pool.indices(range(len(hashes)))
        if mode == "write":
            report.append(backend.batch_set_v1(hashes, indices))
        else:
            report.append([ok and pool.page_bytes(p) == expected[p]
                           for p, ok in enumerate(backend.batch_get_v1(hashes, indices))])
        backend.close()
    print(json.dumps(report))


if __name__ == "__main__":
    _fresh_process(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
