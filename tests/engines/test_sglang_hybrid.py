"""HiCache storage v2 (hybrid models) against real gdrkv servers and the
real sglang==0.5.23 package: SGLang's own side pools built on CPU (Mamba
state, MHA sliding-window and draft KV, the DSA indexer riding on MLA pages,
DeepSeek V4's compressed pools under a logical anchor), byte-exact round
trips, TP ranks, the hit policies checked against SGLang's own reference
backend (HiCacheFile) on random presence patterns, and fail-soft."""
import random

import pytest

from support import engines

engines.require("sglang.srt.mem_cache.hicache_storage")
engines.torchvision_stand_in()
import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheFile, PoolHitPolicy, PoolName, PoolTransfer)

from support import sglang_pools as sp  # noqa: E402
from support.util import unique  # noqa: E402
from support.sglang_pools import hashes  # noqa: E402

SERVER_MEMORY = "256MiB"
PAGES = 8
TRAILING, ALL, GROUPS = (PoolHitPolicy.TRAILING_PAGES, PoolHitPolicy.ALL_PAGES,
                         PoolHitPolicy.BLOCK_GROUPS)


def hybrid(backend, kv, sides):
    """backend attached as SGLang's hybrid controller attaches it: the
    anchor, then every pool through v2, then on_host_pools_registered."""
    backend.register_mem_pool_host(kv)
    backend.register_mem_host_pool_v2(kv, PoolName.KV)
    for name, pool in sides.items():
        backend.register_mem_host_pool_v2(pool, name)
    backend.on_host_pools_registered()
    return backend


def transfer(name, pool, pages, keys, policy=ALL):
    return PoolTransfer(name=name, host_indices=sp.indices(pool, pages), keys=keys,
                        hit_policy=policy)


def model(kind, seed):
    """(KV pool, {side pool name: (pool, hit policy)}, storage config
    fields) of a hybrid model of one kind, pools filled from seed."""
    if kind == "mamba":          # Qwen3-Next / Nemotron-H: KV pages plus one state slot a page
        return (sp.mha_pool("page_first", 16, pages=PAGES, seed=seed),
                {PoolName.MAMBA: (sp.mamba_pool(PAGES, seed=seed + 1), TRAILING)}, {})
    if kind == "swa":            # gpt-oss / Gemma: sliding-window layers in their own KV pool
        return (sp.mha_pool("page_first", 16, pages=PAGES, seed=seed),
                {PoolName.SWA: (sp.mha_pool("page_first", 16, pages=PAGES, layer_num=1,
                                            seed=seed + 1), TRAILING)}, {})
    if kind == "dsa":            # DeepSeek V3.2: indexer rows on the MLA pages
        _, kv, indexer = sp.dsa_pools(64, pages=PAGES, seed=seed)
        return kv, {PoolName.INDEXER: (indexer, ALL)}, {"mla": True}
    if kind == "draft":          # speculative decoding: an MHA draft model's KV
        return (sp.mla_pool("page_first", 16, pages=PAGES, seed=seed),
                {PoolName.DRAFT: (sp.mha_pool("page_first", 16, pages=PAGES, layer_num=1,
                                              seed=seed + 1), ALL)}, {"mla": True})
    if kind == "deepseek_v4":    # a logical anchor; compressed pools hold the bytes
        anchor, pools = sp.deepseek_v4_pools([PoolName.DEEPSEEK_V4_C4, PoolName.DEEPSEEK_V4_C128],
                                             pages=PAGES, seed=seed)
        return anchor, {name: (pool, ALL) for name, pool in pools.items()}, {"mla": True}
    raise ValueError(kind)


KINDS = ["mamba", "swa", "dsa", "draft", "deepseek_v4"]


def pool_bytes(pool, pages):
    return [sp.page_bytes(pool, p) for p in pages]


