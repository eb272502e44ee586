"""gdrkv's vLLM store connector (adapters/vllm) in vLLM 0.33's real
Scheduler, KV cache manager, model-runner mixin and output aggregator, on
CPU KV tensors: engines run in fresh processes of tests/support/vllm_engine.py
in the vLLM environment, against a real `gdrkv serve` process. Saving in one
process and loading in another is what proves keys survive a restart, and
the tests of restarts do that; otherwise a test's engines run one after
another in one process, each built anew (a process spends seconds importing
vLLM, an engine starts in far less)."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from support.etcd import wait_members
from support.util import unique
from support.vllm_env import run_vllm_script, vllm_env

ENGINE = Path(__file__).resolve().parents[1] / "support" / "vllm_engine.py"
BLOCK = 16                  # vllm_engine.BLOCK
BLOCKS = 128                # vllm_engine's default num_blocks
BLOCK_BYTES = 2 * BLOCK * 2 * 8 * 2 * 2     # layers x tokens x heads x K|V x head size x bf16


# Their engines run in the vLLM environment with its own optimised gdrkv
# (support/vllm_env.py): the sanitized pass leaves them out.
pytestmark = pytest.mark.vllm_env


def engines(python, server, namespace, *scenarios, env=None):
    """Runs an engine for each scenario (phases, each: requests {id:
    tokens}, max_tokens, occupy_blocks, break_after_lookup; and the engine's
    settings), one after another in one process; their reports, after
    checking that each went idle and gave back every block (the null block
    stays taken)."""
    scenarios = [dict(url=server.url, namespace=namespace, **s) for s in scenarios]
    reports = run_vllm_script(python, [ENGINE, json.dumps(scenarios)], vllm_env(**(env or {})))
    for scenario, report in zip(scenarios, reports, strict=True):
        if "error" not in report:
            assert all(report["idle"]), report
            assert report["free_blocks"] == scenario.get("blocks", BLOCKS) - 1, report
    return reports


def engine(python, server, namespace, phases, env=None, **scenario):
    """One engine over phases in a process of its own: its report."""
    return engines(python, server, namespace, dict(phases=phases, **scenario), env=env)[0]


def prompt(seed, blocks, extra=0):
    return [1000 + seed * 10000 + i for i in range(blocks * BLOCK + extra)]


@pytest.fixture
def ns():
    return unique("vllm")


def test_a_saved_prefix_loads_byte_exact_into_other_blocks_of_a_fresh_process(
        vllm_python, server, ns):
    tokens = prompt(1, 5, extra=8)
    saver = engine(vllm_python, server, ns, [{"requests": {"a": tokens}}])
    assert saver["requests"]["a"]["external_tokens"] == 0
    assert saver["stats"]["save_keys"] == 5 and saver["stats"]["save_failed_keys"] == 0
    assert saver["stats"]["save_bytes"] == 5 * BLOCK_BYTES

    loader = engine(vllm_python, server, ns, [
        {"occupy_blocks": 7, "requests": {"b": tokens, "c": prompt(2, 5, extra=8),
                                          "d": prompt(1, 3) + prompt(3, 2, extra=8)}}])
    b, c, d = (loader["requests"][r] for r in "bcd")
    # The whole saved prefix, asynchronously, byte-exact, into other blocks.
    assert b["external_tokens"] == 5 * BLOCK
    assert "WAITING_FOR_REMOTE_KVS" in b["statuses"]
    assert b["loaded_exact"] == [True] * 5 and b["prefill_tokens"] == 8
    assert set(b["loaded_blocks"]).isdisjoint(saver["requests"]["a"]["block_ids"])
    # An unrelated prompt misses; a shared prefix of 3 blocks hits 3 blocks.
    assert c["external_tokens"] == 0 and "WAITING_FOR_REMOTE_KVS" not in c["statuses"]
    assert d["external_tokens"] == 3 * BLOCK and d["loaded_exact"] == [True] * 3
    assert loader["stats"]["load_keys"] == 8 and loader["stats"]["load_bytes"] == 8 * BLOCK_BYTES


def test_a_saved_prefix_loads_through_a_cluster_url(vllm_python, etcd, cluster_name,
                                                    start_member, ns):
    """url: gdrkv+etcd://... (#40): each engine process finds the members in
    etcd; with replicas=2 each block is on both."""
    servers = [start_member(i) for i in range(2)]
    wait_members(etcd, cluster_name, servers)
    cluster = SimpleNamespace(url=etcd.url(cluster_name, "gdrkv+etcd") + "?replicas=2")
    tokens = prompt(7, 4, extra=3)
    saver = engine(vllm_python, cluster, ns, [{"requests": {"a": tokens}}])
    assert saver["stats"]["save_keys"] == 4 and saver["stats"]["save_failed_keys"] == 0
    loader = engine(vllm_python, cluster, ns, [{"requests": {"b": tokens}}])
    b = loader["requests"]["b"]
    assert b["external_tokens"] == 4 * BLOCK and b["loaded_exact"] == [True] * 4
    assert [s.stats()["objects"] for s in servers] == [4, 4]


def test_a_whole_prompt_hit_leaves_the_last_token_to_compute(vllm_python, server, ns):
    tokens = prompt(4, 4)
    _, loader = engines(vllm_python, server, ns, dict(phases=[{"requests": {"a": tokens}}]),
                        dict(phases=[{"requests": {"b": tokens}}]))
    b = loader["requests"]["b"]
    assert b["external_tokens"] == 4 * BLOCK - 1
    assert b["loaded_exact"] == [True] * 4


@pytest.mark.parametrize("how", ["clear", "kill"])
def test_a_load_that_fails_is_recomputed(vllm_python, server_factory, ns, how):
    """The objects vanish (or the server dies) between the lookup and the
    load: the blocks are reported as load errors, vLLM recomputes them, the
    request finishes and nothing is left waiting."""
    server = server_factory(memory="64MiB")
    tokens = prompt(5, 4, extra=3)
    _, report = engines(vllm_python, server, ns, dict(phases=[{"requests": {"a": tokens}}]), dict(
        phases=[{"requests": {"b": tokens}, "break_after_lookup": how,
                 "server_pid": server.proc.pid}], timeout_ms=1000))
    if how == "kill":
        server.kill()       # what the engine did: teardown expects it dead
    b = report["requests"]["b"]
    assert b["external_tokens"] == 4 * BLOCK
    assert b["load_errors"] == 4
    assert b["statuses"][-1] == "FINISHED_LENGTH_CAPPED"
    assert b["prefill_tokens"] == len(tokens)     # all of it computed here after all


def test_a_dead_store_is_a_miss_not_a_stuck_request(vllm_python, server_factory, ns):
    server = server_factory(memory="64MiB")
    server.kill()
    report = engine(vllm_python, server, ns, [{"requests": {"a": prompt(6, 3, extra=1)}}],
                    timeout_ms=500)
    a = report["requests"]["a"]
    assert a["external_tokens"] == 0 and a["statuses"][-1] == "FINISHED_LENGTH_CAPPED"


@pytest.mark.parametrize("mla", [False, True])
def test_tp_ranks_store_their_shards_and_dp_replicas_share(vllm_python, server, ns, mla):
    """TP 2: MHA ranks each store their shard; MLA's ranks hold the same
    bytes, one rank writes them. Another DP replica (TP 2) loads both ranks
    byte-exact; a TP 1 engine of MHA has other keys and misses."""
    tokens = prompt(7, 3, extra=5)
    saver = engine(vllm_python, server, ns, [{"requests": {"a": tokens}}], tp=2, mla=mla)
    assert saver["stats"]["save_keys"] == 3 * (1 if mla else 2)
    replica, single = engines(
        vllm_python, server, ns,
        dict(phases=[{"requests": {"b": tokens}}], tp=2, mla=mla, dp_rank=1),
        dict(phases=[{"requests": {"c": tokens}}], tp=1, mla=mla))
    assert replica["requests"]["b"]["loaded_exact"] == [True] * 3
    assert single["requests"]["c"]["external_tokens"] == (3 * BLOCK if mla else 0)


def test_pipeline_stages_store_their_layers(vllm_python, server, ns):
    """PP 2 x TP 2: four workers, each stage with its own layer; a hit needs
    every stage's and rank's shard, and a PP 1 engine (other geometry)
    misses."""
    tokens = prompt(9, 3, extra=2)
    saver = engine(vllm_python, server, ns, [{"requests": {"a": tokens}}], tp=2, pp=2)
    assert saver["stats"]["save_keys"] == 3 * 4
    loader, flat = engines(vllm_python, server, ns,
                           dict(phases=[{"requests": {"b": tokens}}], tp=2, pp=2),
                           dict(phases=[{"requests": {"c": tokens}}], tp=2))
    assert loader["requests"]["b"]["loaded_exact"] == [True] * 3
    assert flat["requests"]["c"]["external_tokens"] == 0


def test_objects_of_several_blocks_skip_what_the_engine_holds(vllm_python, server, ns):
    """blocks_per_key 4: only whole chunks are stored and hit; a chunk the
    engine's own prefix cache holds part of is loaded around those blocks."""
    extra = {"blocks_per_key": 4}
    tokens = prompt(8, 9, extra=2)
    # The second engine: a 6-block local hit, then 2 blocks of the second chunk load.
    saver, report = engines(vllm_python, server, ns,
                            dict(phases=[{"requests": {"a": tokens}}], extra=extra),
                            dict(phases=[{"requests": {"p": tokens[:6 * BLOCK + 1]}},
                                         {"requests": {"q": tokens}}], extra=extra))
    assert saver["stats"]["save_keys"] == 2
    q = report["requests"]["q"]
    assert q["local_tokens"] == 6 * BLOCK
    assert q["external_tokens"] == 2 * BLOCK
    assert q["loaded_exact"] == [True] * 2 and q["prefill_tokens"] == len(tokens) - 8 * BLOCK


