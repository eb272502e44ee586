"""The `gdrkv` command line: serve, stat, bench, doctor."""
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from support.util import run_gdrkv, stat

PHYSICAL_RAM = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gdrkv(*args, timeout=60):
    return run_gdrkv(*args, timeout=timeout)


def find_key(tree, name):
    """Every value stored under name anywhere in a JSON tree."""
    if isinstance(tree, dict):
        return [v for k, v in tree.items() if k == name] + \
            [x for v in tree.values() for x in find_key(v, name)]
    if isinstance(tree, list):
        return [x for v in tree for x in find_key(v, name)]
    return []


def numbers(tree):
    if isinstance(tree, bool):
        return []
    if isinstance(tree, (int, float)):
        return [tree]
    values = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, list) else []
    return [x for v in values for x in numbers(v)]


def strict_json(text):
    def refuse(constant):
        raise ValueError(f"{constant} in JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_prints_one_line_and_stops_cleanly(sig, server_factory):
    server = server_factory(memory="16MiB")
    assert server.stop(sig) == 0, server.log_tail()
    lines = server.stdout().decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gdrkv listening on {server.address}"), lines


def test_serve_memory_as_percent_of_ram(server_factory):
    server = server_factory(memory="1%")
    pool = stat(server.stats(), "pool_bytes")
    assert 0.9 * PHYSICAL_RAM / 100 <= pool <= PHYSICAL_RAM / 100


@pytest.mark.parametrize("args, mentions", [
    (["--memory", "banana"], "memory"),
    (["--memory", "0"], "memory"),
    (["--listen", "127.0.0.1:99999"], "listen"),
    (["--hugepages", "sometimes"], "hugepages"),
    (["--workers", "many"], "workers"),
    (["--bogus"], "bogus"),
])
def test_serve_rejects_bad_options_clearly(args, mentions):
    result = gdrkv("serve", "--no-pretouch", "--listen", "127.0.0.1:0", "--memory", "16MiB", *args,
                   timeout=30)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert mentions in output, output
    assert "Traceback" not in output, output
    assert "gdrkv listening" not in output


@pytest.mark.parametrize("pretouch", [[], ["--no-pretouch"]])
def test_serve_refuses_a_pool_larger_than_the_host_at_once(pretouch):
    """A pool the host can never hold (the docs' production 64GiB on a small
    machine, say) is refused before anything is mapped, naming both sizes,
    rather than pretouched into the OOM killer."""
    memory_mib = PHYSICAL_RAM >> 20
    asked_mib = memory_mib + 1024
    result = gdrkv("serve", *pretouch, "--listen", "127.0.0.1:0", "--memory", f"{asked_mib}MiB",
                   timeout=30)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output, output
    assert f"a {asked_mib} MiB pool does not fit in this host's {memory_mib} MiB of memory" \
        in output, output
    assert "gdrkv listening" not in output


def test_serve_on_a_taken_port_fails_clearly(server_factory):
    server = server_factory(memory="16MiB")
    result = gdrkv("serve", "--no-pretouch", "--memory", "16MiB", "--listen", server.address,
                   timeout=30)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in output, output
    assert server.alive


def test_stat_prints_counters(server_factory):
    server = server_factory(memory="16MiB")
    pool = stat(server.stats(), "pool_bytes")

    text = gdrkv("stat", server.url)
    assert text.returncode == 0, text.stderr
    assert "pool_bytes" in text.stdout and str(pool) in text.stdout, text.stdout

    as_json = gdrkv("stat", server.url, "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert pool in find_key(strict_json(as_json.stdout), "pool_bytes"), as_json.stdout


def test_stat_of_a_dead_server_fails(server_factory):
    server = server_factory(memory="16MiB")
    server.kill()
    result = gdrkv("stat", server.url, timeout=30)
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr


def test_bench_on_embedded_server_writes_json(tmp_path):
    out = tmp_path / "out.json"
    result = gdrkv("bench", "--count", "8", "--sizes", "4KiB,64KiB", "--repeat", "1",
                   "--json", str(out), timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    report = strict_json(out.read_text())
    assert set(report) == {"machine", "options", "ceilings", "results"}, report
    assert report["options"]["count"] == 8 and report["options"]["sizes"] == [4096, 65536]
    # One row per size and op, each with its figures measured.
    rows = {(r["size"], r["op"]): r for r in report["results"]}
    assert set(rows) == {(s, op) for s in (4096, 65536) for op in ("put", "get", "exists")}
    for (size, op), row in rows.items():
        assert row["count"] == 8 and row["batches_per_round"] >= 1, row
        assert row["mkeys_per_s"] > 0 and row["batch_ms_p50"] > 0, row
        assert ("gb_per_s" in row) == (op != "exists"), row
        if op != "exists":
            # GB/s and Mkeys/s are the same rounds seen two ways.
            assert row["gb_per_s"] == pytest.approx(row["mkeys_per_s"] * 1e6 * size / 1e9), row
    # The table printed has the same rows.
    table = [line.split() for line in result.stdout.splitlines()[1:] if line.strip()]
    assert {(line[0], line[1]) for line in table} == {
        (s, op) for s in ("4KiB", "64KiB") for op in ("put", "get", "exists")}


def test_bench_cluster_reports_every_measure(tmp_path):
    """gdrkv bench --cluster (#40): etcd and the members start, the load runs
    through a kill, a join and a leave, and every figure is in the JSON, the
    table and the PNG."""
    out, png = tmp_path / "cluster.json", tmp_path / "cluster.png"
    result = gdrkv("bench", "--cluster", "2", "--cluster-clients", "1", "--cluster-ttl-ms",
                   "2000", "--cluster-seconds", "0.5", "--json", str(out), "--png", str(png),
                   timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    report = strict_json(out.read_text())
    assert report["options"]["servers"] == 2 and report["options"]["replicas"] == 2
    assert report["single_keys_per_s"] > 0 and report["cluster_keys_per_s"] > 0
    assert report["detection_s"] > report["fallover_s"] > 0
    assert 0 < report["join_moved_share"] < 1 and report["join_ideal_share"] == 0.5
    assert [what for _, what in report["events"]] == ["kill", "join", "joined", "leave"]
    assert sum(row["keys_per_s"] for row in report["timeline"]) > 0
    assert report["png"] == str(png) and png.read_bytes().startswith(b"\x89PNG")
    assert "detection: kill -> every table updated" in result.stdout


def test_doctor():
    result = gdrkv("doctor", "--no-self-test", timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    sections = [line for line in result.stdout.splitlines() if line and not line[0].isspace()]
    assert sections[:4] == ["system", "rdma devices (sysfs)",
                            "rdma transport (libibverbs as gdrkv sees it)", "gpus"], sections
    assert re.search(r"^  transports +tcp and shm are built", result.stdout, re.M), result.stdout


def test_console_script_and_help():
    script = os.path.join(os.path.dirname(sys.executable), "gdrkv")
    assert os.access(script, os.X_OK), f"no console script at {script}"
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    for command in ("serve", "stat", "bench", "doctor"):
        assert command in result.stdout
