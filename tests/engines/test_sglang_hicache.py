"""The SGLang HiCache backend against real gdrkv servers and the real
sglang==0.5.23 package (tests/install_engines.sh installs it): SGLang's own
host pools (MHATokenToKVPoolHost, MLATokenToKVPoolHost) in every layout it
can page, its HiCacheController's backup and prefetch threads, TP and DP
ranks, the dynamic factory, fail-soft when a server dies, concurrent
prefetch and backup threads, and pages that survive a restart of the engine
process (docs/keys.md). Pages are compared byte for byte."""
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from support import engines

engines.require("sglang.srt.mem_cache.hicache_storage")
engines.torchvision_stand_in()
import torch  # noqa: E402
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import (  # noqa: E402
    HybridCacheController)
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402
from sglang.srt.observability.metrics_collector import StorageMetrics  # noqa: E402

from support import sglang_pools as sp  # noqa: E402
from support.sglang_pools import hashes  # noqa: E402
from support.etcd import wait_members  # noqa: E402
from support.util import (TESTS_DIR, background, counted, run_threads, unique,  # noqa: E402
                          wait_for)
from gdrkv.adapters.sglang_hicache import GdrkvHiCacheStorage  # noqa: E402
from gdrkv.keys import engine_namespace  # noqa: E402

SERVER_MEMORY = "256MiB"
CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "sglang")
POOL_PAGES = 8


def attached(backend, pool):
    backend.register_mem_pool_host(pool)
    return backend


def same_pages(a, a_pages, b, b_pages):
    return [sp.page_bytes(a, p) == sp.page_bytes(b, q) for p, q in zip(a_pages, b_pages)]


def test_authenticated_server(server_factory, tmp_path):
    """An authenticated deployment: the extra config's token_file reaches
    gdrkv.Client; the pages round-trip. A backend without it stores and
    reads nothing."""
    token = tmp_path / "token"
    token.write_text("sglang-test-token-0123456789\n")
    token.chmod(0o600)
    store = server_factory(args=["--auth-token-file", str(token)])
    namespace = unique("auth")
    pools = [sp.make_pool("mha", sp.MHA_LAYOUTS[0], 16, seed=s) for s in (1, 2)]

    def backend(**options):
        extra = sp.extra_config(store.url, namespace=namespace, timeout_ms=3000, **options)
        return attached(GdrkvHiCacheStorage(sp.storage_config(extra=extra), {}),
                        pools[len(made)])

    made = []
    made.append(backend(token_file=str(token)))
    made.append(backend())
    try:
        writer, stranger = made
        keys = hashes(4, 16)
        assert writer.batch_set_v1(keys, sp.indices(pools[0], [1, 2, 3, 4])) == [True] * 4
        assert writer.batch_exists(keys) == 4
        assert stranger.batch_exists(keys) == 0
        assert stranger.batch_get_v1(keys, sp.indices(pools[1], [1, 2, 3, 4])) == [False] * 4
        assert stranger.batch_set_v1(hashes(2, 16, salt=9),
                                     sp.indices(pools[1], [5, 6])) == [False] * 2
        assert store.stats()["objects"] == 4 and store.stats()["auth_denied"] >= 1
    finally:
        for b in made:
            b.close()


# ---------------------------------------------------------------- layouts

LAYOUTS = ([("mha", layout) for layout in sp.MHA_LAYOUTS]
           + [("mla", layout) for layout in sp.MLA_LAYOUTS])


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("attention,layout", LAYOUTS)
def test_pages_round_trip_byte_exact(make_backend, attention, layout, page_size):
    writer_pool = sp.make_pool(attention, layout, page_size, seed=1)
    reader_pool = sp.make_pool(attention, layout, page_size, seed=2)
    writer = attached(make_backend(mla=attention == "mla"), writer_pool)
    reader = attached(make_backend(mla=attention == "mla"), reader_pool)
    keys = hashes(4, page_size)

    assert writer.batch_set_v1(keys, sp.indices(writer_pool, [1, 2, 3, 4])) == [True] * 4
    assert reader.batch_exists(keys) == 4
    # Other slots of another pool: the bytes move, not the slot numbers.
    assert reader.batch_get_v1(keys, sp.indices(reader_pool, [6, 0, 7, 3])) == [True] * 4
    assert same_pages(writer_pool, [1, 2, 3, 4], reader_pool, [6, 0, 7, 3]) == [True] * 4


