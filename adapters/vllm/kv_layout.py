"""Where block b of every layer lives in vLLM's paged KV tensors, and the
segments of one stored object. Imports no vLLM (and no torch): anything with
torch's tensor methods will do, on the CPU or a GPU.

A layer's tensor has the block index first, as vLLM 0.33 allocates it:
(num_blocks, num_kv_heads, block_size, 2 * head_size), or MLA's (num_blocks,
block_size, head_size). Block b of a layer is one dense span of bytes at
base + b * stride, whatever the order of the dimensions inside it (vLLM's
layout name, in the key, says which order that is). The older
(2, num_blocks, ...) shape, K and V apart, is refused: its bytes are in
another order than the same block of the 0.33 layouts.

An object holds blocks_per_key consecutive blocks of the request, each block
as its layers in order: segment (i, l) is block i of the chunk in layer l.
Layers are ordered by name with numbers compared as numbers, so every
process of a deployment lays an object out the same way.
"""
import re

_NUMBER = re.compile(r"(\d+)")


def layer_order(names):
    """Layer names sorted as a model lists them: layers.2 before layers.10."""
    return sorted(names, key=lambda n: [int(p) if p.isdigit() else p
                                        for p in _NUMBER.split(n)])


def _dense_bytes(sizes, strides, element_size):
    """Bytes of a block whose dimensions (sizes, strides) pack densely in some
    order, or None when they leave holes or overlap."""
    span = 1
    for size, stride in sorted(zip(sizes, strides), key=lambda d: d[1]):
        if size == 1:
            continue
        if stride != span:
            return None
        span *= size
    return span * element_size


class KVLayout:
    """Where the blocks of a model's KV tensors are (dict layer name ->
    tensor, every tensor holding num_blocks blocks): planes[l] is layer l's
    (base address, block stride). Raises ValueError on a layout it cannot
    cut into equal dense block spans."""

    def __init__(self, kv_caches, num_blocks):
        if not kv_caches:
            raise ValueError("no KV cache tensors to register")
        self.layer_names = layer_order(kv_caches)
        planes, segment_bytes, devices = [], set(), set()
        for name in self.layer_names:
            tensor = kv_caches[name]
            base, stride, nbytes = _plane(name, tensor, num_blocks)
            planes.append((base, stride))
            segment_bytes.add(nbytes)
            devices.add(str(tensor.device))
        if len(segment_bytes) != 1:
            raise ValueError(f"KV blocks differ in size across layers ({sorted(segment_bytes)} "
                             "bytes): one object layout cannot hold them")
        if len(devices) != 1:
            raise ValueError(f"KV caches on several devices: {sorted(devices)}")
        self.num_blocks = num_blocks
        self.planes = planes
        self.segment_bytes = segment_bytes.pop()
        self.device = devices.pop()
        self.dtype = kv_caches[self.layer_names[0]].dtype
        self.regions = _regions(kv_caches.values())

    def segments(self, block_ids, skip_ptr=None):
        """The segment pointers of an object holding block_ids in that order
        (a block id < 0 is one the object holds but the caller does not
        want: its segments point at skip_ptr, scratch memory of
        segment_bytes)."""
        ptrs = []
        for block in block_ids:
            if block < 0:
                ptrs.extend([skip_ptr] * len(self.planes))
                continue
            if block >= self.num_blocks:
                raise ValueError(f"block {block} is past the {self.num_blocks} blocks")
            ptrs.extend(base + block * stride for base, stride in self.planes)
        return ptrs


def _plane(name, tensor, num_blocks):
    """(base address, block stride in bytes, block bytes) of a layer."""
    shape, strides, esize = tuple(tensor.shape), tuple(tensor.stride()), tensor.element_size()
    if len(shape) < 2 or shape[0] != num_blocks:
        raise ValueError(f"layer {name}: a KV tensor of shape {shape} does not have the "
                         f"num_blocks={num_blocks} blocks first (vLLM 0.33's layouts)")
    nbytes = _dense_bytes(shape[1:], strides[1:], esize)
    if nbytes is None or strides[0] * esize < nbytes:
        raise ValueError(f"layer {name}: a block of shape {shape}, strides {strides} is not "
                         "one dense span of memory")
    return tensor.data_ptr(), strides[0] * esize, nbytes


def _regions(tensors):
    """The memory to register: each tensor's storage once, as (address,
    bytes), however many layers are views of it."""
    regions = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        regions[storage.data_ptr()] = storage.nbytes()
    return sorted(regions.items())
