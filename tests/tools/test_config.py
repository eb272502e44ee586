"""`gdrkv serve --config FILE` (#19): every flag under its long name in a
TOML file, flags winning over it, unknown keys and wrong kinds refused by
name; the example in configs/server loads; a server runs from a file."""
import argparse
import os
import re
import tomllib
import urllib.request

import pytest
import gdrkv
from gdrkv import cli, config
from gdrkv._native import ffi
from gdrkv.server import OPTIONS

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
    "high_watermark": 0.8,
    "low_watermark": 0.7,
    "stall_timeout_ms": 1234,
    "max_connections": 99,
    "max_connections_per_peer": 7,
    "idle_timeout_ms": 65000,
    "drain_timeout_ms": 1500,
    "max_buffered": "64MiB",
    "unix_path": "",
    "lease_timeout_ms": 777,
    "peer_pin_share": 0.5,
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


def test_one_options_table_drives_every_door():
    """The C table (server_options.c) names every field of gdrkv_server_opts
    once, and each entry is a Server keyword, a `serve` flag and a TOML key,
    with help: a new option is its field and its table line."""
    fields = {name for name, _ in ffi.typeof("gdrkv_server_opts").fields}
    assert sorted(option.field for option in OPTIONS.values()) == sorted(fields)
    assert set(EVERY) == set(OPTIONS)
    parser = argparse.ArgumentParser()
    cli._add_option_flags(parser)
    flags = {a.dest: a.option_strings for a in parser._actions if a.option_strings}
    for name, option in OPTIONS.items():
        dashed = name.replace("_", "-")
        assert flags[name] == [f"--no-{dashed}" if option.default is True else f"--{dashed}"]
        assert option.help and name in gdrkv.Server.__doc__, name
    assert set(config.settings(parser)) == set(OPTIONS)
    with pytest.raises(TypeError, match="colour"):
        gdrkv.Server(colour="red")


def test_defaults_come_from_c():
    """Python writes no default of its own: --print-config and --help show
    the C table's, and a Server keyword left at None keeps it."""
    assert OPTIONS["stall_timeout_ms"].default == 30000
    assert OPTIONS["max_buffered"].default == "256MiB"
    assert OPTIONS["busy_poll_us"].default == "auto" and OPTIONS["rdma"].default == "auto"
    assert OPTIONS["unix_path"].default is None and OPTIONS["disk_size"].default is None
    got = printed()
    assert got["stall_timeout_ms"] == 30000 and got["listen"] == "127.0.0.1:7480"
    assert got["pretouch"] is True and got["shm_staging"] == "64MiB"
    helped = run_gdrkv("serve", "--help")
    assert "(default 30000)" in " ".join(helped.stdout.split()), helped.stdout
    with gdrkv.Server(memory="16MiB", pretouch=None, stall_timeout_ms=None) as server:
        assert server.stats()["pool_bytes"] == 16 << 20