def test_preempted_requests_finish_and_give_back_their_blocks(vllm_python, server, ns):
    """Few blocks and long requests: vLLM preempts and resumes them while
    their saves run; all finish and every block comes back."""
    requests = {f"r{i}": prompt(10 + i, 6, extra=4) for i in range(4)}
    report = engine(vllm_python, server, ns, [{"requests": requests, "max_tokens": 60}],
                    blocks=24)
    assert report["preemptions"] >= 1
    assert all(r["statuses"][-1] == "FINISHED_LENGTH_CAPPED" for r in report["requests"].values())


WINDOW = 32                 # tokens of the sliding-window layer: vLLM keeps 31 below a hit


def test_a_sliding_window_model_loads_full_layers_and_its_window(vllm_python, server, ns):
    """A hybrid model (a full-attention and a sliding-window layer, two KV
    cache groups over the same memory): every computed block of both is
    saved; a fresh process loads the full layer's blocks of the whole hit
    and only the window's blocks of the sliding layer (vLLM leaves the
    others null), all byte-exact."""
    tokens = prompt(21, 6, extra=8)
    saver = engine(vllm_python, server, ns, [{"requests": {"a": tokens}}], window=WINDOW)
    assert saver["stats"]["save_keys"] == 6 * 2 and saver["stats"]["save_failed_keys"] == 0
    # The plain engine, in the loader's process, checks the keys at the end.
    loader, plain = engines(vllm_python, server, ns, dict(phases=[
        {"occupy_blocks": 7, "requests": {"b": tokens, "d": prompt(21, 3) + prompt(22, 2, 1)}}],
        window=WINDOW), dict(phases=[{"requests": {"c": tokens}}]))
    b, d = loader["requests"]["b"], loader["requests"]["d"]
    assert b["external_tokens"] == 6 * BLOCK and b["loaded_exact"] == [True] * 6
    assert b["window_exact"] == [True] * 2          # blocks 4 and 5: (96 - 31) // 16 = 4
    assert d["external_tokens"] == 3 * BLOCK and d["loaded_exact"] == [True] * 3
    assert d["window_exact"] == [True] * 2          # blocks 1 and 2
    assert loader["stats"]["load_keys"] == (6 + 2) + (3 + 2)
    # Other keys than the same model without the sliding window.
    assert plain["requests"]["c"]["external_tokens"] == 0


