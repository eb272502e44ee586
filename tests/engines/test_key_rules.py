"""The rules of docs/keys.md's table that test_keys.py's properties do not
pin down: the content-hash cap, the model part's length and characters,
geometry compaction, dtype objects, LMCache's request tags and SGLang's
storage-format tag."""
import hashlib

import pytest
import torch

from support import engines
from gdrkv.keys import KeyScheme, dtype_name

# As test_keys.py: a gcov build counts no C line beyond the library's loading.
pytestmark = pytest.mark.no_asan("keys are pure Python")

FIELDS = dict(engine="sglang", model="org/model", dtype="bf16", layout="page_first",
              page_tokens=64, segments=2, segment_bytes=4096)


def scheme(**changes):
    return KeyScheme(**{**FIELDS, **changes})


def parts(key):
    return key.split("/")


@pytest.mark.parametrize("content_hash", ["a" * 1024, bytes(512), (1 << 4095) + 1],
                         ids=["str", "bytes", "int"])
def test_content_hashes_up_to_1024_bytes(content_hash):
    key = scheme().key(content_hash)
    assert len(parts(key)[-1]) == 1024


@pytest.mark.parametrize("content_hash", ["a" * 1025, bytes(513), 1 << 4096, "é" * 513],
                         ids=["str", "bytes", "int", "utf8"])
def test_content_hashes_over_1024_bytes_are_refused(content_hash):
    with pytest.raises(ValueError, match="1-1024 bytes"):
        scheme().key(content_hash)


def test_model_part_is_48_safe_characters_and_a_digest_of_the_identity():
    identity = "/models/" + "a b:c" * 20 + "/"
    model = parts(scheme(model=identity).key("h"))[1]
    readable, digest = model.split("~")
    assert readable == ("a_b_c" * 20)[:48]
    assert digest == hashlib.sha256(identity.encode()).hexdigest()[:12]
    # Identities that read the same are still told apart by the digest.
    other = parts(scheme(model=identity.rstrip("/")).key("h"))[1]
    assert other.split("~")[0] == readable and other != model


def test_geometry_is_listed_up_to_64_characters_then_compacted():
    short = [1000, 2000, 3000]
    assert parts(scheme(segments=3, segment_bytes=short).key("h"))[5] == "1000+2000+3000"
    long_a = [100000 + i for i in range(12)]                  # 83 characters listed
    long_b = long_a[:-2] + [long_a[-1], long_a[-2]]          # same count and total
    geo_a = parts(scheme(segments=12, segment_bytes=long_a).key("h"))[5]
    geo_b = parts(scheme(segments=12, segment_bytes=long_b).key("h"))[5]
    assert geo_a.startswith(f"12s{sum(long_a)}~") and len(geo_a) <= 64
    assert geo_a != geo_b


def test_dtype_objects_name_the_same_dtype():
    assert dtype_name(torch.bfloat16) == dtype_name("bfloat16") == "bf16"
    assert scheme(dtype=torch.bfloat16).key("h") == scheme(dtype="bf16").key("h")
    assert dtype_name(torch.float8_e4m3fn) == "fp8_e4m3"


def test_lmcache_request_tags_are_part_of_the_key():
    engines.require("lmcache")
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.memory_management import MemoryFormat

    from gdrkv.adapters.lmcache.chunk_keys import ChunkKeys

    keys = ChunkKeys(MemoryFormat.KV_2LTD, 256, 1 << 20)

    def key(tags):
        return keys.one(CacheEngineKey(model_name="m", world_size=2, worker_id=1,
                                       chunk_hash=-0x5d3c, dtype=torch.bfloat16,
                                       request_configs=tags))

    plain = key(None)
    tagged = key({"lmcache.tag.user": "alice", "lmcache.tag.prio": "3"})
    assert parts(plain)[-1] == "-5d3c"
    assert parts(tagged)[-1] == "-5d3c@user%alice@prio%3"
    assert key({"lmcache.tag.user": "bob"}) != key({"lmcache.tag.user": "alice"})
    assert parts(tagged)[:-1] == parts(plain)[:-1]


def test_lmcache_mla_keys_carry_no_rank():
    """#16 item 7: under mla.yaml's save_only_first_rank, LMCache passes rank
    1's reads with worker id 1 and world size 1; MLA keys are rank-less, so
    they are rank 0's keys and build without error. Non-MLA keys keep the rank."""
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.memory_management import MemoryFormat

    from gdrkv.adapters.lmcache.chunk_keys import ChunkKeys

    def key(keys, world_size, worker_id):
        return keys.one(CacheEngineKey(model_name="m", world_size=world_size,
                                       worker_id=worker_id, chunk_hash=0x77,
                                       dtype=torch.bfloat16))

    mla = ChunkKeys(MemoryFormat.KV_MLA_FMT, 256, 1 << 20, mla=True)
    assert key(mla, 1, 1) == key(mla, 1, 0) == key(mla, 2, 1) == key(mla, 2, 0)
    mha = ChunkKeys(MemoryFormat.KV_2LTD, 256, 1 << 20)
    assert key(mha, 2, 1) != key(mha, 2, 0)
    with pytest.raises(ValueError, match="tp_rank"):
        key(mha, 1, 1)


def test_sglang_model_is_tagged_with_the_pools_storage_format():
    """SGLang names the model with the host pool's format tag (the unified
    pool's token-major pages are other bytes than a plain pool's); the
    adapter keys on that name, so the two never share pages."""
    engines.require("sglang")
    engines.torchvision_stand_in()      # SGLang's config modules import it
    from support import sglang_pools
    from gdrkv.adapters.sglang_hicache.page_keys import key_scheme
    from sglang.srt.managers.cache_controller import storage_model_name

    class Pool:
        storage_format_tag = None

    class TokenMajor:
        storage_format_tag = "unified-token-major"

    def model_part(pool):
        config = sglang_pools.storage_config(model=storage_model_name("org/m", pool))
        keys = key_scheme(config, layout="page_first", dtype="bf16", page_tokens=64,
                          segment_bytes=[4096])
        return parts(keys.key("h"))[1]

    plain, tagged = model_part(Pool()), model_part(TokenMajor())
    assert plain.startswith("m~") and tagged.startswith("m-unified-token-major~")
    assert plain.split("~")[1] != tagged.split("~")[1]
