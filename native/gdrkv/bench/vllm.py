"""gdrkv bench --vllm: a long prompt's paged KV saved from and loaded into
GPU KV tensors shaped as vLLM 0.33 allocates them, through the vLLM
connector's own data movement (gdrkv.adapters.vllm: KVLayout, KVMover,
which import no vLLM), against the ceilings of the same segments in the
same run.

Geometry (Llama-3.1-8B): 32 layers, 8 KV heads, head size 128, bf16, blocks
of 16 tokens; a 12k-token prompt is 750 blocks, 32 x 64 KiB each (1.57 GB).
Each layer's tensor is (num_blocks, heads, block, 2 x head) in the LBNHC
order. A save writes 750 scattered blocks, a load reads them into 750
others; times are wall clock from the call to the mover until it reports
the request done, median of rounds. Ceilings: one gather kernel over the
same 24,000 segments between pinned host memory and the KV tensors
(gdrkv.gpu.copy), each way. Interference: a memory-bound kernel (the decode
stand-in of bench --gpu) alone and while loads stream over shm.

First calls: a fresh process (a new engine rank) sets up its KV tensors
and client, then saves the prompt and loads it back, timing its first save
and load apart from its second: against a pool of --pool-size, the first
pay for whatever of the pool the process must make reachable from the GPU
(docs/gpu.md, "What each process pins").

Needs torch.
"""
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from .. import gpu
from ..client import Client
from ..sizes import format_size
from ..table import format_table
from . import harness
from .gpu import INTERFERENCE_BYTES, SINGLE_TENANT, cuda_torch, memory_bound

LAYERS, HEADS, BLOCK, HEAD = 32, 8, 16, 128
PROMPT_BLOCKS = 750
ROUNDS = 5
BLOCKS_PER_KEY = (1, 16)


def add_arguments(parser):
    parser.add_argument("--vllm", action="store_true",
                        help="vLLM connector data path: save and load of a 12k-token prompt's "
                             "KV (Llama-3.1-8B geometry) between GPU KV tensors and gdrkv, "
                             "against one-kernel ceilings and with a decode-like kernel "
                             "(transports: --gpu-transports)")


def run(args):
    torch, why = cuda_torch("--vllm")
    if torch is None:
        return 1
    from gdrkv.adapters.vllm.kv_layout import KVLayout
    from gdrkv.adapters.vllm.mover import KVMover

    layout, saved, loaded = _kv_tensors(torch, KVLayout)
    nbytes = PROMPT_BLOCKS * layout.segment_bytes * LAYERS
    report = {"gpu": torch.cuda.get_device_name(0), "driver": why, "bytes": nbytes,
              "pool_size": args.pool_size,
              "blocks": PROMPT_BLOCKS, "segment_bytes": layout.segment_bytes,
              "ceilings": _ceilings(torch, layout, saved, nbytes), "connector": [],
              "first_calls": []}
    print(f"# {report['gpu']} ({why}); {PROMPT_BLOCKS} blocks, {format_size(nbytes)}",
          flush=True)
    transports = [t for t in args.gpu_transports.split(",") if t]
    server_args = type("ServerArgs", (), {"url": args.url, "count": 1, "sizes": [nbytes]})
    for transport in transports:
        # shm-single-tenant: shm to a server of its own started --single-tenant.
        flags = ["--single-tenant"] if transport.endswith(SINGLE_TENANT) else []
        with harness.server(server_args, flags, pretouch=True, memory=args.pool_size) as url:
            report["first_calls"].append(_first_calls(url, transport, args.conns))
            for per_key in BLOCKS_PER_KEY:
                report["connector"].append(_save_load(torch, KVMover, url, transport, layout,
                                                      saved, loaded, per_key, args.conns))
            if transport == "shm":
                report["interference"] = _interference(torch, KVMover, url, layout, saved,
                                                       loaded, args.conns)
    print(_table(report), flush=True)
    print(_first_calls_table(report["first_calls"]), flush=True)
    if "interference" in report:
        print(_interference_table(report["interference"]), flush=True)
    harness.write_json(args.json, report)
    return 0


