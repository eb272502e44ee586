"""The self-test of `gdrkv doctor`: a server and a client in this process
talking over the rdma transport (loopback through the NIC, or through
softverbs with GDRKV_IBVERBS_LIB), checked byte for byte, then a small
bandwidth sweep. It is what someone with RDMA hardware runs first.

WRITE is batch_put (the client RDMA-WRITEs into the server's pool), READ is
batch_get (the client RDMA-READs out of it).
"""
import random
import statistics
import time

from ..client import Client
from ..errors import E_NOT_FOUND, GdrkvError, strerror
from ..server import Server

POOL = "256MiB"
SWEEP_SIZES = (4 << 10, 64 << 10, 1 << 20)
SWEEP_BATCH_BYTES = 16 << 20
# Odd sizes too, so a transfer rounded to a word or page would show.
CHECK_SIZES = (1, 4095, 4096, 65537, (1 << 20) + 3)
TIMEOUT_MS = 30000


def run(transport="rdma", server_options=None, runs=5, gpu="auto"):
    """{"ok", "transport", "checks": [{"name", "ok", "detail"}], "sweep":
    [{"memory", "size", "objects", "put_gbps", "get_gbps", ...}]}. Never
    raises for a failure of gdrkv: a failure is a check that did not pass.
    gpu: "auto" (test GPU memory too when torch sees CUDA) or "off"."""
    report = {"ok": False, "transport": transport, "checks": [], "sweep": []}
    checks = report["checks"]
    options = {"rdma": "on"} if server_options is None else server_options
    start = "start a server" + "".join(f" {k}={v}" for k, v in options.items())
    try:
        # unix_path="" turns shm off, so nothing can quietly bypass the transport.
        server = Server(listen="127.0.0.1:0", memory=POOL, pretouch=False, unix_path="",
                        **options)
    except TypeError as e:
        checks.append(_failed(start,
                              f"this gdrkv.Server has no rdma option ({e}): "
                              "rdma transport not built in this library"))
        return report
    except (GdrkvError, ValueError) as e:
        checks.append(_failed(start, str(e)))
        return report
    with server:
        checks.append(_passed(start, server.url))
        try:
            client = Client(server.url, transport=transport, namespace="gdrkv-doctor",
                            timeout_ms=TIMEOUT_MS)
        except (GdrkvError, ValueError) as e:
            checks.append(_failed(f"connect a client with transport={transport}", str(e)))
            return report
        with client:
            checks.append(_passed(f"connect a client with transport={transport}", ""))
            checks += _host_checks(client)
            torch = _torch_cuda(gpu)
            checks += _gpu_checks(client, torch)
            memories = [_HostMemory()] + ([_GpuMemory(torch)] if torch else [])
            if all(c["ok"] for c in checks):
                try:
                    report["sweep"] = _sweep(client, runs, memories)
                except (_Mismatch, GdrkvError, ValueError) as e:
                    checks.append(_failed("bandwidth sweep", str(e)))
            # What the transport itself counted (work requests, posts,
            # completions), when its client counters say.
            report["client_counters"] = {name: value for name, value
                                         in client.stats()["client"].items() if "rdma" in name}
    report["ok"] = all(c["ok"] for c in checks)
    return report


def _passed(name, detail):
    return {"name": name, "ok": True, "detail": detail}


def _failed(name, detail):
    return {"name": name, "ok": False, "detail": detail}


class _Mismatch(Exception):
    pass


def _pattern(nbytes, seed):
    return bytearray(random.Random(seed).randbytes(nbytes))


def _keys(tag, n):
    return [f"{tag}-{time.monotonic_ns()}-{i}" for i in range(n)]


def _layout(sizes):
    offsets, off = [], 0
    for size in sizes:
        offsets.append(off)
        off += size
    return offsets, off


