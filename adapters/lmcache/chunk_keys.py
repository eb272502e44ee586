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
import importlib.util
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


def require_deterministic_hashing():
    """Raises IrrecoverableException when chunk hashes would differ between
    processes, which would make every lookup by another process miss.

    With vLLM importable, LMCache seeds its hash chain from vLLM's NONE_HASH:
    random in every process unless PYTHONHASHSEED holds a number (the default
    "builtin" hash also randomises strings, so "random" is no better than
    unset). Without vLLM, LMCache starts the chain at 0 and hashes only
    integers, which Python never randomises.
    """
    seed = os.environ.get("PYTHONHASHSEED")
    if (seed is not None and seed.isdigit()) or importlib.util.find_spec("vllm") is None:
        return
    raise IrrecoverableException(
        "gdrkv: LMCache's chunk hashes are not deterministic across processes: vLLM is "
        f"installed and PYTHONHASHSEED is {'unset' if seed is None else repr(seed)}, so every "
        "process hashes the same tokens to other keys and never hits what another process "
        "stored. Set the same PYTHONHASHSEED for every vLLM process before it starts, "
        "e.g. `export PYTHONHASHSEED=0`.")