@pytest.mark.parametrize("kind", KINDS)
def test_side_pools_round_trip_byte_exact(make_backend, kind):
    """Backup as the hybrid controller does it (side pools with
    batch_set_v2, KV with batch_set_v1), then in another backend over
    zeroed pools: batch_exists_v2 finds the prefix, batch_get_v1 and
    batch_get_v2 land every pool's pages byte-exact in other slots."""
    kv, sides, fields = model(kind, seed=1)
    kv_dest, sides_dest, _ = model(kind, seed=2)
    writer = hybrid(make_backend(**fields), kv, {n: p for n, (p, _) in sides.items()})
    reader = hybrid(make_backend(**fields), kv_dest, {n: p for n, (p, _) in sides_dest.items()})
    page_size = kv.page_size
    keys = hashes(3, page_size)
    src, dst = [0, 1, 2], [5, 6, 7]

    stored = writer.batch_set_v2([transfer(n, p, src, keys, policy)
                                  for n, (p, policy) in sides.items()])
    assert stored == {n: [True] * 3 for n in sides}
    assert writer.batch_set_v1(keys, sp.indices(kv, src) if kv.kv_buffer is not None
                               else torch.arange(3 * page_size)) == [True] * 3

    probe = [PoolTransfer(name=n, keys=keys[-1:] if policy == TRAILING else keys,
                          hit_policy=policy) for n, (_, policy) in sides_dest.items()]
    found = reader.batch_exists_v2(keys + hashes(1, page_size, salt=9), probe)
    assert found.kv_hit_pages == 3 and found.restorable_prefix_pages == [1, 2, 3]
    assert reader.batch_get_v2([transfer(n, p, dst, keys, policy)
                                for n, (p, policy) in sides_dest.items()]) == \
        {n: [True] * 3 for n in sides}
    for name, (pool, _) in sides.items():
        assert pool_bytes(sides_dest[name][0], dst) == pool_bytes(pool, src), name
    if kv.kv_buffer is not None:
        assert reader.batch_get_v1(keys, sp.indices(kv_dest, dst)) == [True] * 3
        assert pool_bytes(kv_dest, dst) == pool_bytes(kv, src)


def test_side_pool_objects_never_meet_kv_pages_or_each_other(make_backend):
    """A side pool's object of a page is keyed apart from the KV page of the
    same hash and from every other pool: storing one never makes another
    exist. A Mamba pool whose conv state is fp16 instead of bf16 (same
    bytes) misses the bf16 pool's states."""
    kv, sides, _ = model("mamba", seed=1)
    mamba = sides[PoolName.MAMBA][0]
    swa = sp.mha_pool("page_first", 16, pages=PAGES, layer_num=1)
    backend = hybrid(make_backend(), kv, {PoolName.MAMBA: mamba, PoolName.SWA: swa})
    keys = hashes(2, 16)
    assert backend.batch_set_v2([transfer(PoolName.MAMBA, mamba, [0, 1], keys)]) == \
        {PoolName.MAMBA: [True, True]}
    assert backend.batch_exists(keys) == 0
    found = backend.batch_exists_v2(keys, [PoolTransfer(name=PoolName.SWA, keys=keys)])
    assert found.kv_hit_pages == 0
    assert backend.batch_set_v1(keys, sp.indices(kv, [0, 1])) == [True, True]
    found = backend.batch_exists_v2(keys, [PoolTransfer(name=PoolName.SWA, keys=keys)])
    assert (found.kv_hit_pages, found.extra_pool_hit_pages) == (0, {PoolName.KV: 2})

    other = sp.mamba_pool(PAGES, conv_dtype=torch.float16)
    reader = hybrid(make_backend(), sp.mha_pool("page_first", 16, pages=PAGES),
                    {PoolName.MAMBA: other})
    assert reader.batch_get_v2([transfer(PoolName.MAMBA, other, [0, 1], keys)]) == \
        {PoolName.MAMBA: [False, False]}