def test_a_window_block_missing_shortens_the_hit(vllm_python, server, ns):
    """The sliding layer's objects of blocks 5 and 1 are gone: a hit of 6
    blocks needs block 5 in its window, so it stops at 5 blocks (window:
    blocks 3 and 4). A hit of 3 or 2 blocks needs block 1, so that prompt
    gets 1 block, though the full layer's objects of 3 are there."""
    tokens = prompt(23, 6, extra=8)
    engine(vllm_python, server, ns, [{"requests": {"a": tokens}}], window=WINDOW)
    # Two engines of one process: c's engine shares no prefix cache with b's.
    first, second = engines(vllm_python, server, ns, dict(phases=[
        {"drop": {"tokens": tokens, "group": 1, "blocks": [5, 1]},
         "requests": {"b": tokens}}], window=WINDOW),
        dict(phases=[{"requests": {"c": tokens[:3 * BLOCK + 5]}}], window=WINDOW))
    b = first["requests"]["b"]
    assert b["external_tokens"] == 5 * BLOCK
    assert b["loaded_exact"] == [True] * 5 and b["window_exact"] == [True] * 2
    c = second["requests"]["c"]
    assert c["external_tokens"] == BLOCK
    assert c["loaded_exact"] == [True] and c["window_exact"] == [True]


def test_blocks_a_window_lets_go_wait_for_the_saves_reading_them(vllm_python, server, ns):
    """Chunked prefill in a small pool: the sliding layer's blocks leave the
    window and vLLM hands them out again a few steps later, while a slow
    store has not read them yet. The forward that would overwrite them waits
    for those saves, so every stored object holds what the forward wrote."""
    tokens = prompt(24, 14, extra=3)
    report = engine(vllm_python, server, ns, [{"requests": {"a": tokens}}], window=WINDOW,
                    blocks=24, batch_tokens=2 * BLOCK, slow_saves_s=0.25, check_stored=True)
    stored = report["requests"]["a"]["stored_exact"]
    assert stored == [True] * (14 * 2), stored