def _host_checks(client):
    return [_check(f"host memory WRITE then READ, {len(CHECK_SIZES)} objects of 1B..1MiB+3",
                   lambda: _roundtrip_host(client)),
            _check("host memory, objects of 3 segments each way",
                   lambda: _roundtrip_segments(client)),
            _check("READ of a missing key reports not found",
                   lambda: _missing(client))]


def _check(name, body):
    try:
        return _passed(name, body() or "")
    except (_Mismatch, GdrkvError, ValueError) as e:
        return _failed(name, str(e))


def _registered(client, buf):
    return client.register(buf)[0]


def _expect(results, expected, what):
    bad = [(i, r) for i, r in enumerate(results) if r != expected[i]]
    if bad:
        i, r = bad[0]
        got = strerror(r) if r < 0 else f"{r}"
        raise _Mismatch(f"{what}: {len(bad)} of {len(results)} objects failed; "
                        f"object {i} gave {got}, expected {expected[i]}")


def _roundtrip_host(client):
    sizes = list(CHECK_SIZES)
    offsets, total = _layout(sizes)
    src, dst = _pattern(total, 1), bytearray(total)
    src_base, dst_base = _registered(client, src), _registered(client, dst)
    try:
        keys = _keys("host", len(sizes))
        _expect(client.batch_put(keys, [src_base + o for o in offsets], sizes),
                [0] * len(sizes), "WRITE (batch_put)")
        _expect(client.batch_get(keys, [dst_base + o for o in offsets], sizes),
                sizes, "READ (batch_get)")
        _compare(src, dst, offsets, sizes)
        client.batch_delete(keys)
    finally:
        client.unregister(src_base)
        client.unregister(dst_base)
    return f"{total} bytes byte-exact"


def _compare(src, dst, offsets, sizes):
    for i, (off, size) in enumerate(zip(offsets, sizes)):
        if src[off:off + size] != dst[off:off + size]:
            first = next(j for j in range(size) if src[off + j] != dst[off + j])
            raise _Mismatch(f"object {i} ({size} bytes) differs from what was written, "
                            f"first at byte {first}")


def _roundtrip_segments(client):
    # One object of 3 scattered pieces written, read back split differently.
    n, size = 4, 3 * 5000 + 7
    src, dst = _pattern(2 * n * size, 2), bytearray(2 * n * size)
    src_base, dst_base = _registered(client, src), _registered(client, dst)
    try:
        keys = _keys("segments", n)
        put_parts = [(1000, 9000, size - 10000)] * n
        get_parts = [(7, size - 4007, 4000)] * n
        ptrs, lens = _scatter(src_base, size, put_parts)
        _expect(client.batch_put(keys, ptrs, lens), [0] * n, "WRITE of 3 segments")
        ptrs, lens = _scatter(dst_base, size, get_parts)
        _expect(client.batch_get(keys, ptrs, lens), [size] * n, "READ into 3 segments")
        for i in range(n):
            want = _gather(src, i, size, put_parts[i])
            got = _gather(dst, i, size, get_parts[i])
            if want != got:
                raise _Mismatch(f"object {i}: the 3 segments read back differ from those written")
        client.batch_delete(keys)
    finally:
        client.unregister(src_base)
        client.unregister(dst_base)
    return f"{n} objects of {size} bytes"


def _scatter(base, size, parts):
    """Object i's segments at base + 2*size*i, with a gap of `gap` bytes between
    segments so a transfer that ignores the segment list shows up."""
    ptrs, lens = [], []
    for i, pieces in enumerate(parts):
        at, obj_ptrs = base + 2 * size * i, []
        for piece in pieces:
            obj_ptrs.append(at)
            at += piece + size // 8
        ptrs.append(obj_ptrs)
        lens.append(list(pieces))
    return ptrs, lens


def _gather(buf, i, size, pieces):
    at, out = 2 * size * i, bytearray()
    for piece in pieces:
        out += buf[at:at + piece]
        at += piece + size // 8
    return bytes(out)


