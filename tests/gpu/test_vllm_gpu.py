"""The vLLM connector's data movement (adapters/vllm kv_layout and mover,
which import no vLLM) on real GPU KV tensors shaped as vLLM 0.33 allocates
them: saves and loads byte-exact over every transport, objects of one and
of several blocks, a load's skipped blocks left alone, a save ordered after
the work queued on the engine's stream, and a missing key reported as a
load error. Skipped only where no GPU is present."""
import time

import pytest

import gdrkv
from gdrkv.adapters.vllm.kv_layout import KVLayout
from gdrkv.adapters.vllm.mover import KVMover
from support.util import unique
from support.gpu import GPU_OK, GPU_WHY, TRANSPORTS

pytestmark = pytest.mark.skipif(not GPU_OK, reason=f"no GPU present: {GPU_WHY}")

SERVER_MEMORY = "512MiB"
LAYERS, HEADS, BLOCK, HEAD, NUM_BLOCKS = 4, 8, 16, 128, 96


@pytest.fixture
def kv(torch):
    """Per-layer (num_blocks, heads, block, 2 x head) bf16 views in the
    LBNHC order, random bytes."""
    tensors = {f"model.layers.{i}.self_attn.attn":
               torch.empty(NUM_BLOCKS, BLOCK, HEADS, 2 * HEAD, dtype=torch.bfloat16,
                           device="cuda").permute(0, 2, 1, 3) for i in range(LAYERS)}
    for t in tensors.values():
        t.view(torch.int16).random_(-30000, 30000)
    torch.cuda.synchronize()
    return tensors


def block_bytes(torch, kv, block):
    """A block's bytes in memory order, every layer."""
    out = []
    for name in sorted(kv):
        view = kv[name][block]
        storage = view.untyped_storage()
        raw = torch.empty(0, dtype=torch.uint8, device="cuda").set_(storage)
        offset = view.data_ptr() - storage.data_ptr()
        out.append(raw[offset:offset + view.numel() * view.element_size()].cpu())
    return torch.cat(out)


def wait_loaded(mover, req_id):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if req_id in mover.finished(set())[1]:
            return
        time.sleep(0.001)
    pytest.fail(f"load {req_id} never finished")


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("per_key", [1, 4])
def test_saves_and_loads_are_byte_exact(torch, server, kv, transport, per_key):
    layout = KVLayout(kv, NUM_BLOCKS)
    assert layout.segment_bytes == HEADS * BLOCK * 2 * HEAD * 2
    saved, loaded = list(range(3, 3 + 3 * 8, 3))[:8], list(range(60, 68))
    groups = lambda blocks: [blocks[i:i + per_key] for i in range(0, len(blocks), per_key)]  # noqa
    scratch = torch.empty(layout.segment_bytes, dtype=torch.uint8, device="cuda")
    with gdrkv.Client(server.url, transport=transport, namespace=unique("vg")) as client:
        client.register(scratch)
        mover = KVMover(client, layout, scratch.data_ptr())
        try:
            # The save waits for work still queued on the engine's stream:
            # the blocks' final bytes are written there after the call.
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                torch.cuda._sleep(50_000_000)
                for t in kv.values():
                    for b in saved:
                        t[b].view(torch.int16).random_(-30000, 30000)
                event = torch.cuda.Event()
                event.record(stream)
            keys = [f"k{i}" for i in range(len(groups(saved)))]
            mover.save("s", keys, groups(saved), event.synchronize)
            assert mover.wait_saves(["s"], 30)
            assert mover.counters["save_failed_keys"] == 0
            # Into other blocks; with several blocks per key, the first
            # block of the first key is one the engine holds: left alone.
            target = [-1] + loaded[1:] if per_key > 1 else loaded
            before = block_bytes(torch, kv, loaded[0])
            mover.load("l", keys, groups(target))
            wait_loaded(mover, "l")
            assert mover.load_errors() == set()
            torch.cuda.synchronize()
            for s, d in zip(saved, target):
                if d >= 0:
                    assert torch.equal(block_bytes(torch, kv, s), block_bytes(torch, kv, d)), d
            if per_key > 1:
                assert torch.equal(block_bytes(torch, kv, loaded[0]), before)
            # A key that is not there: its blocks are load errors.
            mover.load("m", ["missing"] + keys[1:], groups(loaded))
            wait_loaded(mover, "m")
            assert mover.load_errors() == set(loaded[:per_key])
        finally:
            mover.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_groups_over_the_same_tensors_save_and_load_byte_exact(torch, server, kv, transport):
    """A hybrid model's KV cache groups alias one allocation (a full and a
    sliding-window layer per tensor): the memory is registered once, each
    group's objects come back byte-exact into other blocks, and a block
    that a save still reads is reported until that save is done."""
    names = sorted(kv)
    full = KVLayout({n: kv[n] for n in names[:2]}, NUM_BLOCKS)
    # The sliding-window group: other layer names over the same tensors.
    window = KVLayout({f"window.{i}": kv[n] for i, n in enumerate(names[:2])}, NUM_BLOCKS)
    assert full.regions == window.regions
    with gdrkv.Client(server.url, transport=transport, namespace=unique("vh")) as client:
        mover = KVMover(client, [full, window])
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                torch.cuda._sleep(100_000_000)
                event = torch.cuda.Event()
                event.record(stream)
            keys, saved, groups = ["f3", "f6", "w9", "w12"], [[3], [6], [9], [12]], [0, 0, 1, 1]
            mover.save("s", keys, saved, event.synchronize, groups)
            assert not mover.wait_blocks({12, 40}, 0.01)     # the save waits for the stream
            assert mover.wait_blocks({12, 40}, 30) and mover.wait_saves(["s"], 30)
            assert mover.counters["save_failed_keys"] == 0
            assert mover.counters["save_bytes"] == 4 * 2 * full.segment_bytes
            targets = [[70], [71], [72], [73]]
            mover.load("l", keys, targets, groups)
            wait_loaded(mover, "l")
            assert mover.load_errors() == set()
            torch.cuda.synchronize()
            for s, d in zip(saved, targets):
                for n in names[:2]:     # as int16: random bf16 bits hold NaNs
                    assert torch.equal(kv[n][s[0]].view(torch.int16),
                                       kv[n][d[0]].view(torch.int16)), (n, s, d)
        finally:
            mover.close()
