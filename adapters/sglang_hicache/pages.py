"""The pages of an SGLang host pool as gdrkv objects.

A page is one object made of the (pointer, size) segments the pool's
get_page_buffer_meta gives for it: K then V for MHA page_first layouts, one
K and one V per layer for layer_first, one segment (page_first) or one per
layer (layer_first) for MLA, the temporal and conv states of a Mamba slot,
one indexer row of a DSA page, and so on. Only the methods and attributes
that SGLang's own duck-typed test pools have are required (kv_buffer,
layout, page_size, get_page_buffer_meta); the rest is read when present.
"""
import torch

from gdrkv.keys import dtype_name

# Every tensor attribute a host pool keeps page bytes in. Some are views of
# others (MHA's k_buffer and v_buffer are halves of kv_buffer), so their
# ranges are merged before registration.
_BUFFER_ATTRS = ("kv_buffer", "k_buffer", "v_buffer", "index_k_buffer", "index_k_scale_buffer")


class HostPages:
    def __init__(self, pool):
        self.pool = pool
        self.page_size = pool.page_size
        self.layout = pool.layout
        # The geometry of page 0 is that of every page.
        _, sizes = pool.get_page_buffer_meta(torch.arange(self.page_size, dtype=torch.int64))
        if not sizes:
            raise ValueError(f"the {self.layout} host pool {type(pool).__name__} holds no page "
                             "bytes (a logical pool) and cannot back L3 storage")
        self.segment_bytes = tuple(int(s) for s in sizes)
        self.page_bytes = sum(self.segment_bytes)

    def dtype(self):
        """The element type the pool stores (uint8 for packed fp8/fp4)."""
        dtype = getattr(self.pool, "dtype", None)
        if dtype is None:
            tensors = _tensors(self.pool)
            if not tensors:
                raise ValueError("the host pool has neither a dtype nor a kv_buffer")
            dtype = tensors[0].dtype
        return dtype

    def element_types(self):
        """The element types of the pool's buffers, in order, joined by "+"
        ("fp32+bf16" for a Mamba pool with fp32 SSM and bf16 conv states)."""
        names = []
        for tensor in _tensors(self.pool):
            name = _element_name(tensor.dtype)
            if name not in names:
                names.append(name)
        return "+".join(names)

    def memory_ranges(self):
        """The pool's buffers as disjoint (address, nbytes) ranges."""
        spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
                       for t in _tensors(self.pool) if t.numel())
        merged = []
        for start, end in spans:
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        return [(start, end - start) for start, end in merged]

    def segments(self, host_indices, npages):
        """(ptrs, sizes) in gdrkv.Client batch form for the npages pages that
        start at host_indices[i * page_size]: ints for single-segment pages,
        lists of ints otherwise."""
        if host_indices.numel() != npages * self.page_size:
            raise ValueError(f"{host_indices.numel()} host indices for {npages} pages "
                             f"of {self.page_size} tokens")
        ptrs, sizes = self.pool.get_page_buffer_meta(host_indices)
        per_page = len(self.segment_bytes)
        if len(ptrs) != npages * per_page or tuple(sizes) != self.segment_bytes * npages:
            raise ValueError("the host pool's page segments changed since registration")
        if per_page == 1:
            return list(ptrs), list(sizes)
        page_sizes = list(self.segment_bytes)
        return ([ptrs[i:i + per_page] for i in range(0, len(ptrs), per_page)],
                [page_sizes] * npages)


def _tensors(pool):
    """The pool's buffers: those it exposes for registration
    (get_hybrid_pool_buffer, as SGLang's Mooncake store reads them), then
    the well-known attributes."""
    tensors = []
    hybrid = getattr(pool, "get_hybrid_pool_buffer", None)
    if callable(hybrid):
        tensors.extend(t for t in hybrid() if isinstance(t, torch.Tensor))
    for name in _BUFFER_ATTRS:
        value = getattr(pool, name, None)
        if isinstance(value, torch.Tensor):
            tensors.append(value)
        elif isinstance(value, (list, tuple)):
            tensors.extend(t for t in value if isinstance(t, torch.Tensor))
    return tensors


def _element_name(dtype):
    try:
        return dtype_name(dtype)
    except ValueError:                  # int32 slot state and the like
        return str(dtype).removeprefix("torch.")
