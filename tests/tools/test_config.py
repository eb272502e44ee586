"""`gdrkv serve --config FILE` (#19): every flag under its long name in a
TOML file, flags winning over it, unknown keys and wrong kinds refused by
name; the example in configs/server loads; a server runs from a file."""
import os
import re
import tomllib
import urllib.request

import pytest

from support.util import run_gdrkv

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "server")

# Every setting with a value other than its default.
EVERY = {
    "listen": "127.0.0.1:0",
    "memory": 48 << 20,
    "workers": 3,
    "busy_poll_us": 250,
    "hugepages": "off",
    "pretouch": False,
    "stall_timeout_ms": 1234,
    "max_connections": 99,
    "max_connections_per_peer": 7,
    "idle_timeout_ms": 65000,
    "drain_timeout_ms": 1500,
    "max_buffered": "64MiB",
    "unix_path": "",
    "lease_timeout_ms": 777,
    "rdma": "off",
    "shm_staging": "8MiB",
    "single_tenant": True,
    "pool_file": "/dev/shm/gdrkv.pool",
    "reset_pool_file": True,
    "disk": "/mnt/nvme0/gdrkv,/mnt/nvme1/gdrkv",
    "disk_size": 1 << 40,
    "reset_disk": True,
    "auth_token_file": "/etc/gdrkv/token",
    "insecure_no_auth": True,
    "metrics_listen": "127.0.0.1:0",
}


def toml(table):
    return "".join(f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}\n".replace(
        "'", '"') for k, v in table.items())


def printed(*args):
    out = run_gdrkv("serve", *args, "--print-config")
    assert out.returncode == 0, out.stderr
    return tomllib.loads(out.stdout)


def test_every_flag_round_trips(tmp_path):
    path = tmp_path / "gdrkv.toml"
    path.write_text(toml(EVERY))
    assert printed("--config", str(path)) == EVERY
    # The file names every setting --print-config knows: none is missing.
    assert set(printed()) | {"unix_path", "auth_token_file", "metrics_listen",
                             "pool_file", "disk", "disk_size"} == set(EVERY)


def test_flags_win_over_the_file(tmp_path):
    path = tmp_path / "gdrkv.toml"
    path.write_text(toml(EVERY))
    got = printed("--config", str(path), "--workers", "5", "--rdma=auto", "--memory", "32MiB")
    assert got == {**EVERY, "workers": 5, "rdma": "auto", "memory": 32 << 20}


@pytest.mark.parametrize("line, message", [
    ('colour = "red"', "unknown key 'colour'"),
    ('pretouch = "no"', "pretouch must be true or false"),
    ('workers = "many"', "workers"),
    ('hugepages = "sometimes"', "hugepages must be one of"),
    ('memory = [1]', "memory must be a string or a number"),
    ('listen = ', "config"),
])
def test_bad_files_are_refused_by_name(tmp_path, line, message):
    path = tmp_path / "gdrkv.toml"
    path.write_text(line + "\n")
    out = run_gdrkv("serve", "--config", str(path), "--print-config")
    assert out.returncode == 1 and message in out.stderr and str(path) in out.stderr, out.stderr


def test_the_example_loads():
    got = printed("--config", os.path.join(CONFIGS, "gdrkv.toml"))
    assert got["auth_token_file"] == "/etc/gdrkv/token" and got["memory"] == 64 << 30
    with open(os.path.join(CONFIGS, "gdrkv.service")) as f:
        assert "--config /etc/gdrkv/gdrkv.toml" in f.read()


def test_a_server_runs_from_its_file(server_factory, tmp_path):
    path = tmp_path / "gdrkv.toml"
    path.write_text(toml({"metrics_listen": "127.0.0.1:0", "max_connections": 50}))
    server = server_factory("32MiB", args=["--config", str(path)])
    address = re.search(rb"metrics on http://(\S+?)/metrics", server.stdout()).group(1).decode()
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        assert b"gdrkv_store_pool_bytes 33554432" in answer.read()
