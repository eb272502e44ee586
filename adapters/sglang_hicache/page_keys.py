"""The store keys of an SGLang deployment's pages: KV pages and the pages of
every HiCache v2 side pool (docs/keys.md)."""
import hashlib

from gdrkv.keys import KeyScheme

# Longest layout field KeyScheme takes; longer side-pool descriptions are digested.
_LAYOUT_CHARS = 64


def key_scheme(config, *, layout, dtype, page_tokens, segment_bytes, tp_sharded=None):
    """The KeyScheme of pages of one geometry for a HiCacheStorageConfig:
    the model, and the TP (unless tp_sharded is False, by default not for
    MLA, whose pages are the same on every TP rank), PP, context-parallel
    and decode-context-parallel coordinates; never the DP rank. Under DCP
    each MLA rank of a DCP group holds another shard of the logical page, so
    the DCP rank and the logical page size are part of the key (SGLang's own
    file backend keys them the same way)."""
    if tp_sharded is None:
        tp_sharded = not config.is_mla_model
    tp = (config.tp_rank, config.tp_size) if tp_sharded else (None, None)
    cp = (config.attn_cp_rank, config.attn_cp_size) if config.attn_cp_size > 1 else (None, None)
    dcp_size = getattr(config, "dcp_size", 1) or 1
    dcp = (config.dcp_rank, dcp_size) if dcp_size > 1 else (None, None)
    logical = config.logical_page_size if dcp_size > 1 else None
    return KeyScheme(engine="sglang", model=config.model_name, dtype=dtype, layout=layout,
                     page_tokens=page_tokens, segments=len(segment_bytes),
                     segment_bytes=list(segment_bytes), tp_rank=tp[0], tp_size=tp[1],
                     pp_rank=config.pp_rank, pp_size=config.pp_size,
                     cp_rank=cp[0], cp_size=cp[1], dcp_rank=dcp[0], dcp_size=dcp[1],
                     logical_page_tokens=logical)



def side_pool_key_scheme(config, name, pages, kv_dtype):
    """The KeyScheme of a side pool's pages (HostPages of the pool named
    name): the KV pages' scheme with the pool's name and element types in
    the layout field, so that a Mamba state, a DSA indexer row or a draft
    page never shares a key with a KV page, another pool's object or the
    same pool in another dtype. kv_dtype (the KV cache's, which also decides
    the bytes of KV-like side pools) is the dtype field; a logical anchor
    has none and the pool's own dtype stands in."""
    layout = f"{pages.layout}.{name}.{pages.element_types()}"
    if len(layout) > _LAYOUT_CHARS:
        digest = hashlib.sha256(layout.encode()).hexdigest()[:8]
        layout = f"{layout[:_LAYOUT_CHARS - 9]}~{digest}"
    return key_scheme(config, layout=layout, dtype=kv_dtype or pages.dtype(),
                      page_tokens=pages.page_size, segment_bytes=pages.segment_bytes,
                      tp_sharded=side_pool_tp_sharded(config, name, pages.pool))


def side_pool_tp_sharded(config, name, pool):
    """Whether a side pool's bytes differ between TP ranks. In an MHA model
    every pool is sharded by heads. In an MLA model the indexer, DeepSeek
    V4 and MLA draft pools are the same on every rank (one rank-less copy,
    like the KV pages), but Mamba/KDA state is sharded, and so is any pool
    with separate K and V buffers (an MHA draft model, MHA sliding-window
    layers). SGLang backs up an MLA model's side pools from its KV writer
    rank only, except Mamba: the other ranks then miss a sharded pool's
    pages rather than read the writer's shard."""
    if not config.is_mla_model:
        return True
    return name == "mamba" or hasattr(pool, "v_buffer")