def test_pages_round_trip_through_a_cluster_url(etcd, cluster_name, start_member):
    """url: gdrkv+etcd://... (#40): the backend's client finds the members in
    etcd; with replicas=2 each page is on both."""
    servers = [start_member(i) for i in range(2)]
    wait_members(etcd, cluster_name, servers)
    url = etcd.url(cluster_name, "gdrkv+etcd") + "?replicas=2"
    namespace = unique("cluster")
    pools = [sp.make_pool("mha", sp.MHA_LAYOUTS[0], 16, seed=s) for s in (1, 2)]
    made = [attached(GdrkvHiCacheStorage(sp.storage_config(extra=sp.extra_config(
        url, namespace=namespace)), {}), pool) for pool in pools]
    try:
        writer, reader = made
        keys = hashes(4, 16)
        assert writer.batch_set_v1(keys, sp.indices(pools[0], [1, 2, 3, 4])) == [True] * 4
        assert reader.batch_exists(keys) == 4
        assert reader.batch_get_v1(keys, sp.indices(pools[1], [5, 6, 7, 0])) == [True] * 4
        assert same_pages(pools[0], [1, 2, 3, 4], pools[1], [5, 6, 7, 0]) == [True] * 4
        assert [s.stats()["objects"] for s in servers] == [4, 4]
    finally:
        for backend in made:
            backend.close()


# ---------------------------------------------------------------- controller

@pytest.fixture
def make_controller(server):
    """make_controller(attention, layout, page_size=16, options=None, **pool
    and rank args) -> SGLang's HiCacheController with the backend attached
    through the dynamic factory, on the module's server in this test's
    namespace; detached (threads stopped, backend closed) at teardown."""
    namespace = unique("ns")
    controllers = []

    def make(attention, layout, page_size=16, options=None, **kwargs):
        extra = sp.extra_config(server.url, namespace=namespace, **(options or {}))
        controllers.append(sp.Controller(attention, layout, page_size, extra, **kwargs))
        return controllers[-1]

    yield make
    for controller in controllers:
        controller.close()


@pytest.mark.parametrize("interface", ["zero_copy", "copying"])
@pytest.mark.parametrize("attention,layout", LAYOUTS)
def test_controller_backs_up_and_prefetches_byte_exact(make_controller, attention, layout,
                                                       interface):
    """SGLang's own threads drive the backend: one controller's backup
    thread stores host pages, another's prefetch thread counts them
    (batch_exists) and lands them in other host slots. "zero_copy" is
    interface_v1 (batch_set_v1/batch_get_v1); "copying" is SGLang's legacy
    flat-page path (batch_set/batch_get, then set_from_flat_data_page)."""
    options = {"interface_v1": int(interface == "zero_copy")}
    writer = make_controller(attention, layout, options=options, seed=1)
    reader = make_controller(attention, layout, options=options, seed=2)
    zero_copy_calls = writer.cc.page_set_func == writer.cc._page_set_zero_copy
    assert zero_copy_calls == (interface == "zero_copy")
    tokens = list(range(16 * 5))

    assert writer.backup(tokens[:64], [1, 2, 3, 4]) == 64
    # One page more than was stored: the hit stops at the stored prefix.
    assert reader.prefetch(tokens, [7, 0, 5, 6, 3]) == (64, 64)
    assert same_pages(writer.pool, [1, 2, 3, 4], reader.pool, [7, 0, 5, 6]) == [True] * 4


def test_controller_tp_ranks(make_controller):
    """MHA: each TP rank backs up and prefetches its own shard of the same
    tokens. MLA: SGLang skips the backup on ranks other than 0, and every
    rank prefetches rank 0's one copy."""
    tokens = list(range(16 * 3))
    mha = [make_controller("mha", "page_first", tp_rank=r, tp_size=2, seed=r) for r in range(2)]
    for rank in mha:
        assert rank.backup(tokens, [0, 1, 2]) == 48
    for r in range(2):
        landing = make_controller("mha", "page_first", tp_rank=r, tp_size=2, seed=10 + r)
        assert landing.prefetch(tokens, [5, 6, 7]) == (48, 48)
        assert same_pages(mha[r].pool, [0, 1, 2], landing.pool, [5, 6, 7]) == [True] * 3

    mla = [make_controller("mla", "page_first", tp_rank=r, tp_size=2, seed=20 + r)
           for r in range(2)]
    assert mla[1].backup(tokens, [0, 1, 2]) == 0           # not the writer: skipped
    assert mla[0].prefetch(tokens, [5, 6, 7]) == (0, 0)
    assert mla[0].backup(tokens, [0, 1, 2]) == 48
    assert mla[1].prefetch(tokens, [5, 6, 7]) == (48, 48)
    assert same_pages(mla[0].pool, [0, 1, 2], mla[1].pool, [5, 6, 7]) == [True] * 3