# What an engine must refuse to start with, and what its error says.
REFUSALS = [
    ({"hash_algo": "xxhash"}, "PYTHONHASHSEED"),        # random block hashes: no seed set
    ({"extra": {"blocks_per_key": 0}}, "blocks_per_key must be an int >= 1"),
    ({"extra": {"no_such_option": 1}}, "unknown option 'no_such_option'"),
    ({"extra": {"transport": "carrier-pigeon"}}, "transport must be one of"),
    ({"pretend_version": "0.34.0"}, "built for vllm 0.33.x, this is vllm 0.34.0"),
]


def test_wrong_settings_are_refused_at_start_clearly(vllm_python, server, ns):
    """Each engine of REFUSALS, built one after another in one process,
    refuses to start, saying why."""
    reports = engines(vllm_python, server, ns, *(dict(phases=[], **fields)
                                                  for fields, _ in REFUSALS))
    for (fields, message), report in zip(REFUSALS, reports):
        assert message in report.get("error", ""), (fields, report)


def test_random_block_hashes_start_with_a_hash_seed_set(vllm_python, server, ns):
    seeded = engine(vllm_python, server, ns, [], hash_algo="xxhash", env={"PYTHONHASHSEED": "0"})
    assert "error" not in seeded


SHARDS = r'''
import json
from types import SimpleNamespace as NS
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec
from gdrkv.adapters.vllm.connector import Options, Shards

def shards(spec, tp, pcp, dcp):
    config = NS(parallel_config=NS(tensor_parallel_size=tp, pipeline_parallel_size=1,
                                   prefill_context_parallel_size=pcp,
                                   decode_context_parallel_size=dcp),
                cache_config=NS(kv_cache_layout=None, cache_dtype="auto"))
    group = NS(kv_cache_spec=spec, layer_names=[f"model.layers.{i}.attn" for i in range(4)])
    return Shards(config, [group], Options(url="gdrkv://local", blocks_per_key=1, model="m",
                                         client_options={}), 16)

mha = shards(FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64,
                               dtype=torch.bfloat16), tp=4, pcp=2, dcp=2)
mla = shards(MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576,
                              dtype=torch.bfloat16), tp=4, pcp=2, dcp=2)
ranks = [(tp, pcp) for tp in range(4) for pcp in range(2)]
print(json.dumps({
    "mha": {f"{tp},{pcp}": mha.scheme(tp, 0, pcp, tp % 2).prefix() for tp, pcp in ranks},
    "mla": {f"{tp},{pcp}": mla.scheme(tp, 0, pcp, tp % 2).prefix() for tp, pcp in ranks},
    "mha_all": mha.all_prefixes(), "mla_all": mla.all_prefixes(),
    "mha_writes": [mha.writes(tp, tp % 2) for tp in range(4)],
    "mla_writes": [mla.writes(tp, tp % 2) for tp in range(4)],
}))
'''


def test_context_parallel_ranks_in_keys(vllm_python):
    """PCP and DCP (TP 4, PCP 2, DCP 2): every rank whose KV bytes differ
    keys its own shard, and ranks holding the same bytes share one. MHA:
    each TP rank and PCP rank its own (a worker's DCP rank follows from its
    TP rank). MLA: TP ranks of one DCP rank hold the same bytes, so keys
    carry the DCP and PCP ranks only, and the first TP rank of each DCP
    rank writes."""
    got = run_vllm_script(vllm_python, ["-c", SHARDS], vllm_env())
    mha, mla = got["mha"], got["mla"]
    assert len(set(mha.values())) == 8 and sorted(got["mha_all"]) == sorted(mha.values())
    for key, prefix in mha.items():
        tp, pcp = map(int, key.split(","))
        parts = prefix.split("/")
        assert f"tp{tp}of4" in parts and f"cp{pcp}of2" in parts
        assert not [p for p in parts if p.startswith("dcp")], prefix
    assert got["mha_writes"] == [True] * 4
    assert len(set(mla.values())) == 4 and sorted(got["mla_all"]) == sorted(set(mla.values()))
    for key, prefix in mla.items():
        tp, pcp = map(int, key.split(","))
        parts = prefix.split("/")
        assert not [p for p in parts if p.startswith("tp")], prefix
        assert f"dcp{tp % 2}of2" in parts and f"cp{pcp}of2" in parts, prefix
        assert prefix == mla[f"{(tp + 2) % 4},{pcp}"]       # same DCP rank, same bytes
    assert got["mla_writes"] == [True, True, False, False]