def _missing(client):
    dst = bytearray(64)
    base = _registered(client, dst)
    try:
        result = client.batch_get(_keys("missing", 1), [base], [64])[0]
    finally:
        client.unregister(base)
    if result != E_NOT_FOUND:
        raise _Mismatch(f"got {strerror(result) if result < 0 else result}, expected not found")
    return ""


def _torch_cuda(gpu):
    """torch when GPU memory can be tested (gpu "auto" and CUDA there), else None."""
    if gpu == "off":
        return None
    try:
        import torch
    except ImportError:
        return None         # no torch: no way here to allocate GPU memory
    return torch if torch.cuda.is_available() else None


def _gpu_checks(client, torch):
    if torch is None:
        return []
    return [_check("GPU memory WRITE from and READ into cudaMalloc memory",
                   lambda: _roundtrip_gpu(client, torch))]


class _HostMemory:
    name = "host"

    def buffers(self, src):
        return src, bytearray(len(src))

    def read_back(self, dst):
        return dst


class _GpuMemory:
    name = "gpu"

    def __init__(self, torch):
        self.torch = torch

    def buffers(self, src):
        torch = self.torch
        gpu_src = torch.frombuffer(src, dtype=torch.uint8).to("cuda")
        gpu_dst = torch.zeros(len(src), dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        return gpu_src, gpu_dst

    def read_back(self, dst):
        return bytearray(dst.cpu().tolist())


def _roundtrip_gpu(client, torch):
    sizes = list(CHECK_SIZES)
    offsets, total = _layout(sizes)
    memory = _GpuMemory(torch)
    src_host = _pattern(total, 3)
    src, dst = memory.buffers(src_host)
    src_base, dst_base = _registered(client, src), _registered(client, dst)
    try:
        keys = _keys("gpu", len(sizes))
        _expect(client.batch_put(keys, [src_base + o for o in offsets], sizes),
                [0] * len(sizes), "WRITE from GPU memory")
        _expect(client.batch_get(keys, [dst_base + o for o in offsets], sizes),
                sizes, "READ into GPU memory")
        _compare(src_host, memory.read_back(dst), offsets, sizes)
        client.batch_delete(keys)
    finally:
        client.unregister(src_base)
        client.unregister(dst_base)
    return f"{total} bytes byte-exact on {torch.cuda.get_device_name()}"


def _sweep(client, runs, memories):
    rows = []
    for memory in memories:
        for size in SWEEP_SIZES:
            rows.append(_sweep_one(client, runs, memory, size))
    return rows


def _sweep_one(client, runs, memory, size):
    n = max(1, SWEEP_BATCH_BYTES // size)
    src_host = _pattern(n * size, size)
    src, dst = memory.buffers(src_host)
    src_base, dst_base = _registered(client, src), _registered(client, dst)
    ptrs = [i * size for i in range(n)]
    put_s, get_s = [], []
    what = f"sweep over {memory.name} memory, {n} x {size}B"
    try:
        for run in range(max(1, runs)):
            keys = _keys(f"sweep{size}", n)
            t0 = time.perf_counter()
            put = client.batch_put(keys, [src_base + p for p in ptrs], [size] * n)
            t1 = time.perf_counter()
            got = client.batch_get(keys, [dst_base + p for p in ptrs], [size] * n)
            t2 = time.perf_counter()
            _expect(put, [0] * n, f"{what}: WRITE")
            _expect(got, [size] * n, f"{what}: READ")
            if run == 0 and memory.read_back(dst) != src_host:
                raise _Mismatch(f"{what}: the bytes READ differ from those written")
            put_s.append(t1 - t0)
            get_s.append(t2 - t1)
            client.batch_delete(keys)
    finally:
        client.unregister(src_base)
        client.unregister(dst_base)
    put_med, get_med = statistics.median(put_s), statistics.median(get_s)
    return {"memory": memory.name, "size": size, "objects": n, "runs": len(put_s),
            "put_seconds": put_med, "get_seconds": get_med,
            "put_gbps": n * size / put_med / 1e9, "get_gbps": n * size / get_med / 1e9}
