"""`gdrkv serve --config FILE` (#19, #39): every flag under its long name
in a TOML file, flags in any form argparse takes winning over it, unknown
keys and wrong kinds of every key refused by name, only a regular file of
bounded size read, and a fuzzer that finds no other way out of the reader;
the example in configs/server loads; a server runs from a file."""
import argparse
import os
import re
import string
import tomllib
import urllib.request

import pytest
from hypothesis import given
from hypothesis import strategies as st
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
    "auth_timeout_ms": 800,
    "max_unauthenticated": 100,
    "max_unauthenticated_per_peer": 9,
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
    "disk_full_policy": "drop",
    "disk_full_wait_ms": 1500,
    "auth_token_file": "/etc/gdrkv/token",
    "insecure_no_auth": True,
    "metrics_listen": "127.0.0.1:0",
    "metrics_token_file": "/etc/gdrkv/metrics-token",
    "metrics_namespaces": 250,
    "cluster": "etcd://10.0.0.1:2379,10.0.0.2:2379/prefix-cache",
    "advertise": "10.0.0.7:7480",
    "zone": "rack-3",
    "cluster_ttl_ms": 3000,
    "cluster_leave_ms": 500,
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
    assert set(printed()) | {"unix_path", "auth_token_file", "metrics_listen", "metrics_token_file",
                             "pool_file", "disk", "disk_size", "cluster", "advertise",
                             "zone"} == set(EVERY)


def test_flags_win_over_the_file(tmp_path):
    path = tmp_path / "gdrkv.toml"
    path.write_text(toml(EVERY))
    got = printed("--config", str(path), "--workers", "5", "--rdma=auto", "--memory", "32MiB")
    assert got == {**EVERY, "workers": 5, "rdma": "auto", "memory": 32 << 20}


@pytest.mark.parametrize("words, workers", [
    (["--workers", "5"], 5), (["--workers=5"], 5), (["--work", "5"], 5), (["--wor=5"], 5),
    (["--no-pre", "--work", "6"], 6),
])
def test_flags_win_in_every_form_argparse_takes(tmp_path, capsys, words, workers):
    """The defect (#39): an abbreviation argparse accepts (--lis) lost to the
    file, whose apply() looked for the flag's full spelling in argv."""
    path = tmp_path / "gdrkv.toml"
    path.write_text(toml({"workers": 3, "pretouch": True, "listen": "127.0.0.1:9"}))
    got = printed_here(capsys, "--config", str(path), *words, "--lis", "127.0.0.1:0")
    assert got["workers"] == workers and got["listen"] == "127.0.0.1:0"
    assert got["pretouch"] is ("--no-pre" not in words)


def printed_here(capsys, *args):
    """--print-config run in this process (cli.main), parsed."""
    assert cli.main(["serve", *args, "--print-config"]) == 0, capsys.readouterr().err
    return tomllib.loads(capsys.readouterr().out)


# A value of a wrong kind for each kind of option, and ones wrong for all.
WRONG = {
    "text": [5, True, ["a"]], "flag": ["yes", 1, [True]], "mode": [1, "sometimes", True],
    "int": ["5", 1.5, True], "int_or_auto": [1.5, "never", False], "size": [1.5, "lots", True],
    "ratio": ["0.5", True, [0.5]],
}
NESTED = [[[[1]]], {"a": {"b": 1}}, [{"a": 1}]]


@pytest.mark.parametrize("key", sorted(OPTIONS))
def test_every_key_of_a_wrong_kind_is_refused_by_name(tmp_path, capsys, key):
    """The defect (#39): `listen = 5` ran (a server "listening" on 5:0, a
    socket named 5 for unix_path = 5); now every key refuses every kind of
    value but its own with the message docs/operations.md describes."""
    path = tmp_path / "gdrkv.toml"
    for value in WRONG[OPTIONS[key].kind] + NESTED:
        path.write_text(f"{key} = {toml_value(value)}\n")
        assert cli.main(["serve", "--config", str(path), "--print-config"]) == 1, (key, value)
        err = capsys.readouterr().err
        assert f"config {path}: {key}" in err and "Traceback" not in err, (key, value, err)


def toml_value(value):
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def test_only_a_regular_file_of_bounded_size_is_read(tmp_path):
    """The defect (#39): a FIFO as the config path blocked the start
    forever (open() waits for a writer); /dev/zero would be read forever."""
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    for path, why in ((fifo, "not a regular file"), ("/dev/zero", "not a regular file"),
                      (tmp_path, "not a regular file")):
        out = run_gdrkv("serve", "--config", str(path), "--print-config", timeout=20)
        assert out.returncode == 1 and f"config {path}: {why}" in out.stderr, out.stderr
    big = tmp_path / "big.toml"
    big.write_text("# padding\n" * (config.MAX_BYTES // 10 + 1))
    with pytest.raises(ValueError, match=f"config {big}: larger than"):
        config.read(str(big))
    with pytest.raises(ValueError, match="No such file"):
        config.read(str(tmp_path / "none.toml"))


@pytest.mark.parametrize("text, why", [
    ("workers = " + "[" * 100000 + "]" * 100000, "nested too deeply"),
    ("workers = " + "{a = " * 100000 + "1" + "}" * 100000, "nested too deeply"),
    ("listen = \"\xff\"", "config"),
])
def test_nesting_and_encoding_errors_are_clean(tmp_path, text, why):
    path = tmp_path / "gdrkv.toml"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError, match=why) as failed:
        config.read(str(path))
    assert str(path) in str(failed.value)


KEYS = st.sampled_from(sorted(OPTIONS) + ["colour", "config", "a.b", "'x y'"])
SCALARS = st.one_of(st.booleans(), st.integers(), st.floats(allow_nan=True),
                    st.text(string.printable, max_size=12))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abc"), inner, max_size=2)),
    max_leaves=8)
LINES = st.one_of(st.tuples(KEYS, VALUES).map(lambda kv: f"{kv[0]} = {toml_value(kv[1])}"),
                  st.text(max_size=40), st.sampled_from(["[table]", "[[array]]", "x =", "= 1"]))


@given(lines=st.lists(LINES, max_size=6))
def test_fuzz_the_reader_raises_only_its_error(tmp_path, lines):
    """TOML-ish text into the reader and apply(): they succeed or raise the
    one documented ValueError, naming the file."""
    path = tmp_path / "fuzz.toml"
    path.write_bytes("\n".join(lines).encode(errors="surrogatepass"))
    parser = argparse.ArgumentParser()
    cli._add_option_flags(parser)
    parser.add_argument("--config")
    args = parser.parse_args(["--config", str(path)])
    try:
        config.apply(parser, args, ["serve", "--config", str(path)])
    except ValueError as e:
        assert str(e).startswith(f"config {path}"), e


@pytest.mark.parametrize("line, message", [
    ('colour = "red"', "unknown key 'colour'"),
    ('pretouch = "no"', "pretouch must be true or false"),
    ('workers = "many"', "workers must be an integer"),
    ('hugepages = "sometimes"', "hugepages must be one of"),
    ('memory = [1]', "memory must be a size"),
    ('listen = 5', "listen must be a string"),
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
