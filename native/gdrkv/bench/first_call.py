"""The first GPU calls of fresh client processes, apart from the steady
state: what an engine rank pays when it starts against a store whose pool
is of production size (docs/gpu.md, "What each process pins").

N processes start at once, each with a client of its own: it puts one
64 KiB object from GPU memory, then GETs it back into GPU memory twice,
timing each call, and with --single-tenant transports also puts one
straight into the pool. Each process prints one JSON line; the parent
starts them together (they wait on stdin) and tabulates the lines.
"""
import json
import os
import subprocess
import sys
import time

OBJECT_BYTES = 64 << 10
START_TIMEOUT_S = 120.0


def default_pool_size():
    """A realistic share of this host's memory: 64 GiB where the host has
    room for it beside the engines (96 GiB or more), else half of it."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 4 << 30
    if total >= 96 << 30:
        return 64 << 30
    return max(2 << 30, (total // 2) >> 30 << 30)


def run(url, procs_list, label="shm", timeout_ms=2000):
    """Rows of one round per process count: every process's first PUT and
    first and second GET (ms), their results, and its client's pinned
    bytes. label names the transport (shm-single-tenant: shm to a
    --single-tenant server)."""
    transport = label.split("-")[0]
    rows = []
    for procs in procs_list:
        round_id = f"{os.getpid()}-{time.monotonic_ns()}"
        workers = [subprocess.Popen([sys.executable, "-m", "gdrkv.bench.first_call", url,
                                     f"first-{round_id}-{procs}-{i}", transport,
                                     str(timeout_ms)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                   for i in range(procs)]
        try:
            for w in workers:        # each says "ready" once its GPU and client are set up
                line = w.stdout.readline()
                if line.strip() != "ready":
                    raise RuntimeError(f"a first-call worker did not start: {line!r}")
            for w in workers:
                w.stdin.write("go\n")
                w.stdin.flush()
            results = [json.loads(w.stdout.readline()) for w in workers]
        finally:
            for w in workers:
                try:
                    w.wait(timeout=START_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    w.kill()
                    w.wait()
        rows.append({"procs": procs, "transport": label, "workers": results})
    return rows


def table(rows):
    lines = ["first calls of fresh client processes (64 KiB object, GPU memory), ms:",
             f"{'transport':<22}{'procs':>6}{'first PUT':>12}{'first GET':>12}"
             f"{'2nd GET':>10}{'errors':>8}{'pinned MiB':>12}"]
    for row in rows:
        w = row["workers"]
        errors = sum(1 for x in w if x["put"] != 0 or x["get1"] != OBJECT_BYTES or
                     x["get2"] != OBJECT_BYTES or not x["same"])
        span = lambda k: (f"{min(x[k] for x in w):.1f}-{max(x[k] for x in w):.1f}"
                          if len(w) > 1 else f"{w[0][k]:.1f}")
        pinned = max(x["pinned"] for x in w) / (1 << 20)
        lines.append(f"{row['transport']:<22}{row['procs']:>6}{span('put_ms'):>12}"
                     f"{span('get1_ms'):>12}{span('get2_ms'):>10}{errors:>8}{pinned:>12.0f}")
    return "\n".join(lines)


def _worker(url, ns, transport, timeout_ms):
    import torch
    from gdrkv import Client
    torch.cuda.init()
    src = torch.randint(0, 256, (OBJECT_BYTES,), dtype=torch.uint8, device="cuda")
    dst = torch.zeros(OBJECT_BYTES, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    with Client(url, transport=transport, namespace=ns, timeout_ms=timeout_ms) as client:
        client.register(src)
        client.register(dst)
        print("ready", flush=True)
        sys.stdin.readline()
        key = [f"{ns}-obj"]
        timed = {}
        for name, call in (("put", lambda: client.batch_put(key, [src.data_ptr()], [OBJECT_BYTES])),
                           ("get1", lambda: client.batch_get(key, [dst.data_ptr()], [OBJECT_BYTES])),
                           ("get2", lambda: client.batch_get(key, [dst.data_ptr()], [OBJECT_BYTES]))):
            start = time.perf_counter()
            timed[name] = call()[0]
            timed[name + "_ms"] = (time.perf_counter() - start) * 1e3
        torch.cuda.synchronize()
        timed["same"] = bool(torch.equal(src, dst))
        timed["pinned"] = int(client.stats()["client"].get("gpu_pinned_bytes", 0))
    print(json.dumps(timed), flush=True)


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