def test_tp_ranks_of_an_mla_model(make_backend):
    """In an MLA model the KV pages and the DSA indexer are the same on every
    TP rank (one rank-less copy, written by rank 0), but Mamba state and an
    MHA draft's KV are sharded: rank 1 reads rank 0's indexer rows and
    misses rank 0's Mamba and draft pages rather than reading another shard."""
    _, kv, indexer = sp.dsa_pools(64, pages=PAGES, seed=1)
    mamba, draft = sp.mamba_pool(PAGES, seed=2), sp.mha_pool("page_first", 64, pages=PAGES,
                                                             layer_num=1, seed=3)
    rank0 = hybrid(make_backend(mla=True, tp_rank=0, tp_size=2), kv,
                   {PoolName.INDEXER: indexer, PoolName.MAMBA: mamba, PoolName.DRAFT: draft})
    keys = hashes(2, 64)
    assert rank0.batch_set_v2([transfer(PoolName.INDEXER, indexer, [0, 1], keys),
                               transfer(PoolName.MAMBA, mamba, [0, 1], keys),
                               transfer(PoolName.DRAFT, draft, [0, 1], keys)]) == \
        {PoolName.INDEXER: [True] * 2, PoolName.MAMBA: [True] * 2, PoolName.DRAFT: [True] * 2}

    _, kv1, indexer1 = sp.dsa_pools(64, pages=PAGES, seed=4)
    mamba1, draft1 = sp.mamba_pool(PAGES, seed=5), sp.mha_pool("page_first", 64, pages=PAGES,
                                                               layer_num=1, seed=6)
    rank1 = hybrid(make_backend(mla=True, tp_rank=1, tp_size=2), kv1,
                   {PoolName.INDEXER: indexer1, PoolName.MAMBA: mamba1, PoolName.DRAFT: draft1})
    assert rank1.batch_get_v2([transfer(PoolName.INDEXER, indexer1, [4, 5], keys),
                               transfer(PoolName.MAMBA, mamba1, [4, 5], keys),
                               transfer(PoolName.DRAFT, draft1, [4, 5], keys)]) == \
        {PoolName.INDEXER: [True] * 2, PoolName.MAMBA: [False] * 2, PoolName.DRAFT: [False] * 2}
    assert pool_bytes(indexer1, [4, 5]) == pool_bytes(indexer, [0, 1])


def file_backend(tmp_path, kv, sides):
    """SGLang's own reference backend over the same pools."""
    config = sp.storage_config(extra={"file_storage_path": str(tmp_path)})
    backend = HiCacheFile(config)
    backend.register_mem_pool_host(kv)
    backend.register_mem_host_pool_v2(kv, PoolName.KV)
    for name, pool in sides.items():
        backend.register_mem_host_pool_v2(pool, name)
    return backend


def test_hit_policies_match_sglangs_reference_backend(make_backend, tmp_path):
    """ALL_PAGES and TRAILING_PAGES over random patterns of stored KV pages
    and side-pool objects: gdrkv's batch_exists_v2 answers exactly what
    SGLang's HiCacheFile answers for the same pages (the usable prefix, each
    pool's boundary and every restorable prefix length, holes included)."""
    kv = sp.mha_pool("page_first", 4, pages=12)
    sides = {PoolName.MAMBA: sp.mamba_pool(12), PoolName.INDEXER: sp.mha_pool(
        "page_first", 4, pages=12, layer_num=1)}
    rng = random.Random(7)
    for case in range(24):
        n = rng.randint(1, 12)
        keys = hashes(n, 4, salt=100 + case)
        gdrkv = hybrid(make_backend(), kv, sides)
        reference = file_backend(tmp_path / str(case), kv, sides)
        present = {name: [rng.random() < 0.8 for _ in range(n)]
                   for name in (PoolName.KV, *sides)}
        for name, mask in present.items():
            pages = [p for p in range(n) if mask[p]]
            if not pages:
                continue
            pool = kv if name == PoolName.KV else sides[name]
            move = [transfer(name, pool, pages, [keys[p] for p in pages])]
            assert set(reference.batch_set_v2(move)[name]) == {True}
            if name == PoolName.KV:
                assert set(gdrkv.batch_set_v1(move[0].keys, move[0].host_indices)) == {True}
            else:
                assert set(gdrkv.batch_set_v2(move)[name]) == {True}
        window = rng.randint(1, 4)
        probe = [PoolTransfer(name=PoolName.MAMBA, keys=keys[-window:], hit_policy=TRAILING),
                 PoolTransfer(name=PoolName.INDEXER, keys=keys, hit_policy=ALL)]
        rng.shuffle(probe)
        ours, theirs = gdrkv.batch_exists_v2(keys, probe), reference.batch_exists_v2(keys, probe)
        assert (ours.kv_hit_pages, ours.extra_pool_hit_pages, ours.restorable_prefix_pages) == \
            (theirs.kv_hit_pages, theirs.extra_pool_hit_pages,
             theirs.restorable_prefix_pages), (case, present, window)


