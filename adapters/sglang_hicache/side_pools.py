"""HiCache v2 side pools: their pages and keys, and the hit policies that
decide how much of a prefix batch_exists_v2 can restore.

SGLang's references (HiCacheFile, its Mooncake store) define the policies:
the KV pages give the longest prefix; every prefix length 1..n stays
restorable until a pool rules it out. ALL_PAGES pools (DSA indexer, DeepSeek
V4 compressed pools) need their object of every page of the prefix;
TRAILING_PAGES pools (Mamba and SWA state) only of the last len(keys) pages
before the cut, so they leave holes; BLOCK_GROUPS pools report the pages of
their leading complete groups of group_pages keys and never gate the KV
hit.
"""
from itertools import accumulate

from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransferResult

from .page_keys import side_pool_key_scheme
from .pages import HostPages


class SidePool:
    """A registered side pool: its pages and the keys of its objects."""

    def __init__(self, pool, name, config, kv_dtype):
        self.pages = HostPages(pool)
        self.keys = side_pool_key_scheme(config, name, self.pages, kv_dtype)

    @staticmethod
    def exists_keys(kv_keys, transfer):
        """The page hashes batch_exists_v2 looks up for this pool: the KV
        pages' own (the pool's object of page i is keyed by page i's hash),
        or a BLOCK_GROUPS transfer's keys where it brings them."""
        if transfer.hit_policy == PoolHitPolicy.BLOCK_GROUPS and transfer.keys:
            return list(transfer.keys)
        return list(kv_keys)


def hit_result(kv_found, pools):
    """The PoolTransferResult of KV pages found as kv_found (one bool per
    key) and of pools, (PoolTransfer, [bool per looked-up key]) pairs."""
    kv_pages = _leading(kv_found)
    hits = {PoolName.KV: kv_pages} if kv_pages else {}
    restorable = set(range(1, kv_pages + 1))
    for transfer, found in pools:
        if not restorable:          # as the references: later pools get no verdict
            break
        if transfer.hit_policy == PoolHitPolicy.BLOCK_GROUPS:
            group = max(1, transfer.group_pages)
            covered = _leading([all(found[i:i + group]) for i in range(0, len(found), group)
                                if len(found[i:i + group]) == group]) * group
            if covered:
                hits[transfer.name] = covered
            continue
        found = found[:kv_pages]
        if transfer.hit_policy == PoolHitPolicy.ALL_PAGES:
            boundary = _leading(found)
            pool_restorable = set(range(1, boundary + 1))
        elif transfer.hit_policy == PoolHitPolicy.TRAILING_PAGES:
            pool_restorable = _trailing_restorable(found, max(1, len(transfer.keys or ())))
            boundary = max(pool_restorable, default=0)
        else:
            raise ValueError(f"unknown pool hit policy {transfer.hit_policy!r}")
        if boundary:
            hits[transfer.name] = boundary
        restorable &= pool_restorable
    ordered = sorted(restorable)
    return PoolTransferResult(ordered[-1] if ordered else 0, hits, ordered)


def _leading(found):
    """How many from the start are True."""
    return found.index(False) if False in found else len(found)


def _trailing_restorable(found, window):
    """The prefix lengths p whose last `window` pages (fewer at the start)
    all exist."""
    missing = [0, *accumulate(0 if ok else 1 for ok in found)]
    return {p for p in range(1, len(found) + 1) if missing[p] == missing[max(0, p - window)]}