def test_layout_without_pages_is_refused_at_attach(make_backend):
    """page_unified host pools have no L3 page form in SGLang: the attach
    fails loudly instead of storing something else."""
    pool = sp.mha_pool("page_unified", 16)
    with pytest.raises(ValueError, match="page_unified"):
        attached(make_backend(), pool)


def test_copying_interface_round_trips(make_backend):
    """Without interface_v1 SGLang copies flat pages through batch_set/batch_get."""
    source, dest = sp.mha_pool("layer_first", 16, seed=1), sp.mha_pool("layer_first", 16, seed=2)
    writer = attached(make_backend(options={"interface_v1": 0}), source)
    reader = attached(make_backend(options={"interface_v1": 0}), dest)
    keys = hashes(3, 16)

    assert writer.batch_set(keys, [source.get_data_page(p * 16) for p in range(3)])
    assert writer.set(keys[0], source.get_data_page(0))             # already there
    assert reader.batch_exists(keys + ["missing"]) == 3 and reader.exists(keys[2])
    targets = reader.batch_get(keys + ["missing"],
                               [dest.get_dummy_flat_data_page() for _ in range(4)])
    assert targets[3] is None and reader.get("missing", dest.get_dummy_flat_data_page()) is None
    for page, target in enumerate(targets[:3]):
        dest.set_from_flat_data_page((page + 4) * 16, target)
    assert same_pages(source, [0, 1, 2], dest, [4, 5, 6]) == [True] * 3
    # Zero-copy and copying objects are laid out differently: never mixed.
    assert attached(make_backend(), dest).batch_exists(keys) == 0


def test_mooncake_style_duck_pool(make_backend):
    """The minimal pool of SGLang's own backend tests (its Mooncake store
    test's MockHostKVCache): kv_buffer, layout, page_size and
    get_page_buffer_meta only. The adapter must not need more than that."""
    class MockHostKVCache:
        def __init__(self, buffer):
            self.kv_buffer, self.layout, self.page_size = buffer, "page_first", 1

        def get_page_buffer_meta(self, indices):
            ptrs = [self.kv_buffer[int(i) * 512 + half * 256:].data_ptr()
                    for i in indices for half in (0, 1)]
            return ptrs, [256 * self.kv_buffer.element_size()] * len(ptrs)

    source, dest = MockHostKVCache(torch.randn(8 * 512)), MockHostKVCache(torch.zeros(8 * 512))
    writer, reader = attached(make_backend(), source), attached(make_backend(), dest)
    keys = hashes(3, 1)
    assert writer.batch_set_v1(keys, torch.tensor([0, 1, 2])) == [True] * 3
    assert reader.batch_get_v1(keys, torch.tensor([5, 6, 7])) == [True] * 3
    assert torch.equal(source.kv_buffer[:3 * 512], dest.kv_buffer[5 * 512:])