def test_block_groups_report_whole_groups_without_gating_kv(make_backend):
    """BLOCK_GROUPS (no SGLang reference implements it): the pool reports the
    pages its leading complete groups of group_pages keys cover; a partial
    or broken group ends it; the KV hit stands whatever the pool holds."""
    anchor, pools = sp.deepseek_v4_pools([PoolName.DEEPSEEK_V4_C4], pages=12)
    c4 = pools[PoolName.DEEPSEEK_V4_C4]
    backend = hybrid(make_backend(mla=True), anchor, pools)
    keys = hashes(10, 4)
    stored = [p for p in range(10) if p != 6]
    assert backend.batch_set_v2([transfer(PoolName.DEEPSEEK_V4_C4, c4, stored,
                                          [keys[p] for p in stored])]) == \
        {PoolName.DEEPSEEK_V4_C4: [True] * 9}
    groups = PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, keys=keys, hit_policy=GROUPS,
                          block_pages=1, group_pages=3)
    found = backend.batch_exists_v2(keys, [groups])
    # groups 0-2, 3-5 complete; 6-8 lacks page 6; 9 alone is no group
    assert (found.kv_hit_pages, found.extra_pool_hit_pages) == \
        (10, {PoolName.KV: 10, PoolName.DEEPSEEK_V4_C4: 6})


def test_logical_anchor_alone_never_hits(make_backend):
    """DeepSeek V4's anchor has no bytes: moving its pages succeeds without
    a transfer, but without side pools nothing is ever reported found, and
    an attach with no side pool at all is refused."""
    anchor, pools = sp.deepseek_v4_pools([PoolName.DEEPSEEK_V4_C4])
    backend = hybrid(make_backend(mla=True), anchor, pools)
    keys = hashes(2, 4)
    assert backend.batch_set_v1(keys, torch.arange(8)) == [True, True]
    assert backend.batch_exists(keys) == 0
    assert backend.batch_exists_v2(keys, []).kv_hit_pages == 0
    lonely = make_backend(mla=True)
    lonely.register_mem_pool_host(anchor)
    with pytest.raises(ValueError, match="logical anchor without side pools"):
        lonely.on_host_pools_registered()


def test_bad_v2_calls_fail_soft(make_backend, server):
    """Unregistered pools, short indices and a closed client give False and
    empty results, never an exception into SGLang's threads."""
    kv, sides, _ = model("mamba", seed=1)
    mamba = sides[PoolName.MAMBA][0]
    backend = hybrid(make_backend(), kv, {PoolName.MAMBA: mamba})
    keys = hashes(2, 16)
    assert backend.batch_set_v2([transfer(PoolName.SWA, kv, [0, 1], keys)]) == \
        {PoolName.SWA: [False, False]}
    short = PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([0]), keys=keys)
    assert backend.batch_set_v2([short, transfer(PoolName.KV, kv, [0, 1], keys)]) == \
        {PoolName.MAMBA: [False, False], PoolName.KV: [True, True]}
    assert backend.batch_exists_v2(keys, [PoolTransfer(name=PoolName.SWA, keys=keys)]) \
        .kv_hit_pages == 0
    backend.close()
    assert backend.batch_get_v2([transfer(PoolName.MAMBA, mamba, [0, 1], keys)]) == \
        {PoolName.MAMBA: [False, False]}
    assert backend.batch_exists_v2(keys, []).kv_hit_pages == 0


# ---------------------------------------------------------------- controller

@pytest.fixture
def make_hybrid_controller(server):
    """make_hybrid_controller(device, kv, sides, **rank args) -> SGLang's
    HybridCacheController with gdrkv attached through the dynamic factory
    in this test's namespace; detached at teardown."""
    namespace = unique("ns")
    controllers = []

    def make(device, kv, sides, **kwargs):
        extra = sp.extra_config(server.url, namespace=namespace)
        controllers.append(sp.HybridController(device, kv, sides, extra, **kwargs))
        return controllers[-1]

    yield make
    for controller in controllers:
        controller.close()


