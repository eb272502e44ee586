"""Issue 7: store keys are a pure function of what decides the bytes.

Properties checked with hypothesis on gdrkv.keys and on the SGLang adapter's
own key path (SGLang's page hashes -> key_scheme(HiCacheStorageConfig, ...)):
the same keys in processes with different PYTHONHASHSEED, for every DP rank;
distinct keys for distinct TP ranks (MHA) and one key for all of them (MLA);
distinct keys for any change of dtype, layout, page size, geometry or model;
no collisions in a large sample; keys far below the 4096-byte protocol limit.
"""
import json
import os
import random
import re
import subprocess
import sys

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from support import engines
from gdrkv.keys import KeyScheme, dtype_name, engine_namespace, with_engine_namespace

# A gcov build of gdrkv counts no C line run by this file beyond the
# library's loading.
pytestmark = pytest.mark.no_asan("keys are pure Python")

PROTOCOL_KEY_LIMIT = 4096

models = st.one_of(
    st.sampled_from(["meta-llama/Llama-3.1-8B-Instruct", "deepseek-ai/DeepSeek-V3",
                     "/models/qwen2.5-72b", "Qwen/Qwen2.5-72B-Instruct-unified-token-major"]),
    st.text(min_size=1, max_size=300).filter(str.strip))
dtypes = st.sampled_from(["bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz"])
layouts = st.sampled_from(["layer_first", "page_first", "page_first_direct", "page_head",
                           "page_first_kv_split", "page_first.flat", "kv"])
page_sizes = st.sampled_from([1, 16, 32, 64, 256])
geometries = st.one_of(
    st.tuples(st.integers(1, 256), st.integers(1, 1 << 30)),
    st.lists(st.integers(1, 1 << 24), min_size=2, max_size=200).map(lambda s: (len(s), s)))


@st.composite
def coordinates(draw):
    """(tp_rank, tp_size, pp_rank, pp_size) with ranks inside their sizes."""
    tp_size, pp_size = draw(st.integers(1, 16)), draw(st.integers(1, 8))
    return (draw(st.integers(0, tp_size - 1)), tp_size,
            draw(st.integers(0, pp_size - 1)), pp_size)


@st.composite
def schemes(draw):
    """KeyScheme keyword arguments."""
    segments, segment_bytes = draw(geometries)
    tp_rank, tp_size, pp_rank, pp_size = draw(coordinates())
    fields = dict(engine=draw(st.sampled_from(["sglang", "lmcache"])), model=draw(models),
                  dtype=draw(dtypes), layout=draw(layouts), page_tokens=draw(page_sizes),
                  segments=segments, segment_bytes=segment_bytes, pp_rank=pp_rank,
                  pp_size=pp_size)
    if draw(st.booleans()):                 # MHA-like: the TP shard changes the bytes
        fields.update(tp_rank=tp_rank, tp_size=tp_size)
    return fields


# ---------------------------------------------------------------- across processes

# Runs in a fresh interpreter: SGLang's page hashes of each case's tokens, then
# the adapter's key path. Cases come on stdin, keys go to stdout.
ADAPTER_KEYS = """
import json, sys
from sglang.srt.mem_cache.cpp_utils.native_hash import get_native_hash
from gdrkv.adapters.sglang_hicache.page_keys import key_scheme
from support import sglang_pools
out = []
for case in json.load(sys.stdin):
    config = sglang_pools.storage_config(model=case["model"], mla=case["mla"],
        tp_rank=case["tp_rank"], tp_size=case["tp_size"], dp_rank=case["dp_rank"],
        pp_rank=case["pp_rank"], pp_size=case["pp_size"])
    scheme = key_scheme(config, layout=case["layout"], dtype=case["dtype"],
                        page_tokens=case["page_size"], segment_bytes=case["segment_bytes"])
    out.append(scheme.keys(get_native_hash(case["tokens"], None, case["page_size"])))
print(json.dumps(out))
"""