def test_raw_pointer_forms(make_backend):
    """get/set/batch_get/batch_set with raw pointers and byte counts, as
    SGLang's Mooncake store test drives a backend (set, exists, get into
    another place, compared). Reads check the size; these objects never
    pass for pages."""
    pool = sp.mha_pool("page_first", 16)
    writer, reader = attached(make_backend(), pool), attached(make_backend(), pool)
    buffer = torch.randn(8 * 1024)
    size = 1024 * buffer.element_size()
    at = [buffer[i * 1024:].data_ptr() for i in range(8)]

    assert writer.set("single", target_location=at[0], target_sizes=size) is True
    assert reader.exists("single") is True and reader.exists("absent") is False
    assert reader.get("single", target_location=at[1], target_sizes=size) is True
    assert torch.equal(buffer[:1024], buffer[1024:2048])
    assert reader.get("single", target_location=at[2], target_sizes=size // 2) is False
    assert reader.get("absent", target_location=at[2], target_sizes=size) is False
    assert reader.batch_exists(["single"]) == 0                     # not a page

    buffer[:2048].copy_(torch.randn(2048))
    keys = ["raw-a", "raw-b"]
    assert writer.batch_set(keys, target_locations=[at[0], [at[1], at[1] + size // 2]],
                            target_sizes=[size, [size // 2, size // 2]]) is True
    assert reader.batch_get(keys + ["absent"], target_locations=at[4:7],
                            target_sizes=[size] * 3) == 2
    assert torch.equal(buffer[:2048], buffer[4096:6144])
    assert reader.batch_get(["absent"] + keys, at[4:7], [size] * 3) == 0
    # Mismatched pointers and sizes fail soft.
    assert writer.batch_set(keys, target_locations=at[:2], target_sizes=[size]) is False
    assert make_backend().set("k", target_location=at[0], target_sizes=size) is False  # no pool


# ---------------------------------------------------------------- ranks

def test_mha_tp_ranks_keep_their_own_shards(make_backend):
    pools = [sp.mha_pool("page_first", 16, seed=rank) for rank in range(4)]
    ranks = [attached(make_backend(tp_rank=r, tp_size=4), pools[r]) for r in range(4)]
    keys = hashes(2, 16)
    for rank in ranks:
        assert rank.batch_set_v1(keys, sp.indices(pools[0], [0, 1])) == [True, True]
    for r, rank in enumerate(ranks):
        landing = sp.mha_pool("page_first", 16, seed=99)
        assert attached(make_backend(tp_rank=r, tp_size=4), landing).batch_get_v1(
            keys, sp.indices(landing, [2, 3])) == [True, True]
        assert same_pages(pools[r], [0, 1], landing, [2, 3]) == [True, True]
    # The same rank of another TP size holds other bytes.
    assert attached(make_backend(tp_rank=0, tp_size=2), pools[0]).batch_exists(keys) == 0


def test_mla_ranks_share_one_rank_less_copy(make_backend):
    writer_pool = sp.mla_pool("page_first", 16, seed=1)
    keys = hashes(3, 16)
    writer = attached(make_backend(mla=True, tp_rank=0, tp_size=4), writer_pool)
    assert writer.batch_set_v1(keys, sp.indices(writer_pool, [0, 1, 2])) == [True] * 3
    for rank in range(1, 4):
        pool = sp.mla_pool("page_first", 16, seed=rank + 10)
        reader = attached(make_backend(mla=True, tp_rank=rank, tp_size=4), pool)
        assert reader.batch_get_v1(keys, sp.indices(pool, [5, 6, 7])) == [True] * 3
        assert same_pages(writer_pool, [0, 1, 2], pool, [5, 6, 7]) == [True] * 3
        # A non-writer rank's backup that arrives anyway changes nothing.
        assert reader.batch_set_v1(keys, sp.indices(pool, [0, 1, 2])) == [True] * 3


def test_dp_replicas_share_pages(make_backend):
    pools = [sp.mha_pool("page_first", 16, seed=s) for s in (1, 2)]
    replica0 = attached(make_backend(dp_rank=0, tp_rank=1, tp_size=2), pools[0])
    replica1 = attached(make_backend(dp_rank=1, tp_rank=1, tp_size=2), pools[1])
    keys = hashes(4, 16)
    assert replica0.batch_set_v1(keys, sp.indices(pools[0], [0, 1, 2, 3])) == [True] * 4
    assert replica1.batch_get_v1(keys, sp.indices(pools[1], [4, 5, 6, 7])) == [True] * 4
    assert same_pages(pools[0], [0, 1, 2, 3], pools[1], [4, 5, 6, 7]) == [True] * 4


def test_pipeline_stages_and_dtypes_do_not_mix(make_backend):
    pool = sp.mha_pool("page_first", 16)
    keys = hashes(2, 16)
    assert attached(make_backend(pp_rank=0, pp_size=2), pool).batch_set_v1(
        keys, sp.indices(pool, [0, 1])) == [True, True]
    assert attached(make_backend(pp_rank=1, pp_size=2), pool).batch_exists(keys) == 0
    fp16 = sp.mha_pool("page_first", 16, dtype=torch.float16)
    assert attached(make_backend(pp_rank=0, pp_size=2), fp16).batch_exists(keys) == 0


# ---------------------------------------------------------------- contract

def test_batch_exists_counts_the_leading_run(make_backend):
    pool = sp.mha_pool("page_first", 4)
    backend = attached(make_backend(), pool)
    keys = hashes(5, 4)
    backend.batch_set_v1([keys[i] for i in (0, 1, 3, 4)], sp.indices(pool, [0, 1, 3, 4]))
    assert backend.batch_exists(keys) == 2
    assert backend.batch_exists(keys[3:]) == 2
    assert backend.batch_exists([]) == 0


def test_one_request_per_server_per_call(server_factory):
    servers = [server_factory(memory="64MiB") for _ in range(2)]
    extra = sp.extra_config("gdrkv://" + ",".join(s.address for s in servers),
                            namespace=unique("ns"))
    pool = sp.mha_pool("page_first", 1, pages=128)
    backend = attached(GdrkvHiCacheStorage(sp.storage_config(extra=extra), {}), pool)
    keys = hashes(64, 1)
    # Over shm a put is a PUT_STAGED (values in staging), over tcp a PUT.
    calls = {("ops_put", "ops_put_staged"): lambda: backend.batch_set_v1(keys,
                                                                       sp.indices(pool, range(64))),
             ("ops_exists",): lambda: backend.batch_exists(keys),
             # Over shm a get is a LEASE (then its RELEASE), over tcp a GET.
             ("ops_get", "ops_lease"): lambda: backend.batch_get_v1(keys,
                                                                   sp.indices(pool, range(64, 128)))}

    def requests(server, counters):
        stats = server.stats()
        return sum(stats[c] for c in counters)

    try:
        for counters, call in calls.items():
            before = [requests(s, counters) for s in servers]
            call()
            moved = counted(lambda: [requests(s, counters) - b for s, b in zip(servers, before)],
                            [1, 1])
            assert moved == [1, 1], counters
    finally:
        backend.close()


def test_existing_pages_count_as_stored(make_backend):
    pool = sp.mha_pool("page_first", 16)
    backend = attached(make_backend(), pool)
    keys = hashes(3, 16)
    assert backend.batch_set_v1(keys[:2], sp.indices(pool, [0, 1])) == [True, True]
    assert backend.batch_set_v1(keys, sp.indices(pool, [0, 1, 2])) == [True] * 3


def test_bad_calls_fail_soft(make_backend):
    pool = sp.mha_pool("page_first", 16)
    backend = make_backend()
    keys = hashes(2, 16)
    assert backend.batch_get_v1(keys, sp.indices(pool, [0, 1])) == [False, False]   # no pool yet
    attached(backend, pool)
    assert backend.batch_set_v1(keys, sp.indices(pool, [0])) == [False, False]     # short indices
    assert backend.batch_get(keys, None) == [None, None]
    assert backend.batch_set(keys, [torch.zeros(3), torch.zeros(3)]) is False
    backend.close()
    assert backend.batch_get_v1(keys, sp.indices(pool, [0, 1])) == [False, False]
    assert backend.batch_exists(keys) == 0 and backend.clear() is False


def test_clear_and_metrics(make_backend):
    pool = sp.mha_pool("page_first", 16)
    backend = attached(make_backend(metrics=True), pool)
    keys = hashes(3, 16)
    backend.batch_set_v1(keys, sp.indices(pool, [0, 1, 2]))
    backend.batch_get_v1(keys, sp.indices(pool, [3, 4, 5]))
    stats = backend.get_stats()
    assert isinstance(stats, StorageMetrics)
    assert stats.backup_pgs == [3] and stats.prefetch_pgs == [3]
    assert stats.backup_bandwidth[0] > 0 and stats.prefetch_bandwidth[0] > 0
    assert backend.get_stats().prefetch_pgs == []                       # drained
    assert make_backend().get_stats() is None                           # metrics off
    assert backend.clear() is True and backend.batch_exists(keys) == 0


def test_packed_fp8_needs_the_logical_dtype(make_backend):
    """SGLang's host pool of an fp8 KV cache stores uint8: e4m3 and e5m2
    pages look alike, so keys need the dtype from the extra config."""
    pool = sp.mha_pool("page_first", 16, dtype=torch.float8_e4m3fn)
    assert pool.dtype == torch.uint8
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        attached(make_backend(), pool)
    e4m3 = attached(make_backend(options={"kv_cache_dtype": "fp8_e4m3"}), pool)
    e5m2 = attached(make_backend(options={"kv_cache_dtype": "fp8_e5m2"}), pool)
    keys = hashes(1, 16)
    assert e4m3.batch_set_v1(keys, sp.indices(pool, [0])) == [True]
    assert e5m2.batch_exists(keys) == 0


@pytest.mark.parametrize("dtype, pool_dtype, message", [
    ("fp8_e4m4", torch.float8_e4m3fn, "KV element type"),     # a typo names no dtype
    ("auto", torch.bfloat16, "KV element type"),
    ("fp8_e4m3", torch.bfloat16, "host pool holds torch.bfloat16"),  # 1 byte, pool has 2
    ("fp32", torch.bfloat16, "host pool holds torch.bfloat16"),
])
def test_kv_cache_dtype_is_checked_against_the_pool(make_backend, dtype, pool_dtype, message):
    pool = sp.mha_pool("page_first", 16, dtype=pool_dtype)
    with pytest.raises(ValueError, match=message):
        attached(make_backend(options={"kv_cache_dtype": dtype}), pool)
    # The names a dtype has are one: bfloat16 on a bf16 pool is accepted.
    if pool_dtype == torch.bfloat16:
        attached(make_backend(options={"kv_cache_dtype": "bfloat16"}), pool)


def test_unknown_options_are_named(server):
    config = sp.storage_config(extra=sp.extra_config(server.url, timeout=5))
    with pytest.raises(ValueError, match=r"'timeout'.*timeout_ms.*kv_cache_dtype"):
        GdrkvHiCacheStorage(config, {})
    with pytest.raises(ValueError, match="model"):
        GdrkvHiCacheStorage(sp.storage_config(model=None, extra=sp.extra_config(server.url)), {})


def test_the_settings_table_lists_every_accepted_key():
    """configs/sglang/README.md documents every key the extra config takes:
    SGLang's, the adapter's and every gdrkv.Client option."""
    from gdrkv.adapters.sglang_hicache.options import ADAPTER_KEYS, SGLANG_KEYS
    from gdrkv.client import _OPTIONS

    with open(os.path.join(CONFIGS, "README.md")) as f:
        table = f.read().split("## Settings", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`([a-z_0-9]+)`", table))
    assert set(SGLANG_KEYS) | set(ADAPTER_KEYS) | set(_OPTIONS) <= documented, \
        sorted(set(SGLANG_KEYS) | set(ADAPTER_KEYS) | set(_OPTIONS) - documented)


# ---------------------------------------------------------------- factory

@pytest.mark.parametrize("source", ["dict", "sglang_hicache.json", "sglang_hicache.yaml"])
def test_dynamic_factory_builds_the_backend(server, source):
    if source == "dict":
        extra = sp.extra_config(server.url)
    else:
        # SGLang's own parser of --hicache-storage-backend-extra-config @file
        extra = HybridCacheController.parse_storage_backend_extra_config(
            "@" + os.path.join(CONFIGS, source))[0]
        extra["url"] = server.url
    pool = sp.mha_pool("page_first", 16)
    backend = StorageBackendFactory.create_backend(
        "dynamic", sp.storage_config(extra=extra), pool)
    try:
        assert isinstance(backend, GdrkvHiCacheStorage)
        # The shipped configs name no namespace: SGLang's and the model's.
        assert backend._client.namespace == \
            engine_namespace("sglang", sp.storage_config().model_name)
        backend.register_mem_pool_host(pool)
        assert backend.batch_set_v1(hashes(1, 16, salt=7), sp.indices(pool, [0])) == [True]
    finally:
        backend.close()


def test_clear_empties_only_this_engines_pages_of_this_model(server, make_client):
    """Engines on one server keep to namespaces of their own unless their
    configs name one: SGLang's flush empties its pages of its model alone,
    never another model's nor LMCache's or vLLM's chunks; a namespace set
    in every config is shared, and clear then empties it for all."""
    model, other_model = unique("org/model"), unique("org/other")
    pool = sp.mha_pool("page_first", 16)
    keys = hashes(2, 16, salt=11)

    def backend(model, **options):
        return attached(GdrkvHiCacheStorage(
            sp.storage_config(model=model, extra=sp.extra_config(server.url, **options)), {}),
            pool)

    mine, theirs = backend(model), backend(other_model)
    assert mine._client.namespace == engine_namespace("sglang", model)
    assert mine.batch_set_v1(keys, sp.indices(pool, [0, 1])) == [True, True]
    assert theirs.batch_set_v1(keys, sp.indices(pool, [0, 1])) == [True, True]
    others = [make_client(server.url, namespace=engine_namespace(engine, model))
              for engine in ("lmcache", "vllm")]
    for client in others:
        client.put("chunk", b"c" * 100)
    assert mine.clear() is True
    assert mine.batch_exists(keys) == 0 and theirs.batch_exists(keys) == 2
    assert [client.get("chunk") for client in others] == [b"c" * 100] * 2

    shared = unique("shared")
    a, b = backend(model, namespace=shared), backend(other_model, namespace=shared)
    assert a.batch_set_v1(keys, sp.indices(pool, [0, 1])) == [True, True]
    lmcache = make_client(server.url, namespace=shared)
    lmcache.put("chunk", b"c" * 100)
    assert b.clear() is True and lmcache.get("chunk") is None
    for each in (mine, theirs, a, b):
        each.close()


def test_embedded_server_without_url():
    config = sp.storage_config(extra={"backend_name": "gdrkv", "interface_v1": 1,
                                      "embedded_memory": "16MiB"})
    backend = attached(GdrkvHiCacheStorage(config, {}), sp.mha_pool("page_first", 16))
    try:
        pool = backend.mem_pool_host
        keys = hashes(2, 16)
        assert backend.batch_set_v1(keys, sp.indices(pool, [0, 1])) == [True, True]
        assert backend.batch_exists(keys) == 2
    finally:
        backend.close()


# ---------------------------------------------------------------- failures

def test_server_killed_mid_prefetch_gives_short_hits(server_factory):
    """Two servers; one dies while prefetch threads run: every call returns
    within the timeout, without raising, with the pages of the live server."""
    servers = [server_factory(memory="64MiB") for _ in range(2)]
    url = "gdrkv://" + ",".join(s.address for s in servers)
    timeout_ms = 500
    extra = sp.extra_config(url, namespace=unique("ns"), timeout_ms=timeout_ms,
                            connect_timeout_ms=200)
    pool = sp.mha_pool("page_first", 4, pages=64)
    backend = attached(GdrkvHiCacheStorage(sp.storage_config(extra=extra), {}), pool)
    keys = hashes(32, 4)
    assert backend.batch_set_v1(keys, sp.indices(pool, range(32))) == [True] * 32

    slowest, stop = [0.0], threading.Event()
    loops = [0, 0, 0]                   # completed loops per thread
    lock = threading.Lock()

    def prefetcher(n):
        def prefetch():
            while not stop.is_set():
                start = time.monotonic()
                # Any exception here fails the test (support.util.background).
                backend.batch_exists(keys)
                backend.batch_get_v1(keys, sp.indices(pool, range(32, 64)))
                with lock:
                    slowest[0] = max(slowest[0], time.monotonic() - start)
                    loops[n] += 1
        return prefetch

    def every_thread_looped(than):
        with lock:
            return all(n > m for n, m in zip(loops, than))

    with background(*(prefetcher(n) for n in range(3)), stop=stop, timeout=60):
        wait_for(lambda: every_thread_looped([0, 0, 0]), 60, "prefetch loops")
        servers[1].kill()
        with lock:
            at_kill = list(loops)
        # Each thread goes through whole loops against the dead server.
        wait_for(lambda: every_thread_looped([n + 3 for n in at_kill]), 60,
                 "prefetch loops after the kill")
    # Two bounded calls per loop (exists, get); the slack is for a loaded
    # machine (an unbounded call would hang until the test's timeout).
    assert slowest[0] < 2 * timeout_ms / 1000 + 5

    hits = backend.batch_get_v1(keys, sp.indices(pool, range(32, 64)))
    assert 0 < hits.count(True) < 32
    leading = hits.index(False)
    assert backend.batch_exists(keys) == leading
    backend.close()


def test_concurrent_prefetch_and_backup_threads(make_backend):
    pool = sp.mha_pool("page_first", 4, pages=256, seed=3)
    backend = attached(make_backend(), pool)
    reference = sp.mha_pool("page_first", 4, pages=256, seed=3)
    errors = []

    def backup(first):
        for batch in range(first, 128, 4):
            pages = list(range(batch * 2, batch * 2 + 2))
            keys = [f"{p:064x}" for p in pages]
            if backend.batch_set_v1(keys, sp.indices(pool, pages)) != [True, True]:
                errors.append(("set", pages))

    def prefetch(first):
        # Reads whatever is there into the upper half, then checks it.
        for batch in range(first, 64, 2):
            pages = list(range(batch * 2, batch * 2 + 2))
            slots = [128 + p for p in pages]
            done = backend.batch_get_v1([f"{p:064x}" for p in pages], sp.indices(pool, slots))
            for page, slot, ok in zip(pages, slots, done):
                if ok and sp.page_bytes(pool, slot) != sp.page_bytes(reference, page):
                    errors.append(("get", page))

    run_threads(*(lambda i=i: backup(i) for i in range(4)),
                *(lambda i=i: prefetch(i) for i in range(2)))
    assert not errors
    assert backend.batch_exists([f"{p:064x}" for p in range(128)]) == 128


# ---------------------------------------------------------------- restarts

def run_fresh_process(mode, server, namespace, hashseed, *variants):
    """Runs tests/support/sglang_pools.py in a new interpreter: for each
    variant (settings over the base ones; none: the base) an MHA and an MLA
    model, each with a Mamba side pool. One dict per variant: {"mha":
    per-page results, "mha mamba": per-state results, "mla": ..., "mla
    mamba": ...}."""
    base = {"dtype": "bfloat16", "layout": "page_first", "page_size": 16,
            "tokens": list(range(16 * 6)), "tp_rank": 0, "tp_size": 2, "dp_rank": 0}
    runs = [{**base, "mla": mla, **variant} for variant in variants or ({},)
            for mla in (False, True)]
    env = dict(os.environ, PYTHONHASHSEED=hashseed)
    script = os.path.join(TESTS_DIR, "support", "sglang_pools.py")
    done = subprocess.run([sys.executable, script, mode, server.url, namespace,
                           json.dumps(runs)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return [{"mha": mha, "mha mamba": mha_states, "mla": mla, "mla mamba": mla_states}
            for (mha, mha_states), (mla, mla_states) in zip(report[::2], report[1::2])]


# Under a gcov build its 3,737 C lines (clients and server) are all among
# those the rest of this file and test_sglang_hybrid.py run.
@pytest.mark.no_asan("its C paths are those of the other SGLang tests")
def test_pages_outlive_the_process_that_wrote_them(server):
    """Issue 7 end to end, with a hybrid model's Mamba states beside the
    pages: a writer process exits; fresh processes with other hash seeds and
    DP ranks read every page and state byte-exact; another TP rank (MHA, and
    the Mamba states, sharded even beside MLA pages) or dtype misses instead
    of reading wrong bytes. A process per hash seed: the TP rank and dtype
    readers share the first reader's process (each builds its own backend and
    pools, and only reads): a process spends most of its time importing SGLang."""
    namespace = unique("ns")
    hit, miss = [True] * 6, [False] * 6

    def results(mha, mha_mamba, mla, mla_mamba):
        return {"mha": mha, "mha mamba": mha_mamba, "mla": mla, "mla mamba": mla_mamba}

    assert run_fresh_process("write", server, namespace, "0") == [results(hit, hit, hit, hit)]
    dp_1, tp_1, fp16 = run_fresh_process("read", server, namespace, "1", {"dp_rank": 1},
                                         {"tp_rank": 1}, {"dtype": "float16"})
    assert dp_1 == results(hit, hit, hit, hit)
    # MLA pages are rank-less: another TP rank reads them, not the states.
    assert tp_1 == results(miss, miss, hit, miss)
    assert fp16 == results(miss, miss, miss, miss)
    assert run_fresh_process("read", server, namespace, "random", {"dp_rank": 3}) == \
        [results(hit, hit, hit, hit)]