def test_controller_restores_mamba_state_at_the_cut_it_was_saved(make_hybrid_controller):
    """A Mamba model through SGLang's hybrid controller: a prompt is backed
    up with its SSM state at page 2, then extended by a page whose state is
    never saved. Another controller's prefetch of the longer prompt stops
    at page 2, where a state exists (TRAILING_PAGES), and loads KV and
    state byte-exact; once the longer prompt's state is saved, the whole
    prompt is a hit."""
    def mamba_model(seed):
        device, kv = sp.device_and_host("mha", "page_first", 16, pages=PAGES, seed=seed)
        return device, kv, sp.mamba_pool(PAGES, seed=seed + 1)

    device, kv, mamba = mamba_model(1)
    writer = make_hybrid_controller(device, kv, {PoolName.MAMBA: mamba})
    tokens = list(range(1000, 1048))
    hv = sp.page_hashes(tokens, 16)

    def state(slot, key):
        return [PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([slot]),
                             keys=[key], hit_policy=TRAILING)]

    assert writer.backup(tokens[:32], [0, 1], state(3, hv[1])) == (32, {PoolName.MAMBA: 1})
    assert writer.backup(tokens, [0, 1, 2], None)[0] == 48

    device2, kv2, mamba2 = mamba_model(5)
    reader = make_hybrid_controller(device2, kv2, {PoolName.MAMBA: mamba2})
    probe = [PoolTransfer(name=PoolName.MAMBA, keys=hv[-1:], hit_policy=TRAILING)]
    found, completed, loaded = reader.prefetch(tokens, [5, 6, 7], probe,
                                               {PoolName.MAMBA: torch.tensor([2])})
    assert (found, completed, loaded) == (32, 32, {PoolName.MAMBA: 1})
    assert same_bytes(kv2, [5, 6], kv, [0, 1]) and same_bytes(mamba2, [2], mamba, [3])

    assert writer.backup(tokens, [0, 1, 2], state(4, hv[2]))[0] == 48
    probe = [PoolTransfer(name=PoolName.MAMBA, keys=hv[-1:], hit_policy=TRAILING)]
    assert reader.prefetch(tokens, [4, 5, 6], probe, {PoolName.MAMBA: torch.tensor([7])}) == \
        (48, 48, {PoolName.MAMBA: 1})
    assert same_bytes(kv2, [4, 5, 6], kv, [0, 1, 2]) and same_bytes(mamba2, [7], mamba, [4])


def test_controller_moves_dsa_indexer_rows_with_their_pages(make_hybrid_controller):
    """DeepSeek V3.2 through SGLang's hybrid controller: the DSA indexer
    pool reuses the KV pages' indices (indices_from_pool KV), is backed up
    with them and read in the same batch as them (ALL_PAGES). A prompt
    whose indexer rows were never stored is no hit, though its KV pages
    are there."""
    device, kv, indexer = sp.dsa_pools(64, pages=PAGES, seed=1)
    writer = make_hybrid_controller(device, kv, {PoolName.INDEXER: indexer})

    def rows():
        return [PoolTransfer(name=PoolName.INDEXER, indices_from_pool=PoolName.KV,
                             hit_policy=ALL)]

    tokens = list(range(2000, 2128))
    assert writer.backup(tokens, [0, 1], rows()) == (128, {PoolName.INDEXER: 2})
    bare = list(range(3000, 3128))
    assert writer.backup(bare, [2, 3], None)[0] == 128

    device2, kv2, indexer2 = sp.dsa_pools(64, pages=PAGES, seed=7)
    reader = make_hybrid_controller(device2, kv2, {PoolName.INDEXER: indexer2})
    assert reader.prefetch(tokens, [6, 7], rows(), {})[:2] == (128, 128)
    assert same_bytes(kv2, [6, 7], kv, [0, 1]) and same_bytes(indexer2, [6, 7], indexer, [0, 1])
    assert reader.prefetch(bare, [4, 5], rows(), {}) == (0, 0, {})


def same_bytes(a, a_pages, b, b_pages):
    return pool_bytes(a, a_pages) == pool_bytes(b, b_pages)
