"""Objects come back byte-exact, whatever their size, key or segmentation,
and per-key errors stay per key: over every transport of a local server."""
import gc
import mmap
import weakref
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support import engines
import gdrkv
from support.content import as_key_bytes, batch_get_bytes, batch_put_bytes, content
from support.softverbs import TRANSPORTS
from support.util import unique
from gdrkv import errors

pytestmark = pytest.mark.pool_file

SERVER_MEMORY = "256MiB"
BATCH_BYTES = 24 << 20          # well under the pool: nothing may be evicted
GUARD = 16                      # bytes between segments that no transfer may touch
GUARD_BYTE = 0xEE


@pytest.fixture(params=TRANSPORTS)
def client(server, make_client, request):
    """Every test of this module runs over tcp, shm and rdma (softverbs)."""
    return make_client(server.url, namespace=unique("ns"), transport=request.param)


def split(size, max_segments=8):
    """Segment lengths summing to size, cut at random points (empty
    segments included: they are legal and easy to get wrong)."""
    return st.lists(st.integers(0, size), max_size=max_segments - 1).map(
        lambda cuts: np.diff([0, *sorted(cuts), size]).tolist())


KEYS = st.one_of(
    st.binary(min_size=1, max_size=48),
    st.binary(min_size=1, max_size=4096),
    st.binary(min_size=4096, max_size=4096),
    st.text(min_size=1, max_size=64),
    st.text(min_size=1, max_size=1024),     # at most 4096 bytes as UTF-8
)


@dataclass
class Obj:
    key: object
    size: int
    put_segments: list
    get_segments: list
    as_int: bool                # pass one segment as a bare int, not a list


@st.composite
def batches(draw):
    objs, seen, budget = [], set(), BATCH_BYTES
    for _ in range(draw(st.integers(1, 64))):
        key = draw(KEYS)
        if as_key_bytes(key) in seen:
            continue
        seen.add(as_key_bytes(key))
        size = draw(st.one_of(st.integers(0, 4096), st.integers(0, min(budget, 3 << 20))))
        budget -= size
        objs.append(Obj(key, size, draw(split(size)), draw(split(size)), draw(st.booleans())))
    return objs


class Layout:
    """Every object's segments in one registered buffer, with guard bytes
    around each segment so a transfer that strays outside is caught."""

    def __init__(self, client, segment_lists):
        self.client = client
        self.offsets, off = [], GUARD
        for lengths in segment_lists:
            self.offsets.append([])
            for length in lengths:
                self.offsets[-1].append(off)
                off += length + GUARD
        self.segment_lists = segment_lists
        self.buf = np.full(off, GUARD_BYTE, np.uint8)
        self.base, _ = client.register(self.buf)

    def close(self):
        self.client.unregister(self.base)

    def args(self, objs):
        """ptrs and sizes for batch calls."""
        ptrs, sizes = [], []
        for obj, offs, lengths in zip(objs, self.offsets, self.segment_lists):
            seg_ptrs = [self.base + off for off in offs]
            if obj.as_int and len(lengths) == 1:
                ptrs.append(seg_ptrs[0])
                sizes.append(lengths[0])
            else:
                ptrs.append(seg_ptrs)
                sizes.append(list(lengths))
        return ptrs, sizes

    def write(self, i, data):
        pos = 0
        for off, length in zip(self.offsets[i], self.segment_lists[i]):
            self.buf[off:off + length] = np.frombuffer(data[pos:pos + length], np.uint8)
            pos += length

    def read(self, i):
        return b"".join(self.buf[off:off + length].tobytes()
                        for off, length in zip(self.offsets[i], self.segment_lists[i]))

    def guards_intact(self):
        mask = np.ones(len(self.buf), bool)
        for offs, lengths in zip(self.offsets, self.segment_lists):
            for off, length in zip(offs, lengths):
                mask[off:off + length] = False
        return bool((self.buf[mask] == GUARD_BYTE).all())


@settings(max_examples=100)
@given(batch=batches())
def test_random_batches_come_back_byte_exact(client, batch):
    keys = [o.key for o in batch]
    sizes = [o.size for o in batch]
    src = Layout(client, [o.put_segments for o in batch])
    dst = Layout(client, [o.get_segments for o in batch])
    try:
        for i, o in enumerate(batch):
            src.write(i, content(o.key, o.size))
        assert client.batch_put(keys, *src.args(batch)) == [0] * len(batch)
        assert client.batch_exists(keys) == [True] * len(batch)
        assert client.batch_sizes(keys) == sizes

        assert client.batch_get(keys, *dst.args(batch)) == sizes
        for i, o in enumerate(batch):
            assert dst.read(i) == content(o.key, o.size), f"object {i} ({o.size} bytes)"
        assert dst.guards_intact(), "a get wrote outside its destination segments"
        assert src.guards_intact(), "a put wrote into its source buffer"
    finally:
        src.close()
        dst.close()
        removed = client.clear()
    assert removed == len(batch)
    assert client.batch_exists(keys) == [False] * len(batch)