def _kv_tensors(torch, layout_class):
    """The KV tensors, filled, and the blocks a prompt is saved from and
    loaded into (the same in every process: a fixed seed)."""
    num_blocks = 2 * PROMPT_BLOCKS + 100
    # LBNHC: each block is (tokens, heads, K|V) in memory, seen as (heads, tokens, K|V).
    kv = {f"model.layers.{i}.self_attn.attn":
          torch.empty(num_blocks, BLOCK, HEADS, 2 * HEAD, dtype=torch.bfloat16,
                      device="cuda").permute(0, 2, 1, 3) for i in range(LAYERS)}
    for t in kv.values():
        t.view(torch.int16).random_(-30000, 30000)
    torch.cuda.synchronize()
    layout = layout_class(kv, num_blocks)
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0)).tolist()
    return layout, order[:PROMPT_BLOCKS], order[PROMPT_BLOCKS:2 * PROMPT_BLOCKS]


FIRST_CALL_BLOCKS_PER_KEY = 16
FIRST_CALL_TIMEOUT_S = 300


def _first_calls(url, transport, conns):
    """A fresh process's first save and load of the prompt, then its
    second (python -m gdrkv.bench.vllm, below)."""
    proc = subprocess.run([sys.executable, "-m", "gdrkv.bench.vllm", url, transport,
                           str(conns or 0)], capture_output=True, text=True,
                          timeout=FIRST_CALL_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"the fresh process failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _fresh_process(url, transport, conns):
    """What a new rank does first: its tensors, its client and mover, then
    save and load twice, each timed. Prints one JSON line."""
    import torch
    from gdrkv.adapters.vllm.kv_layout import KVLayout
    from gdrkv.adapters.vllm.mover import KVMover

    layout, saved, loaded = _kv_tensors(torch, KVLayout)
    ns = f"bench-vllm-first-{os.getpid()}"
    options = {"conns": conns} if conns else {}
    row = {"transport": transport, "blocks_per_key": FIRST_CALL_BLOCKS_PER_KEY}
    with Client(url, transport=transport.removesuffix(SINGLE_TENANT), namespace=ns,
                timeout_ms=30000, **options) as client:
        mover = KVMover(client, layout)
        try:
            groups_saved = _chunks(saved, FIRST_CALL_BLOCKS_PER_KEY)
            groups_loaded = _chunks(loaded, FIRST_CALL_BLOCKS_PER_KEY)
            for r in (1, 2):
                keys = [f"r{r}-{i}" for i in range(len(groups_saved))]
                start = time.perf_counter()
                mover.save(f"s{r}", keys, groups_saved)
                if not mover.wait_saves([f"s{r}"], 60):
                    raise RuntimeError("save did not finish")
                middle = time.perf_counter()
                mover.load(f"l{r}", keys, groups_loaded)
                _wait_loaded(mover, f"l{r}")
                end = time.perf_counter()
                row[f"save{r}_ms"] = 1e3 * (middle - start)
                row[f"load{r}_ms"] = 1e3 * (end - middle)
                row["byte_exact"] = row.get("byte_exact", True) and \
                    _same_blocks(torch, layout, saved, loaded)
                # As the steady rounds do: the next round's objects take the
                # same room of the pool, so its copies find their slices.
                client.clear()
            row["failed"] = len(mover.load_errors()) + mover.counters["save_failed_keys"]
            row["pinned"] = int(client.stats()["client"].get("gpu_pinned_bytes", 0))
        finally:
            mover.close()
    print(json.dumps(row), flush=True)


def _first_calls_table(rows):
    out = [["transport", "blocks/key", "1st save ms", "1st load ms", "2nd save ms",
            "2nd load ms", "failed", "byte-exact", "pinned MiB"]]
    for r in rows:
        out.append([r["transport"], str(r["blocks_per_key"]), f"{r['save1_ms']:.1f}",
                    f"{r['load1_ms']:.1f}", f"{r['save2_ms']:.1f}", f"{r['load2_ms']:.1f}",
                    str(r["failed"]), str(r["byte_exact"]), f"{r['pinned'] / (1 << 20):.0f}"])
    return "first calls of a fresh process (its tensors and client set up first)\n" + \
        format_table(out)


def _chunks(blocks, per_key):
    return [blocks[i:i + per_key] for i in range(0, len(blocks), per_key)]


def _wait_loaded(mover, req_id, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if req_id in mover.finished(set())[1]:
            return
        time.sleep(0.0002)
    raise RuntimeError(f"load {req_id} did not finish in {timeout} s")


def _same_blocks(torch, layout, a_blocks, b_blocks):
    """Whether blocks a_blocks hold the same bytes as b_blocks, every layer."""
    return bool(torch.equal(_gather(torch, layout, a_blocks), _gather(torch, layout, b_blocks)))


def _gather(torch, layout, blocks):
    out = torch.empty(len(blocks) * len(layout.planes) * layout.segment_bytes,
                      dtype=torch.uint8, device="cuda")
    ptrs = layout.segments(blocks)
    dsts = [out.data_ptr() + i * layout.segment_bytes for i in range(len(ptrs))]
    gpu.copy(0, gpu.Pieces(dsts, ptrs, [layout.segment_bytes] * len(ptrs)), "kernel")
    return out


def _save_load(torch, mover_class, url, transport, layout, saved, loaded, per_key, conns):
    ns = f"bench-vllm-{os.getpid()}-{transport}-{per_key}"
    saves, loads = [], []
    options = {"conns": conns} if conns else {}
    with Client(url, transport=transport.removesuffix(SINGLE_TENANT), namespace=ns,
                timeout_ms=30000, **options) as client:
        mover = mover_class(client, layout)
        try:
            groups_saved, groups_loaded = _chunks(saved, per_key), _chunks(loaded, per_key)
            for r in range(ROUNDS + 1):     # round 0 warms up (first touches, connections)
                keys = [f"r{r}-{i}" for i in range(len(groups_saved))]
                start = time.perf_counter()
                mover.save(f"s{r}", keys, groups_saved)
                if not mover.wait_saves([f"s{r}"], 60):
                    raise RuntimeError("save did not finish")
                middle = time.perf_counter()
                mover.load(f"l{r}", keys, groups_loaded)
                _wait_loaded(mover, f"l{r}")
                end = time.perf_counter()
                errors = mover.load_errors()
                if errors or mover.counters["save_failed_keys"]:
                    raise RuntimeError(f"{len(errors)} blocks failed to load, "
                                       f"{mover.counters['save_failed_keys']} keys to save")
                if r:
                    saves.append(middle - start)
                    loads.append(end - middle)
                client.clear()
            exact = _same_blocks(torch, layout, saved, loaded)
        finally:
            mover.close()
    save_s, load_s = statistics.median(saves), statistics.median(loads)
    nbytes = len(saved) * len(layout.planes) * layout.segment_bytes
    return {"transport": transport, "blocks_per_key": per_key, "conns": conns,
            "keys": len(_chunks(saved, per_key)),
            "save_ms": 1e3 * save_s, "load_ms": 1e3 * load_s,
            "save_gb_per_s": nbytes / save_s / 1e9, "load_gb_per_s": nbytes / load_s / 1e9,
            "byte_exact": exact}


def _ceilings(torch, layout, blocks, nbytes):
    """The same segments between pinned host memory and the KV tensors, one
    kernel launch each way (the H2D copy overwrites the saved blocks; the
    save rounds then store those bytes)."""
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    ptrs = layout.segments(blocks)
    seg = layout.segment_bytes
    hosts = [host.data_ptr() + i * seg for i in range(len(ptrs))]
    lens = [seg] * len(ptrs)
    h2d, d2h = gpu.Pieces(ptrs, hosts, lens), gpu.Pieces(hosts, ptrs, lens)
    row = {}
    for name, pieces in (("h2d", h2d), ("d2h", d2h)):
        gpu.copy(0, pieces, "kernel")
        times = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            gpu.copy(0, pieces, "kernel")
            times.append(time.perf_counter() - start)
        row[f"{name}_ms"] = 1e3 * statistics.median(times)
        row[f"{name}_gb_per_s"] = nbytes / statistics.median(times) / 1e9
    return row


def _interference(torch, mover_class, url, layout, saved, loaded, conns):
    a = torch.empty(INTERFERENCE_BYTES, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    stream = torch.cuda.Stream()
    memory_bound(torch, a, b, stream, 10)
    alone = statistics.median(memory_bound(torch, a, b, stream, 100) for _ in range(3))
    ns = f"bench-vllm-intf-{os.getpid()}"
    options = {"conns": conns} if conns else {}
    with Client(url, transport="shm", namespace=ns, timeout_ms=30000, **options) as client:
        mover = mover_class(client, layout)
        keys = [f"k{i}" for i in range(len(saved))]
        mover.save("s", keys, _chunks(saved, 1))
        mover.wait_saves(["s"], 60)
        stop, moved = threading.Event(), [0]

        def stream_loads():
            n = 0
            while not stop.is_set():
                mover.load(f"l{n}", keys, _chunks(loaded, 1))
                _wait_loaded(mover, f"l{n}")
                moved[0] += len(saved) * len(layout.planes) * layout.segment_bytes
                n += 1

        thread = threading.Thread(target=stream_loads)
        thread.start()
        try:
            time.sleep(0.3)
            t0, m0 = time.perf_counter(), moved[0]
            busy = statistics.median(memory_bound(torch, a, b, stream, 100) for _ in range(3))
            gbps = (moved[0] - m0) / (time.perf_counter() - t0) / 1e9
        finally:
            stop.set()
            thread.join()
            mover.close()
        client.clear()
    return {"kernel_ms_alone": alone, "kernel_ms_with_loads": busy,
            "slowdown_pct": 100 * (busy / alone - 1), "load_gb_per_s": gbps}


def _table(report):
    c = report["ceilings"]
    out = [["transport", "blocks/key", "keys", "save ms", "save GB/s", "% D2H kernel",
            "load ms", "load GB/s", "% H2D kernel", "byte-exact"]]
    for r in report["connector"]:
        out.append([r["transport"], str(r["blocks_per_key"]), str(r["keys"]), f"{r['save_ms']:.1f}",
                    f"{r['save_gb_per_s']:.1f}", f"{100 * r['save_gb_per_s'] / c['d2h_gb_per_s']:.0f}",
                    f"{r['load_ms']:.1f}", f"{r['load_gb_per_s']:.1f}",
                    f"{100 * r['load_gb_per_s'] / c['h2d_gb_per_s']:.0f}", str(r["byte_exact"])])
    return (f"vLLM KV through the connector's mover; ceilings (one kernel, same segments): "
            f"H2D {c['h2d_ms']:.1f} ms ({c['h2d_gb_per_s']:.1f} GB/s), "
            f"D2H {c['d2h_ms']:.1f} ms ({c['d2h_gb_per_s']:.1f} GB/s)\n" + format_table(out))


def _interference_table(r):
    out = [["D2D copy ms alone", "with loads", "slowdown %", "loads GB/s meanwhile"],
           [f"{r['kernel_ms_alone']:.3f}", f"{r['kernel_ms_with_loads']:.3f}",
            f"{r['slowdown_pct']:.1f}", f"{r['load_gb_per_s']:.2f}"]]
    return ("interference: a memory-bound kernel while the mover streams loads (shm)\n"
            + format_table(out))


if __name__ == "__main__":
    _fresh_process(sys.argv[1], sys.argv[2], int(sys.argv[3]))