@st.composite
def adapter_cases(draw):
    tp_rank, tp_size, pp_rank, pp_size = draw(coordinates())
    page_size = draw(page_sizes)
    return dict(model=draw(models), mla=draw(st.booleans()), tp_rank=tp_rank, tp_size=tp_size,
                pp_rank=pp_rank, pp_size=pp_size, dp_rank=draw(st.integers(0, 7)),
                layout=draw(layouts), dtype=draw(dtypes), page_size=page_size,
                segment_bytes=draw(st.lists(st.integers(1, 1 << 20), min_size=1, max_size=8)),
                # SGLang stores full pages only.
                tokens=draw(st.integers(1, 4).flatmap(lambda pages: st.lists(
                    st.integers(0, 200_000), min_size=pages * page_size,
                    max_size=pages * page_size))))


def keys_in_fresh_process(cases, hashseed):
    engines.require("sglang.srt.mem_cache.hicache_storage")
    env = dict(os.environ, PYTHONHASHSEED=hashseed)
    done = subprocess.run([sys.executable, "-c", ADAPTER_KEYS], input=json.dumps(cases),
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


# Interpreters cost seconds each to start and import SGLang, cases cost
# nothing: hypothesis draws the cases (no shrinking, which would start more
# interpreters), then one interpreter per hash seed keys all of them.
CASES = 60


def test_same_keys_in_processes_with_any_hash_seed():
    cases = []

    @settings(max_examples=CASES, database=None, phases=[Phase.generate])
    @given(adapter_cases())
    def draw(case):
        cases.append(case)

    draw()
    runs = [keys_in_fresh_process(cases, seed) for seed in ("0", "1", "random")]
    for case, *keys in zip(cases, *runs):
        assert keys[0] == keys[1] == keys[2], case
        assert len(keys[0]) == len(case["tokens"]) // case["page_size"], case


# ---------------------------------------------------------------- ranks

def adapter_prefix(**config):
    """The adapter's key prefix for page_first bf16 pages under a
    HiCacheStorageConfig with these fields."""
    engines.require("sglang.srt.mem_cache.hicache_storage")
    from support import sglang_pools
    from gdrkv.adapters.sglang_hicache.page_keys import key_scheme

    return key_scheme(sglang_pools.storage_config(**config), layout="page_first", dtype="bf16",
                      page_tokens=64, segment_bytes=[4096, 4096]).prefix()


@given(coordinates(), st.integers(0, 63), st.integers(0, 63), st.booleans())
def test_dp_rank_never_changes_a_key(coordinate, dp_a, dp_b, mla):
    tp_rank, tp_size, pp_rank, pp_size = coordinate
    same = dict(mla=mla, tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size)
    assert adapter_prefix(dp_rank=dp_a, **same) == adapter_prefix(dp_rank=dp_b, **same)


@given(st.integers(2, 16).flatmap(lambda size: st.tuples(
    st.just(size), st.integers(0, size - 1), st.integers(0, size - 1))))
def test_tp_ranks_split_mha_and_share_mla(tp):
    size, a, b = tp
    mha = {adapter_prefix(tp_rank=r, tp_size=size) for r in (a, b)}
    assert len(mha) == len({a, b})
    assert all(f"/tp{r}of{size}/" in "".join(mha) for r in (a, b))
    mla = {adapter_prefix(mla=True, tp_rank=r, tp_size=size) for r in (a, b)}
    assert len(mla) == 1 and "/tp" not in mla.pop()


@given(st.sampled_from([2, 4, 8]).flatmap(lambda dcp: st.tuples(
    st.just(dcp), st.integers(1, 4).map(lambda groups: groups * dcp))))
def test_dcp_shards_split_and_dcp_groups_share(dcp_tp):
    """Under decode context parallelism every MLA rank of a DCP group holds
    another shard of the logical page: shards must never share a key, while
    the same shard in another DCP group (another TP rank) must."""
    dcp, tp_size = dcp_tp
    prefixes = {r: adapter_prefix(mla=True, tp_rank=r, tp_size=tp_size, dcp_size=dcp,
                                  logical_page_size=64 * dcp) for r in range(tp_size)}
    for r, prefix in prefixes.items():
        assert f"/dcp{r % dcp}of{dcp}/" in prefix and f"/lp{64 * dcp}/" in prefix
        assert prefix == prefixes[r % dcp]
    assert len(set(prefixes.values())) == dcp
    assert adapter_prefix(mla=True, tp_rank=0, tp_size=tp_size) not in prefixes.values()


# ---------------------------------------------------------------- fields

MUTATIONS = {
    "model": models,
    "dtype": dtypes,
    "layout": layouts,
    "page_tokens": page_sizes,
    "geometry": geometries,
    "pp_rank": st.integers(0, 7),
}


@given(schemes(), st.sampled_from(sorted(MUTATIONS)), st.data())
def test_any_field_change_changes_the_key(fields, name, data):
    other = dict(fields)
    if name == "geometry":
        other["segments"], other["segment_bytes"] = data.draw(geometries)
    elif name == "pp_rank":
        other["pp_size"] = max(fields["pp_size"], 8)
        other["pp_rank"] = data.draw(st.integers(0, other["pp_size"] - 1))
    else:
        other[name] = data.draw(MUTATIONS[name])
    if canonical(other) != canonical(fields):
        assert KeyScheme(**other).key("ab" * 32) != KeyScheme(**fields).key("ab" * 32)
    else:
        assert KeyScheme(**other).key("ab" * 32) == KeyScheme(**fields).key("ab" * 32)


def canonical(fields):
    """What a scheme's fields mean: equal sizes listed or counted, pp_size
    when pp_rank is absent, and so on are the same scheme."""
    sizes = fields["segment_bytes"]
    sizes = [sizes] * fields["segments"] if isinstance(sizes, int) else list(sizes)
    return (fields["engine"], fields["model"], dtype_name(fields["dtype"]), fields["layout"],
            fields["page_tokens"], tuple(sizes), fields.get("tp_rank"), fields.get("tp_size"),
            fields["pp_rank"], fields["pp_size"])


def random_scheme(rng):
    """KeyScheme fields drawn from rng: the large-sample twin of schemes()."""
    count = rng.choice([1, 2, 2, 2, 4, 64, 160])
    sizes = rng.choice([rng.randrange(1, 1 << 22)] * count if rng.random() < 0.8 else
                       [rng.randrange(1, 1 << 22) for _ in range(count)])
    tp_size, pp_size = rng.randint(1, 8), rng.randint(1, 4)
    fields = dict(engine=rng.choice(["sglang", "lmcache"]),
                  model=rng.choice(["org/m", "m", "other/m"]) + str(rng.randrange(50)),
                  dtype=rng.choice(["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"]),
                  layout=rng.choice(["page_first", "layer_first", "page_head"]),
                  page_tokens=rng.choice([1, 16, 64]), segments=count, segment_bytes=sizes,
                  pp_rank=rng.randrange(pp_size), pp_size=pp_size)
    if rng.random() < 0.5:
        fields.update(tp_rank=rng.randrange(tp_size), tp_size=tp_size)
    return fields


@settings(max_examples=3)
@given(st.integers(0, 2**64))
def test_no_collisions_in_a_large_sample(seed):
    rng = random.Random(seed)
    sample = [(random_scheme(rng), rng.randbytes(rng.randint(1, 8))) for _ in range(20000)]
    meanings = {(canonical(fields), content) for fields, content in sample}
    keys = {KeyScheme(**fields).key(content) for fields, content in sample}
    assert len(keys) == len(meanings)


@given(schemes())
def test_keys_are_short_and_readable(fields):
    fields.update(model="x" * 5000 + "/Llama-3.1-8B-Instruct", tp_rank=1, tp_size=2)
    key = KeyScheme(**fields).key("f" * 64)
    assert len(key.encode()) < PROTOCOL_KEY_LIMIT // 8
    assert "/Llama-3.1-8B-Instruct~" in key and "/tp1of2/" in key


def test_the_documented_example():
    scheme = KeyScheme(engine="sglang", model="meta-llama/Llama-3.1-8B-Instruct",
                       dtype="bfloat16", layout="page_first", page_tokens=64, segments=2,
                       segment_bytes=524288, tp_rank=0, tp_size=2, pp_rank=0, pp_size=1)
    assert scheme.prefix() == ("sglang/Llama-3.1-8B-Instruct~08a20b291e44/bf16/page_first/"
                               "p64/2x524288/tp0of2/pp0of1/")
    assert scheme.keys([b"\x01\xff", -26, "h"]) == [scheme.prefix() + k
                                                    for k in ("01ff", "-1a", "h")]


@pytest.mark.parametrize("spelling", ["bfloat16", "torch.bfloat16", "bf16", "BF16"])
def test_dtype_spellings_are_one_name(spelling):
    assert dtype_name(spelling) == "bf16"


@pytest.mark.parametrize("bad", [
    dict(model=""), dict(dtype="auto"), dict(layout="a/b"), dict(page_tokens=0),
    dict(segments=2, segment_bytes=[1]), dict(tp_rank=2, tp_size=2),
    dict(tp_rank=0, tp_size=None), dict(engine="sg lang"),
])
def test_bad_fields_are_refused(bad):
    fields = dict(engine="sglang", model="m", dtype="bf16", layout="page_first",
                  page_tokens=16, segments=1, segment_bytes=8)
    with pytest.raises(ValueError):
        KeyScheme(**{**fields, **bad})


def test_bad_hashes_are_refused():
    scheme = KeyScheme(engine="sglang", model="m", dtype="bf16", layout="page_first",
                       page_tokens=16, segments=1, segment_bytes=8)
    for bad in ("", "x" * 2000, None, 1.5):
        with pytest.raises(ValueError):
            scheme.key(bad)


# ---------------------------------------------------------------- namespaces

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs")


def test_engines_get_namespaces_of_their_own_unless_told():
    model = "meta-llama/Llama-3.1-8B-Instruct"
    mine = with_engine_namespace("gdrkv://h:7480", {"timeout_ms": 5}, "sglang", model)
    assert mine == {"timeout_ms": 5, "namespace": engine_namespace("sglang", model)}
    assert engine_namespace("sglang", model).startswith("sglang/Llama-3.1-8B-Instruct~")
    assert len({engine_namespace(e, m) for e in ("sglang", "lmcache", "vllm")
                for m in (model, model + "-2")}) == 6
    # Told: in the options (even ""), or in the url's query.
    assert with_engine_namespace("gdrkv://h", {"namespace": ""}, "sglang", model) == \
        {"namespace": ""}
    assert with_engine_namespace("gdrkv://h:1,h:2?namespace=shared&conns=2", {}, "vllm",
                                 model) == {}
    assert engine_namespace("lmcache", "") == "lmcache"


def test_shipped_configs_never_share_a_namespace_by_accident():
    """Copied verbatim, the SGLang and vLLM configs leave the namespace to
    the adapters' defaults, and no LMCache config names one those could be."""
    for name in ("sglang_hicache.json", "sglang_hicache_cluster.json"):
        with open(os.path.join(CONFIGS, "sglang", name)) as f:
            assert "namespace" not in json.load(f)
    with open(os.path.join(CONFIGS, "sglang", "sglang_hicache.yaml")) as f:
        assert not [line for line in f if line.startswith("namespace")]
    for name in ("kv_transfer_config.json", "kv_transfer_config_cluster.json"):
        with open(os.path.join(CONFIGS, "vllm", name)) as f:
            assert "namespace" not in json.load(f)["kv_connector_extra_config"]
    for name in os.listdir(os.path.join(CONFIGS, "lmcache")):
        if name.endswith(".yaml"):
            with open(os.path.join(CONFIGS, "lmcache", name)) as f:
                for named in re.findall(r"namespace=([^&\"\s]*)", f.read()):
                    assert named and not named.startswith(("sglang/", "vllm/")), name