def test_key_length_limit_fails_only_that_key(client):
    longest, too_long = b"k" * 4096, b"k" * 4097
    keys = [longest, too_long, b"", "short"]
    values = [content(k, 1000) for k in keys]
    assert batch_put_bytes(client, keys, values) == [0, errors.E_INVALID, errors.E_INVALID, 0]
    results, got = batch_get_bytes(client, keys, [1000] * 4)
    assert results == [1000, errors.E_INVALID, errors.E_INVALID, 1000]
    assert got[0] == values[0] and got[3] == values[3]
    assert client.batch_exists(keys) == [True, False, False, True]
    assert client.batch_sizes(keys)[1:3] == [errors.E_INVALID] * 2
    assert client.batch_delete(keys) == [0, errors.E_INVALID, errors.E_INVALID, 0]


def test_str_key_is_its_utf8_bytes(client):
    value = content("ключ-🔑", 5000)
    assert batch_put_bytes(client, ["ключ-🔑"], [value]) == [0]
    results, got = batch_get_bytes(client, ["ключ-🔑".encode()], [5000])
    assert results == [5000] and got == [value]


def test_too_small_destination_fails_only_that_key(client):
    keys = ["small-dst", "fits", "bigger-dst"]
    values = [content(k, 100_000) for k in keys]
    assert batch_put_bytes(client, keys, values) == [0, 0, 0]
    dest = np.full(100_000 + 100_000 + 150_000, 0x5A, np.uint8)
    base, _ = client.register(dest)
    try:
        ptrs = [base, base + 100_000, base + 200_000]
        results = client.batch_get(keys, ptrs, [99_999, 100_000, 150_000])
        assert results == [errors.E_TOO_SMALL, 100_000, 100_000]
        assert dest[100_000:200_000].tobytes() == values[1]
        assert dest[200_000:300_000].tobytes() == values[2]
        assert (dest[300_000:] == 0x5A).all(), "a get wrote past the object's size"
        # Several segments that together are one byte short.
        split_ptrs = [[base, base + 60_000]]
        assert client.batch_get(keys[:1], split_ptrs, [[60_000, 39_999]]) == [errors.E_TOO_SMALL]
    finally:
        client.unregister(base)


def test_missing_keys_fail_alone(client):
    present = [f"present-{i}" for i in range(5)]
    values = [content(k, 3000 * (i + 1)) for i, k in enumerate(present)]
    assert batch_put_bytes(client, present, values) == [0] * 5
    keys = [present[0], "missing-a", present[1], present[2], "missing-b", present[3], present[4]]
    caps = [20_000] * len(keys)
    results, got = batch_get_bytes(client, keys, caps)
    assert results == [3000, errors.E_NOT_FOUND, 6000, 9000, errors.E_NOT_FOUND, 12000, 15000]
    assert [g for g in got if g is not None] == values
    assert client.batch_exists(keys) == [True, False, True, True, False, True, True]


def test_namespaces_isolate(server, make_client):
    a = make_client(server.url, namespace=unique("ns-a"))
    b = make_client(server.url, namespace=unique("ns-b"))
    keys = [f"shared-{i}" for i in range(10)]
    assert batch_put_bytes(a, keys, [b"A" * 1000] * 10) == [0] * 10
    assert b.batch_exists(keys) == [False] * 10
    assert batch_put_bytes(b, keys, [b"B" * 2000] * 10) == [0] * 10
    assert batch_get_bytes(a, keys, [4000] * 10) == ([1000] * 10, [b"A" * 1000] * 10)
    assert batch_get_bytes(b, keys, [4000] * 10) == ([2000] * 10, [b"B" * 2000] * 10)

    assert a.clear() == 10
    assert a.batch_exists(keys) == [False] * 10
    assert batch_get_bytes(b, keys, [4000] * 10) == ([2000] * 10, [b"B" * 2000] * 10)


