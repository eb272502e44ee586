"""Store keys of LMCache chunks, and the check that they stay the same
across processes.

A chunk's store key is the gdrkv.keys scheme (docs/keys.md) filled in from
its CacheEngineKey and the chunk geometry. Model and KV dtype come from the
CacheEngineKey, and so does the worker coordinate, except under MLA: every
TP rank holds the same latent KV, so MLA keys carry no rank at all, whatever
worker id LMCache hands over (its save_only_first_rank mode passes rank 1's
reads with worker id 1 and world size 1, which names no rank).
LMCache's world size and worker id count the TP x PP workers of one DP
replica, so DP replicas share keys. Memory format, chunk tokens and chunk
bytes come from the connector: a reader of another geometry computes
another key and misses instead of reading bytes laid out differently.
"""
import importlib.metadata
import os

from lmcache.v1.exceptions import IrrecoverableException

from gdrkv.keys import KeyScheme


class ChunkKeys:
    """Maps CacheEngineKeys to gdrkv store keys for one chunk geometry."""

    def __init__(self, memory_format, chunk_tokens, chunk_bytes, mla=False):
        # An LMCache chunk is one contiguous buffer, hence one segment.
        self._geometry = dict(engine="lmcache", layout=memory_format.name.lower(),
                              page_tokens=chunk_tokens, segments=1, segment_bytes=chunk_bytes)
        self._mla = mla
        # One scheme per (model, world size, worker id, dtype): a connector
        # sees one or two of them (its own, and worker 0's under MLA).
        self._schemes = {}

    def of(self, keys):
        return [self.one(key) for key in keys]

    def one(self, key):
        return self._scheme(key).key(_content_id(key))

    def _scheme(self, key):
        rank = (None, None) if self._mla else (key.worker_id, key.world_size)
        identity = (key.model_name, *rank, key.dtype)
        scheme = self._schemes.get(identity)
        if scheme is None:
            # LMCache's worker coordinate spans TP x PP; it goes where TP does.
            scheme = KeyScheme(model=key.model_name, dtype=key.dtype, tp_rank=rank[0],
                               tp_size=rank[1], **self._geometry)
            self._schemes[identity] = scheme
        return scheme


def _content_id(key):
    """The chunk hash, plus the request tags that LMCache also keys on (the
    same "name%value" spelling as CacheEngineKey.to_string())."""
    return "@".join([key.chunk_hash_hex, *(f"{name}%{value}" for name, value in key.tags or ())])


def require_deterministic_hashing(algorithm="builtin"):
    """Raises IrrecoverableException when chunk hashes would differ between
    processes, which would make every lookup by another process miss.

    LMCache seeds its hash chain with vLLM's NONE_HASH when it can import
    vLLM's kv_cache_utils, else with 0 (and then hashes only integers, which
    Python never randomises). vLLM derives NONE_HASH by hashing a seed with
    LMCache's pre_caching_hash_algorithm: the seed is PYTHONHASHSEED if set,
    else a fixed one for sha256 and sha256_cbor but random bytes for xxhash;
    and "builtin" is Python's hash(), which randomises that string unless
    PYTHONHASHSEED holds a number. Rather than restate vLLM's rules, this
    asks the vLLM that LMCache will ask, as LMCache does.
    """
    seed = os.environ.get("PYTHONHASHSEED")
    if seed is not None and seed.isdigit():
        return
    if _vllm_seeds_chunk_hashes_alike(algorithm):
        return
    raise IrrecoverableException(
        "gdrkv: LMCache's chunk hashes are not deterministic across processes: vLLM is "
        f"installed, pre_caching_hash_algorithm is {algorithm!r} and PYTHONHASHSEED is "
        f"{'unset' if seed is None else repr(seed)}, so every process hashes the same tokens "
        "to other keys and never hits what another process stored. Set the same "
        "PYTHONHASHSEED for every vLLM process before it starts, e.g. `export PYTHONHASHSEED=0`, "
        "or use pre_caching_hash_algorithm: sha256_cbor.")


def _vllm_seeds_chunk_hashes_alike(algorithm):
    """Whether every process gets the NONE_HASH this one gets (PYTHONHASHSEED
    not a number): there is no vLLM distribution, or LMCache could not use
    it (NONE_HASH is then 0), or vLLM resolves the same seed twice for a
    hash of vLLM's own (hash() of a string is random per process). A folder
    named vllm on the path is no vLLM: LMCache's import of kv_cache_utils
    fails there too."""
    try:
        importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        return True
    try:
        from vllm.v1.core import kv_cache_utils
    except ImportError:
        return True
    if not hasattr(kv_cache_utils, "init_none_hash"):
        return True
    resolve = getattr(kv_cache_utils, "resolve_none_hash_seed", None)
    hash_fn = _vllm_hash_fn(algorithm)
    if resolve is None or hash_fn is None:
        return False
    return resolve(hash_fn) == resolve(hash_fn)


def _vllm_hash_fn(algorithm):
    """vLLM's hash function of that name, as LMCache picks it (under its old
    name too), or None where LMCache falls back to Python's hash()."""
    try:
        from vllm.utils.hashing import get_hash_fn_by_name
        return get_hash_fn_by_name({"sha256_cbor_64bit": "sha256_cbor"}.get(algorithm, algorithm))
    except (ImportError, ValueError):
        return None
