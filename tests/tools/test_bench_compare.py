"""`gdrkv bench --compare` on a tiny workload with whatever peers this
machine has: every system is either measured (with sane, verified rows) or
reported with the reason it is not; the JSON and the PNG are written. Speed
is never checked (tests/install_peers.sh installs the peers; CI does not)."""
import importlib.util
import json
import shutil
import subprocess
import sys

SIZES = (4096, 65536)
OPS = ("put", "get", "exists")
ENGINE_OPS = ("set", "exists", "get")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# How a system that was not measured is reported.
REASONS = ("not installed", "not available", "skipped", "failed")


def installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:       # its parent package is missing
        return False


def test_compare_reports_every_system(tmp_path):
    report_path, png_path = tmp_path / "compare.json", tmp_path / "compare.png"
    done = subprocess.run(
        [sys.executable, "-m", "gdrkv", "bench", "--compare", "--sizes", "4KiB,64KiB",
         "--count", "4", "--repeat", "1", "--quiet", "--json", str(report_path),
         "--png", str(png_path)],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(report_path.read_text())

    systems = report["systems"]
    assert systems["gdrkv tcp"] == "measured", systems
    peers = {"mooncake tcp": installed("mooncake.store"),
             "redis": installed("redis") and shutil.which("redis-server") is not None}
    for name, present in peers.items():
        if not present:
            assert systems[name].startswith("not installed"), systems[name]
    for status in systems.values():
        assert status == "measured" or status.startswith(REASONS), status
    measured = [name for name, status in systems.items() if status == "measured"]
    rows = {(r["system"], r["size"], r["op"]): r for r in report["results"]}
    assert set(rows) == {(s, size, op) for s in measured for size in SIZES for op in OPS}
    for row in rows.values():
        assert row["mkeys_per_s"] > 0 and row["batch_ms_p50"] > 0
        assert row["baseline_x"] > 0
    assert report["ceilings"]["tcp_gb_per_s"] > 0 and report["ceilings"]["memcpy_gb_per_s"] > 0

    engines = report["engines"]
    for engine, module in (("sglang", "sglang"), ("sglang-mamba", "sglang"),
                           ("lmcache", "lmcache")):
        if installed(module):
            assert engines["systems"][f"{engine} gdrkv tcp"] == "measured", engines["systems"]
            if engine == "lmcache":     # its own lm:// server, started by the bench
                assert engines["systems"]["lmcache lm"] == "measured", engines["systems"]
        else:
            assert engines["systems"][engine].startswith("not installed")
    engine_rows = {(r["engine"], r["system"], r["op"]) for r in engines["results"]}
    assert engine_rows == {(*name.split(" ", 1), op) for name, status
                           in engines["systems"].items() if status == "measured"
                           for op in ENGINE_OPS}

    if installed("matplotlib"):
        assert report["png"] == str(png_path)
        assert png_path.read_bytes().startswith(PNG_MAGIC)
    else:
        assert report["png"].startswith("skipped")
    assert "gdrkv tcp" in done.stdout and "plot:" in done.stdout


def test_compare_refuses_an_outside_server():
    done = subprocess.run([sys.executable, "-m", "gdrkv", "bench", "--compare", "--url",
                           "gdrkv://127.0.0.1:1"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 2 and "--url" in done.stderr