def test_exists_sizes_delete(client):
    keys = ["e0", "e1", "e2"]
    values = [b"", content("e1", 1), content("e2", 3 << 20)]
    assert batch_put_bytes(client, keys, values) == [0, 0, 0]
    assert client.batch_exists(keys + ["nope"]) == [True, True, True, False]
    assert client.batch_sizes(keys + ["nope"]) == [0, 1, 3 << 20, errors.E_NOT_FOUND]
    assert client.batch_delete(["e1", "nope"]) == [0, errors.E_NOT_FOUND]
    assert client.batch_exists(keys) == [True, False, True]
    assert batch_get_bytes(client, keys, [10, 10, 3 << 20]) == (
        [0, errors.E_NOT_FOUND, 3 << 20], [b"", None, values[2]])
    assert client.batch_delete(["e1"]) == [errors.E_NOT_FOUND]


def test_put_get_convenience(client):
    client.put("conv", b"hello")
    assert client.get("conv") == b"hello"
    client.put(b"conv-empty", b"")
    assert client.get("conv-empty") == b""
    client.put("conv-bytearray", bytearray(content("x", 70_000)))
    assert client.get("conv-bytearray") == content("x", 70_000)
    client.put("conv-memoryview", memoryview(content("y", 3 << 20))[1:])
    assert client.get("conv-memoryview") == content("y", 3 << 20)[1:]
    assert client.get("conv-missing") is None
    with pytest.raises(gdrkv.GdrkvError) as exc:
        client.put(b"k" * 4097, b"v")
    assert exc.value.code == errors.E_INVALID


def test_segment_count_limit(client):
    ok = np.frombuffer(content("segs", 1024), np.uint8).copy()
    base, _ = client.register(ok)
    try:
        one_byte_segments = [base + i for i in range(1024)]
        results = client.batch_put(["segs-1024", "segs-1025"],
                                   [one_byte_segments, one_byte_segments + [base]],
                                   [[1] * 1024, [1] * 1025])
        assert results[0] == 0
        assert results[1] == errors.E_INVALID
    finally:
        client.unregister(base)
    assert client.get("segs-1024") == ok.tobytes()
    assert client.batch_exists(["segs-1025"]) == [False]


def _roundtrip_through(client, obj, nbytes, key):
    """Puts content(key) from obj's memory and reads it back into obj."""
    ptr, length = client.register(obj, nbytes) if isinstance(obj, int) else client.register(obj)
    assert length == nbytes
    try:
        src = content(key, nbytes)
        client.put(key + "-src", src)
        assert client.batch_get([key + "-src"], [ptr], [nbytes]) == [nbytes]
        assert client.batch_put([key], [ptr], [nbytes]) == [0]
    finally:
        client.unregister(obj)
    assert client.get(key) == src


def test_register_buffer_kinds(client):
    n = 50_000
    _roundtrip_through(client, bytearray(n), n, "reg-bytearray")
    _roundtrip_through(client, memoryview(bytearray(n + 10))[10:], n, "reg-memoryview")
    _roundtrip_through(client, np.zeros(n // 4, np.float32), n, "reg-numpy")
    with mmap.mmap(-1, n) as m:
        _roundtrip_through(client, m, n, "reg-mmap")
    raw = np.zeros(n, np.uint8)
    _roundtrip_through(client, raw.ctypes.data, n, "reg-int-pointer")


def test_register_keeps_object_alive(client):
    arr = np.zeros(4096, np.uint8)
    alive = weakref.ref(arr)
    ptr, _ = client.register(arr)
    del arr
    gc.collect()
    assert alive() is not None, "a registered buffer was freed while registered"
    client.unregister(ptr)
    gc.collect()
    assert alive() is None, "unregister() did not drop its reference"


def test_register_rejects_bad_arguments(client):
    with pytest.raises(ValueError):
        client.register(np.zeros(16, np.uint8).ctypes.data)      # int pointer needs nbytes
    with pytest.raises(ValueError):
        client.register(np.zeros(16, np.uint8).ctypes.data, -1)
    with pytest.raises((ValueError, TypeError)):
        client.register(object())


def test_register_cpu_tensor(client):
    torch = engines.require("torch")
    _roundtrip_through(client, torch.zeros(1000, dtype=torch.float64), 8000, "reg-torch")


def test_unmapped_segment_fails_its_frame_but_not_the_server(server, make_client):
    """A segment at an address the process cannot read is the caller's bug:
    the kernel refuses the transfer (EFAULT), the keys of that frame get
    E_INVALID, and the server is not put in backoff for everyone else."""
    client = make_client(server.url, namespace=unique("efault"), transport="tcp")
    unmapped = 4096          # the zero page is never mapped
    assert client.batch_put(["bad"], [unmapped], [4096]) == [errors.E_INVALID]
    assert batch_put_bytes(client, ["good"], [b"x" * 4096]) == [0]
    counters = client.stats()["client"]
    assert counters["servers_down"] == 0 and counters["shortcircuit_keys"] == 0
