"""GPU memory as a source and destination of batch calls, over shm and tcp:
byte-exact round trips host->GPU, GPU->host and GPU->GPU for 4 KiB..4 MiB
pages at scattered places, mixed host/GPU batches, the kernel copy racing
eviction (the lease must hold), and GPU memory gdrkv must refuse. Skipped
only where no GPU is present; everything else fails loudly (a GPU machine
without torch included)."""
import random
import threading
import time

import numpy as np
import pytest

import gdrkv
from gdrkv import gpu
from gdrkv.errors import E_INVALID, E_NOT_FOUND
from support.content import batch_put_bytes, content
from support.gpu import GPU_OK, GPU_WHY, TRANSPORTS
from support.softverbs import SOFTVERBS
from support.util import background, stat, unique, wait_for

pytestmark = pytest.mark.skipif(not GPU_OK, reason=f"no GPU present: {GPU_WHY}")

SERVER_MEMORY = "768MiB"
PAGE_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
BATCH_BYTES = 32 << 20


def count_for(size):
    return max(2, min(64, BATCH_BYTES // size))


def scattered(base, size, count, seed=0):
    """count page addresses inside a buffer of 2 * count pages, shuffled and
    with gaps, so neighbours in the batch are never neighbours in memory."""
    slots = list(range(2 * count))
    random.Random(seed).shuffle(slots)
    return [base + s * size for s in slots[:count]]


def gpu_buffer(torch, nbytes, fill=0):
    return torch.full((nbytes,), fill, dtype=torch.uint8, device="cuda")


def read_gpu(torch, tensor, ptrs, size):
    host = tensor.cpu().numpy()
    base = tensor.data_ptr()
    return [host[p - base:p - base + size].tobytes() for p in ptrs]


def write_gpu(torch, tensor, ptrs, values):
    host = tensor.cpu().numpy()
    base = tensor.data_ptr()
    for p, v in zip(ptrs, values):
        host[p - base:p - base + len(v)] = np.frombuffer(v, np.uint8)
    tensor.copy_(torch.from_numpy(host))


def gpu_values(torch, prefix, size, count, seed):
    """count keys and their values of size bytes, the values written into
    scattered pages of a GPU buffer: (keys, values, buffer, page pointers)."""
    keys = [f"{prefix}-{i}" for i in range(count)]
    values = [content(k, size) for k in keys]
    src = gpu_buffer(torch, 2 * count * size)
    ptrs = scattered(src.data_ptr(), size, count, seed=seed)
    write_gpu(torch, src, ptrs, values)
    return keys, values, src, ptrs


def client_for(make_client, server, transport, **options):
    """A client whose first connection is open and proven to be of the
    transport asked for: shm maps the pool, tcp and rdma never do."""
    client = make_client(server.url, namespace=unique("gpu"), transport=transport, **options)
    assert client.batch_exists(["no-such-key"]) == [False]
    shm_connects = stat(client.stats()["client"], "shm_connects")
    assert (shm_connects > 0) == (transport == "shm"), (transport, shm_connects)
    return client


def check_rdma_moved_gpu_memory(client, transport):
    """Over rdma, the GPU memory went by dma-buf MRs and RDMA, never staged."""
    if transport != "rdma":
        return
    stats = client.stats()["client"]
    assert stat(stats, "rdma_gpu_mrs") >= 1
    assert stat(stats, "rdma_gpu_mrs_dmabuf") == stat(stats, "rdma_gpu_mrs")
    assert stat(stats, "rdma_fallback_frames") == 0
    assert stat(stats, "rdma_read_frames") + stat(stats, "rdma_write_frames") >= 1
    assert stat(stats, "gpu_kernel_launches") == 0


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("size", PAGE_SIZES, ids=lambda s: f"{s >> 10}KiB")
def test_host_to_gpu(torch, server, make_client, transport, size):
    client = client_for(make_client, server, transport)
    count = count_for(size)
    keys = [f"h2g-{size}-{i}" for i in range(count)]
    values = [content(k, size) for k in keys]
    assert batch_put_bytes(client, keys, values) == [0] * count
    dest = gpu_buffer(torch, 2 * count * size, fill=0xEE)
    client.register(dest)
    ptrs = scattered(dest.data_ptr(), size, count, seed=size)
    assert client.batch_get(keys, ptrs, [size] * count) == [size] * count
    torch.cuda.synchronize()
    assert read_gpu(torch, dest, ptrs, size) == values
    stats = client.stats()["client"]
    check_rdma_moved_gpu_memory(client, transport)
    if transport != "rdma":
        assert stats["gpu_bytes"] >= count * size
    if transport == "shm":
        assert stats["shm_bytes_copied"] >= count * size


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("size", PAGE_SIZES, ids=lambda s: f"{s >> 10}KiB")
def test_gpu_to_host_and_gpu_to_gpu(torch, server, make_client, transport, size):
    client = client_for(make_client, server, transport)
    count = count_for(size)
    keys, values, src, src_ptrs = gpu_values(torch, f"g2x-{unique()}", size, count, seed=1)
    client.register(src)
    assert client.batch_put(keys, src_ptrs, [size] * count) == [0] * count

    host = np.zeros(count * size, np.uint8)
    base, _ = client.register(host)
    assert client.batch_get(keys, [base + i * size for i in range(count)],
                            [size] * count) == [size] * count
    assert [host[i * size:(i + 1) * size].tobytes() for i in range(count)] == values

    dest = gpu_buffer(torch, 2 * count * size, fill=0x11)
    client.register(dest)
    ptrs = scattered(dest.data_ptr(), size, count, seed=2)
    assert client.batch_get(keys, ptrs, [size] * count) == [size] * count
    assert read_gpu(torch, dest, ptrs, size) == values
    check_rdma_moved_gpu_memory(client, transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_gpu_gets_count_hits_and_misses(torch, server, make_client, transport):
    """A batch_get into GPU memory of 6 keys, 2 missing: 4 hits and 2
    misses on the server (its GET or LEASE lookups) and in the client; the
    missing keys' pages are left as they were. (Host destinations:
    tests/client/test_read_counters.py.)"""
    client = client_for(make_client, server, transport)
    size = 64 << 10
    keys = [f"counted-{unique()}-{i}" for i in range(4)]
    values = [content(k, size) for k in keys]
    assert batch_put_bytes(client, keys, values) == [0] * 4
    asked = [keys[0], "missing-a", *keys[1:3], "missing-b", keys[3]]
    dest = gpu_buffer(torch, 2 * len(asked) * size, fill=0x5A)
    client.register(dest)
    ptrs = scattered(dest.data_ptr(), size, len(asked), seed=3)
    before_s, before_c = server.stats(), client.stats()["client"]
    results = client.batch_get(asked, ptrs, [size] * len(asked))
    after_s, after_c = server.stats(), client.stats()["client"]
    assert results == [size, E_NOT_FOUND, size, size, E_NOT_FOUND, size]
    got = read_gpu(torch, dest, ptrs, size)
    assert [got[i] for i in (0, 2, 3, 5)] == values
    assert got[1] == got[4] == b"\x5a" * size
    for name, want in (("hits", 4), ("misses", 2)):
        assert stat(after_s, name) - stat(before_s, name) == want, name
        assert stat(after_c, name) - stat(before_c, name) == want, name


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mixed_host_and_gpu_batch(torch, server, make_client, transport):
    """Host and GPU destinations in one batch, and objects split between a
    host segment and a GPU segment; odd sizes and offsets (unaligned)."""
    client = client_for(make_client, server, transport)
    sizes = [4096, 12345, 65536 + 7, 1 << 20, 3, 300001] * 4
    keys = [f"mixed-{unique()}-{i}" for i in range(len(sizes))]
    values = [content(k, s) for k, s in zip(keys, sizes)]
    assert batch_put_bytes(client, keys, values) == [0] * len(keys)

    total = sum(sizes) + 64 * len(sizes)
    dev = gpu_buffer(torch, total)
    host = np.zeros(total, np.uint8)
    client.register(dev)
    hbase, _ = client.register(host)
    ptrs, lens, where, off = [], [], [], 1      # odd offset: nothing 16-byte aligned
    for i, s in enumerate(sizes):
        kind = i % 3
        if kind == 0:
            ptrs.append(hbase + off), lens.append(s), where.append([("h", off, s)])
        elif kind == 1:
            ptrs.append(dev.data_ptr() + off), lens.append(s), where.append([("g", off, s)])
        else:
            half = s // 2
            ptrs.append([hbase + off, dev.data_ptr() + off + half])
            lens.append([half, s - half])
            where.append([("h", off, half), ("g", off + half, s - half)])
        off += s + 33
    assert client.batch_get(keys, ptrs, lens) == sizes
    dev_host = dev.cpu().numpy()
    for value, parts in zip(values, where):
        got = b"".join((host if kind == "h" else dev_host)[o:o + n].tobytes()
                       for kind, o, n in parts)
        assert got == value


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_segments_without_bytes_and_two_gpu_ranges(torch, server, make_client, transport):
    """A call whose segments all lie in one registered GPU range is
    classified as a whole (client_gpu.c): segments without bytes anywhere
    (NULL, host memory) change nothing to its PUT or GET. A GET over two
    registered ranges is classified segment by segment. Byte-exact."""
    client = client_for(make_client, server, transport)
    size, count = 4096 + 5, 16
    one, two = gpu_buffer(torch, 2 * count * size), gpu_buffer(torch, 2 * count * size)
    host = np.zeros(64, np.uint8)
    client.register(one), client.register(two)
    hbase, _ = client.register(host)
    keys = [f"uniform-{unique()}-{i}" for i in range(count)]
    values = [content(k, size) for k in keys]
    src = scattered(one.data_ptr(), size, count, seed=1)
    write_gpu(torch, one, src, values)
    # PUT from one range: each key's bytes as three segments with empty ones between.
    ptrs = [[0, p, hbase, p + 100, hbase + 8] for p in src]
    lens = [[0, 100, 0, size - 100, 0]] * count
    assert client.batch_put(keys, ptrs, lens) == [0] * count
    one.zero_()
    assert client.batch_get(keys, ptrs, lens) == [size] * count
    assert read_gpu(torch, one, src, size) == values
    # GET across both ranges: even keys into one, odd ones into two.
    one.zero_()
    dst = [(one if i % 2 == 0 else two).data_ptr() + (2 * i + 1) * size for i in range(count)]
    assert client.batch_get(keys, dst, [size] * count) == [size] * count
    got = [read_gpu(torch, one if i % 2 == 0 else two, [p], size)[0] for i, p in enumerate(dst)]
    assert got == values


def test_a_segment_past_the_registered_part_fails_alone(torch, server, make_client):
    """Only the first half of an allocation is registered: a call whose
    segments lie there but for one key's, in the unregistered half, is not
    one range (client_gpu.c, in_one_range): that key fails with E_INVALID,
    in both directions, and the others' bytes are exact."""
    client = client_for(make_client, server, "shm")
    size, count = 4096, 16
    dev = gpu_buffer(torch, 4 * count * size)
    client.register(dev.data_ptr(), 2 * count * size)
    keys = [f"part-{unique()}-{i}" for i in range(count)]
    values = [content(k, size) for k in keys]
    inside = scattered(dev.data_ptr(), size, count, seed=3)
    write_gpu(torch, dev, inside, values)
    outside = dev.data_ptr() + 3 * count * size
    ptrs = inside[:5] + [outside] + inside[6:]
    expected = [0] * count
    expected[5] = E_INVALID
    assert client.batch_put(keys, ptrs, [size] * count) == expected
    dev.zero_()
    expected = [size] * count
    expected[5] = E_INVALID
    assert client.batch_get(keys, ptrs, [size] * count) == expected
    assert read_gpu(torch, dev, inside[:5] + inside[6:], size) == values[:5] + values[6:]


@pytest.mark.parametrize("server_mode", ["staged", "single-tenant"])
@pytest.mark.parametrize("size", [4 << 10, 64 << 10, 1 << 20, 6 << 20],
                         ids=lambda s: f"{s >> 10}KiB")
def test_gpu_put_over_shm_never_crosses_the_socket(torch, server_factory, make_client,
                                                   server_mode, size):
    """GPU values of a shm PUT go by one launch per frame into the
    connection's staging (the server copies them into the pool), or on a
    single-tenant server straight into the reserved chunks; objects split
    between a host and a GPU segment too. Byte-exact, and no value byte
    on the socket."""
    single = server_mode == "single-tenant"
    srv = server_factory(memory="768MiB", args=["--single-tenant"] if single else [])
    client = make_client(srv.url, namespace=unique("gput"), transport="shm")
    count = count_for(size)
    keys, values, src, src_ptrs = gpu_values(torch, "gput", size, count, seed=5)
    host = np.frombuffer(b"".join(values), np.uint8).copy()
    client.register(src)
    hbase, _ = client.register(host)
    # Every third object: its first half from host memory, the rest from the GPU.
    ptrs, lens = [], []
    for i, p in enumerate(src_ptrs):
        if i % 3 == 2:
            half = size // 2
            ptrs.append([hbase + i * size, p + half])
            lens.append([half, size - half])
        else:
            ptrs.append(p)
            lens.append(size)
    before = client.stats()["client"]
    assert client.batch_put(keys, ptrs, lens) == [0] * count
    after = client.stats()["client"]
    assert after["gpu_kernel_launches"] + after["gpu_copy_engine_calls"] > \
        before["gpu_kernel_launches"] + before["gpu_copy_engine_calls"]
    out = np.zeros(count * size, np.uint8)
    obase, _ = client.register(out)
    assert client.batch_get(keys, [obase + i * size for i in range(count)],
                            [size] * count) == [size] * count
    assert [out[i * size:(i + 1) * size].tobytes() for i in range(count)] == values
    stats = srv.stats()
    assert stat(stats, "bytes_in") == 0
    moved = stat(stats, "shm_reserved_bytes" if single else "shm_staged_bytes")
    assert moved == count * size


def slices_settled(client, timeout_s=30.0):
    """Waits until the registration thread has registered (or refused)
    every slice of the pool a GPU copy asked for: the precondition of a
    test about the launches of a warm client, not the behaviour it tests
    (a fresh client's first GET is test_first_gpu_get_registers_nothing's).
    Returns the client's counters."""
    deadline = time.monotonic() + timeout_s
    while True:
        c = client.stats()["client"]
        done = c["gpu_slices_registered"] + c["gpu_slices_failed"] + c["gpu_slices_over_limit"]
        if done >= c["gpu_slice_demands"] or time.monotonic() > deadline:
            return c
        time.sleep(0.005)


def get_pages_into_gpu(torch, client, prefix, seed, size=4096, count=256, warm=True):
    """Stores count pages, reads them back in one batch into scattered GPU
    pages and checks every byte: the client's counters the GET moved
    (gpu_kernel_launches, gpu_copy_engine_calls). warm: the pool's slices
    the pages lie in are registered first (a GET, then slices_settled)."""
    keys = [f"{prefix}-{i}" for i in range(count)]
    values = [content(k, size) for k in keys]
    assert batch_put_bytes(client, keys, values) == [0] * count
    dest = gpu_buffer(torch, 2 * count * size)
    client.register(dest)
    ptrs = scattered(dest.data_ptr(), size, count, seed=seed)
    if warm:
        assert client.batch_get(keys, ptrs, [size] * count) == [size] * count
        slices_settled(client)
    dest.zero_()
    torch.cuda.synchronize()
    before = client.stats()["client"]
    assert client.batch_get(keys, ptrs, [size] * count) == [size] * count
    after = client.stats()["client"]
    assert read_gpu(torch, dest, ptrs, size) == values
    return {k: after[k] - before[k] for k in ("gpu_kernel_launches", "gpu_copy_engine_calls",
                                              "gpu_slice_demands")}


def test_first_gpu_get_registers_nothing(torch, server, make_client):
    """A fresh client's first GET into GPU memory pays for no registration
    of the pool (docs/gpu.md, "What each process pins"): the slice it
    needs is asked of the registration thread and this frame goes by the
    copy engines; once the slice is registered, the same GET is one kernel
    launch. Both byte-exact, and what is pinned is the slices asked for,
    not the pool."""
    client = client_for(make_client, server, "shm", gpu_copy="kernel", conns=1)
    first = get_pages_into_gpu(torch, client, "first", seed=11, warm=False)
    assert first["gpu_slice_demands"] >= 1
    assert first["gpu_kernel_launches"] == 0 and first["gpu_copy_engine_calls"] >= 1
    settled = slices_settled(client)
    assert settled["gpu_slices_registered"] == settled["gpu_slice_demands"]
    assert 0 < settled["gpu_pinned_bytes"] <= settled["gpu_slice_demands"] * (64 << 20)
    again = get_pages_into_gpu(torch, client, "first", seed=11, warm=False)
    assert again == {"gpu_kernel_launches": 1, "gpu_copy_engine_calls": 0,
                     "gpu_slice_demands": 0}


def test_the_server_shows_what_client_processes_pin(torch, server_factory, make_client):
    """`gdrkv stat`'s client pins (PINS, docs/gpu.md): once a client's
    slices are registered, its next call tells the server, whose figures
    are then the client's own; they go when the client does."""
    srv = server_factory(memory="1GiB")
    client = client_for(make_client, srv, "shm", gpu_copy="kernel", conns=1)
    get_pages_into_gpu(torch, client, "told", seed=5, warm=False)
    pinned = slices_settled(client)["gpu_pinned_bytes"]
    assert pinned > 0
    assert client.batch_exists(["told-0"]) == [True]      # the call that carries the report
    s = srv.stats()
    assert (stat(s, "client_pinned_bytes"), stat(s, "client_pinned_max_process_bytes"),
            stat(s, "client_pinning_processes")) == (pinned, pinned, 1)
    client.close()
    wait_for(lambda: stat(srv.stats(), "client_pinning_processes") == 0, 10,
             "the report to go with the client's connections")


def test_gpu_pin_limit_bounds_what_is_pinned(torch, server, make_client):
    """gpu_pin_limit below one slice: nothing of the pool is ever pinned,
    and every GET into GPU memory still lands byte-exact, by the copy
    engines."""
    client = client_for(make_client, server, "shm", gpu_copy="kernel", conns=1,
                        gpu_pin_limit=1 << 20)
    for _ in range(2):
        moved = get_pages_into_gpu(torch, client, "limited", seed=12)
        assert moved["gpu_kernel_launches"] == 0 and moved["gpu_copy_engine_calls"] >= 1
    c = slices_settled(client)
    assert c["gpu_pinned_bytes"] == 0 and c["gpu_slices_registered"] == 0
    assert c["gpu_slices_over_limit"] >= 1


def test_the_pin_limit_evicts_the_least_recently_used_slices(torch, server_factory,
                                                              make_client):
    """gpu_pin_limit of two slices, GETs over seven slices' worth of
    objects, three rounds: each lands byte-exact, whether its slices were
    registered, waiting, or being evicted meanwhile, and what stays pinned
    is within the limit (docs/gpu.md, "What each process pins")."""
    srv = server_factory(memory="1GiB")
    limit, size, batch = 128 << 20, 1 << 20, 32
    client = client_for(make_client, srv, "shm", gpu_pin_limit=limit, conns=2,
                        gpu_copy="kernel")
    keys = [f"evict-{i}" for i in range(448)]
    values = [content(k, size) for k in keys]
    for first in range(0, len(keys), batch):
        chunk = slice(first, first + batch)
        assert batch_put_bytes(client, keys[chunk], values[chunk]) == [0] * batch
    dest = gpu_buffer(torch, 2 * batch * size)
    client.register(dest)
    for round_ in range(3):
        for first in range(0, len(keys), batch):
            ptrs = scattered(dest.data_ptr(), size, batch, seed=first + round_)
            chunk = slice(first, first + batch)
            assert client.batch_get(keys[chunk], ptrs, [size] * batch) == [size] * batch
            assert read_gpu(torch, dest, ptrs, size) == values[chunk]
        slices_settled(client)
    c = client.stats()["client"]
    assert c["gpu_slices_evicted"] > 0, c
    assert 0 < c["gpu_pinned_bytes"] <= limit, c
    # Frames whose slices were held went by the kernel, at their device addresses.
    assert c["gpu_kernel_launches"] > 0, c


@pytest.mark.parametrize("mode", ["kernel", "copy_engine", "auto"])
def test_gpu_copy_modes_and_one_launch_per_frame(torch, server, make_client, mode):
    # One connection: the batch is one frame (more would stripe it).
    client = client_for(make_client, server, "shm", gpu_copy=mode, conns=1)
    moved = get_pages_into_gpu(torch, client, "modes", seed=3)
    launches, engine_calls = moved["gpu_kernel_launches"], moved["gpu_copy_engine_calls"]
    if mode == "copy_engine":
        assert launches == 0 and engine_calls >= 1
    else:       # auto picks the kernel for 4 KiB pages; 1 MiB of them is one frame
        assert launches == 1 and engine_calls == 0


def test_striped_gpu_get_starts_with_a_small_frame(torch, server, make_client):
    """A GET striped over 4 connections sends its first stripe's first
    eighth as a frame of its own (its copy starts while the other stripes
    are still looked up): 4 stripes of 64 pages, the first cut 8 + 56, so
    5 frames and 5 launches, and every page lands where it belongs."""
    client = client_for(make_client, server, "shm", gpu_copy="kernel", conns=4)
    assert get_pages_into_gpu(torch, client, "striped", seed=5)["gpu_kernel_launches"] == 5


def test_gpu_copy_alone(torch):
    """gdrkv.gpu.copy: scattered pinned host <-> GPU pieces, every mode."""
    size, count = 4096 + 512, 64
    host = torch.arange(count * size, dtype=torch.int32).to(torch.uint8).pin_memory()
    for mode in gpu.COPY_MODES:
        dev = gpu_buffer(torch, 2 * count * size)
        dp = scattered(dev.data_ptr(), size, count, seed=4)
        hp = [host.data_ptr() + i * size for i in range(count)]
        gpu.copy(0, gpu.Pieces(dp, hp, [size] * count), mode)
        back = torch.zeros_like(host).pin_memory()     # the GPU writes it: pinned
        gpu.copy(0, gpu.Pieces([back.data_ptr() + i * size for i in range(count)], dp,
                               [size] * count), mode)
        assert torch.equal(back, host), mode


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_stream_orders_put_after_engine_work(torch, server, make_client, transport):
    """PUT with the engine's stream reads what a kernel queued on that
    stream wrote, without the caller synchronising; GET with a stream."""
    client = client_for(make_client, server, transport)
    size, count = 64 << 10, 32
    src = gpu_buffer(torch, count * size)
    client.register(src)
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)           # the fill below waits behind this
        src.fill_(0x5A)
    keys = [f"stream-{unique()}-{i}" for i in range(count)]
    ptrs = [src.data_ptr() + i * size for i in range(count)]
    assert client.batch_put(keys, ptrs, [size] * count, stream=stream) == [0] * count
    dest = gpu_buffer(torch, count * size)
    client.register(dest)
    assert client.batch_get(keys, [dest.data_ptr() + i * size for i in range(count)],
                            [size] * count, stream=stream.cuda_stream) == [size] * count
    assert bool((dest == 0x5A).all())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_get_waits_for_work_queued_on_the_default_stream(torch, server, make_client, transport):
    """A GET without a stream lands after the kernels queued before the call
    on the legacy default stream: a slow kernel that fills the destination
    must not overwrite what the GET wrote."""
    client = client_for(make_client, server, transport)
    size, count = 64 << 10, 16
    keys = [f"order-{unique()}-{i}" for i in range(count)]
    values = [content(k, size) for k in keys]
    assert batch_put_bytes(client, keys, values) == [0] * count
    dest = gpu_buffer(torch, count * size)
    client.register(dest)
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)               # on the default stream, before the fill
    dest.fill_(0x33)
    ptrs = [dest.data_ptr() + i * size for i in range(count)]
    assert client.batch_get(keys, ptrs, [size] * count) == [size] * count
    torch.cuda.synchronize()
    assert read_gpu(torch, dest, ptrs, size) == values


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_put_without_a_stream_waits_for_the_default_stream(torch, server, make_client,
                                                           transport):
    """A PUT without a stream launches on the client's PUT stream, which
    blocks on the legacy default stream: it reads what a slow kernel queued
    there before the call wrote, without the caller synchronising."""
    client = client_for(make_client, server, transport)
    size, count = 64 << 10, 16
    src = gpu_buffer(torch, count * size)
    client.register(src)
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)               # on the default stream, before the fill
    src.fill_(0x6B)
    keys = [f"put-order-{unique()}-{i}" for i in range(count)]
    ptrs = [src.data_ptr() + i * size for i in range(count)]
    assert client.batch_put(keys, ptrs, [size] * count) == [0] * count
    assert [client.get(k) for k in keys] == [b"\x6b" * size] * count


def test_gpu_puts_from_threads_share_the_put_streams(torch, server, make_client):
    """Threads PUT from GPU memory through one client at once: their frames
    launch on the client's one PUT stream per device, which the first of
    them creates; every object byte-exact, on every path the threads take."""
    client = client_for(make_client, server, "shm", gpu_copy="kernel", conns=4)
    size, count, nthreads = 64 << 10, 32, 4
    work = [gpu_values(torch, f"threads-{unique()}-{t}", size, count, seed=t)
            for t in range(nthreads)]
    for _, _, src, _ in work:
        client.register(src)
    torch.cuda.synchronize()
    results = [None] * nthreads
    start = threading.Barrier(nthreads)

    def put(t):
        keys, _, _, ptrs = work[t]
        start.wait()
        results[t] = client.batch_put(keys, ptrs, [size] * count)

    threads = [threading.Thread(target=put, args=(t,)) for t in range(nthreads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert results == [[0] * count] * nthreads
    for keys, values, _, _ in work:
        assert [client.get(k) for k in keys] == values


# ---------------------------------------------------------------- leases

def test_kernel_copy_racing_eviction_keeps_leases(torch, server_factory, make_client):
    """GETs into GPU memory while another client floods a small pool: every
    read is the exact object or a miss, never bytes of an evicted object's
    successor (the lease holds until the kernel finished)."""
    srv = server_factory(memory="64MiB")
    reader = make_client(srv.url, namespace="race", transport="shm", gpu_copy="kernel")
    writer = make_client(srv.url, namespace="race", transport="shm")
    size, count = 256 << 10, 32
    dest = gpu_buffer(torch, count * size)
    reader.register(dest)
    ptrs = [dest.data_ptr() + i * size for i in range(count)]
    stop = threading.Event()
    errors = []

    def flood():
        n = 0
        while not stop.is_set():
            keys = [f"flood-{n}-{i}" for i in range(8)]
            assert batch_put_bytes(writer, keys, [content(k, 1 << 20) for k in keys]) == [0] * 8
            n += 1

    keys = [f"race-{i}" for i in range(count)]
    assert batch_put_bytes(writer, keys, [content(k, size) for k in keys]) == [0] * count
    hits = 0
    with background(flood, timeout=60):
        for _ in range(40):
            results = reader.batch_get(keys, ptrs, [size] * count)
            got = read_gpu(torch, dest, ptrs, size)
            for key, r, value in zip(keys, results, got):
                if r == E_NOT_FOUND:
                    continue
                if r != size or value != content(key, size):
                    errors.append((key, r))
                hits += r == size
            batch_put_bytes(writer, keys, [content(k, size) for k in keys])
        stop.set()
    assert not errors, f"wrong reads under eviction: {errors[:5]}"
    assert hits > 0
    assert stat(srv.stats(), "evictions") > 0


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unregistered_gpu_memory_is_refused(torch, server, make_client, transport):
    client = client_for(make_client, server, transport)
    client.put("present", b"x" * 4096)
    dest = gpu_buffer(torch, 8192)
    results = client.batch_get(["present", "present"], [dest.data_ptr(), dest.data_ptr() + 4096],
                               [4096, 4096])
    assert results == [E_INVALID, E_INVALID]
    assert client.batch_put(["new"], [dest.data_ptr()], [4096]) == [E_INVALID]
    # The client is fine afterwards, and a registered range that the
    # segment runs out of is refused too.
    client.register(dest)
    assert client.batch_get(["present"], [dest.data_ptr() + 6000], [4096]) == [E_INVALID]
    assert client.batch_get(["present"], [dest.data_ptr()], [4096]) == [4096]
    assert client.get("present") == b"x" * 4096


def test_freed_gpu_memory_is_refused(torch, server, make_client):
    client = client_for(make_client, server, "shm")
    client.put("present", b"y" * 4096)
    nbytes = 64 << 20               # its own cudaMalloc segment, freed below
    dest = gpu_buffer(torch, nbytes)
    ptr, _ = client.register(int(dest.data_ptr()), nbytes)
    del dest
    torch.cuda.empty_cache()        # the segment goes back to the driver
    assert client.batch_get(["present"], [ptr], [4096]) == [E_INVALID]
    assert client.batch_put(["other"], [ptr], [4096]) == [E_INVALID]
    client.unregister(ptr)
    assert client.get("present") == b"y" * 4096


def test_register_refuses_a_range_past_its_allocation(torch, server, make_client):
    client = client_for(make_client, server, "shm")
    small = gpu_buffer(torch, 4096)
    torch.cuda.synchronize()
    with pytest.raises(gdrkv.GdrkvError):
        client.register(small.data_ptr(), 512 << 20)


@pytest.mark.skipif(not SOFTVERBS, reason="built without softverbs")
def test_rdma_flush_read_of_gpu_memory(torch, server, make_client, monkeypatch):
    """The pre-Hopper flush READ, forced on this GPU: one loopback READ of
    the GPU destination after each GET, and the bytes are right."""
    monkeypatch.setenv("GDRKV_IB_FLUSH", "always")
    client = client_for(make_client, server, "rdma")
    keys = [f"flush-{unique()}-{i}" for i in range(16)]
    values = [content(k, 65536) for k in keys]
    assert batch_put_bytes(client, keys, values) == [0] * 16
    dest = gpu_buffer(torch, 2 * 16 * 65536)
    client.register(dest)
    ptrs = scattered(dest.data_ptr(), 65536, 16, seed=3)
    assert client.batch_get(keys, ptrs, [65536] * 16) == [65536] * 16
    assert read_gpu(torch, dest, ptrs, 65536) == values
    assert client.stats()["client"]["rdma_flush_reads"] >= 1
    check_rdma_moved_gpu_memory(client, "rdma")


@pytest.mark.parametrize("server_mode", ["staged", "single-tenant"])
def test_first_calls_of_four_fresh_processes_on_a_production_pool(torch, server_factory,
                                                                   server_mode):
    """Four client processes start at once against a pool of production
    size (docs/gpu.md, "What each process pins"): each one's first PUT from
    GPU memory (straight into the pool, single-tenant) and first GET into
    it succeed within the call's timeout, byte-exact, and each pinned a few
    slices of the pool, not the pool."""
    from gdrkv.bench import first_call
    # The pool bench --gpu measures with: 64 GiB where the host has room.
    srv = server_factory(memory=str(first_call.default_pool_size()),
                         args=["--single-tenant"] if server_mode == "single-tenant" else [])
    (row,) = first_call.run(srv.url, [4], "shm", timeout_ms=5000)
    for worker in row["workers"]:
        assert worker["put"] == 0 and worker["get1"] == worker["get2"] == first_call.OBJECT_BYTES
        assert worker["same"], worker
        assert 0 < worker["pinned"] <= 4 * (64 << 20), worker
