"""Every fenced block of README.md, docs/*.md and configs/*/README.md runs,
or is loaded by what consumes it, as written: one test per block, named by
file:line. The rules, for whoever adds a block:

1. Every block has a language tag (test_every_block_has_a_language lists
   those without): sh, python, yaml, toml, json or text.
2. text is prose (file maps, key examples, frame layouts): not run.
3. python runs in a fresh interpreter of the test environment, from the
   repository root, after the substitutions of sh below.
4. sh runs in bash (`set -eo pipefail`: every command must succeed) with
   the test environment's `gdrkv` on PATH, after three substitutions and
   nothing else: 10.x.x.x and 0.0.0.0 become 127.0.0.1, each port after such
   an address (or 127.0.0.1, localhost) a free one (one per port number: the
   same port on two hosts is one server here), and /etc/gdrkv a temporary
   folder. It runs in a copy of the repository root
   whose `.venv` (the one "Try it" makes) is the test environment. The
   commands that can't run to the end here are functions
   (tests/support/snippet_prelude.sh), the snippet's text untouched:
   - `gdrkv serve` starts the real server in the background and returns once
     it listens; it is stopped with SIGTERM when the snippet ends and must
     exit 0;
   - `gdrkv bench` and `gdrkv doctor` (timing runs and hardware probes, for
     the hosts docs/benchmarks.md describes) are checked by gdrkv's parser;
   - `vllm` and `python -m sglang.launch_server` are checked, with the
     environment they would start in, by the engine's own parser (vLLM's
     engine arguments and KVTransferConfig in the vLLM environment, SGLang's
     ServerArgs), then by the gdrkv adapter's own reading of its settings
     and LMCache's loader for LMCACHE_CONFIG_FILE;
   - `bash tests/*.sh` (the CI's scripts) must exist and parse: tests/run.sh
     is the one command CI runs, and it can't run inside itself.
   A snippet naming etcd://HOST:PORT or gdrkv+etcd://HOST:PORT finds a real
   etcd (one member) listening on each such address: the etcd the docs
   assume is there.
   LMCACHE_* variables a snippet leaves set are LMCache's environment form:
   loaded by LMCache and checked as a config file is (but for the
   PYTHONHASHSEED guard, which is the vllm command's).
   A snippet that installs gdrkv (`pip install .`: README's "Try it") runs
   instead as a newcomer runs it, in bash alone, in a fresh copy of the
   repository: tests/tools/test_try_it.py.
   A snippet naming vllm or LMCACHE_ is marked vllm_env (its checks run in
   the vLLM environment, with that environment's gdrkv).
5. yaml, toml and json go to the loader their consumer uses, picked by what
   the block holds (CONSUMERS): Prometheus's `promtool check config` for a
   scrape config, gdrkv's TOML reader for a server config, ...; a block no
   consumer claims fails, naming itself.
"""
import contextlib
import io
import json
import os
import re
import select
import socket
import subprocess
import sys

import pytest

from support import engines
from support.markdown import ROOT, all_blocks
from support.vllm_env import VLLM_PYTHON, vllm_env

LANGS = ("sh", "python", "yaml", "toml", "json", "text")
BLOCKS = all_blocks()
PRELUDE = os.path.join(ROOT, "tests", "support", "snippet_prelude.sh")
VLLM_CHECK = os.path.join(ROOT, "tests", "support", "vllm_snippet_check.py")
SNIPPET_TIMEOUT_S = 300
ADDRESS = re.compile(r"\b(?:10\.\d{1,3}\.\d{1,3}\.\d{1,3}|0\.0\.0\.0|127\.0\.0\.1|localhost)"
                     r"(?::(\d+))?\b")


def test_every_block_has_a_language():
    untagged = [b.where for b in BLOCKS if not b.lang]
    assert not untagged, f"fenced blocks without a language tag ({', '.join(LANGS)}): {untagged}"


def installs_gdrkv(block):
    return block.lang == "sh" and "pip install ." in block.text


def params():
    for block in BLOCKS:
        if block.lang and block.lang != "text" and not installs_gdrkv(block):
            vllm = re.search(r"\bvllm serve\b|\bLMCACHE_", block.text)
            yield pytest.param(block, id=block.where,
                               marks=[pytest.mark.vllm_env] if vllm else [])


@pytest.mark.parametrize("block", list(params()))
def test_snippet(block, tmp_path, vllm_checker):
    assert block.lang in LANGS, \
        f"{block.where}: unknown language {block.lang!r}; use one of {LANGS}"
    if block.lang == "sh":
        run_sh(block, tmp_path, vllm_checker)
    elif block.lang == "python":
        done = subprocess.run([sys.executable, "-c", substitute(block.text, tmp_path)],
                              cwd=ROOT, capture_output=True, text=True, timeout=SNIPPET_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"{block.where}:\n{done.stdout}{done.stderr}"
    else:
        consumers = [check for claims, check in CONSUMERS[block.lang] if claims(block.text)]
        assert consumers, f"{block.where}: no consumer of this {block.lang} block is known " \
                          "(CONSUMERS in tests/tools/test_snippets.py)"
        consumers[0](block, tmp_path)


# ---------------------------------------------------------------- sh

def substitute(text, tmp_path):
    """The three substitutions: addresses, their ports, /etc/gdrkv."""
    ports = {}

    def local(match):
        port = match.group(1)
        if port is None:
            return "127.0.0.1"
        if port not in ports:
            ports[port] = free_port()
        return f"127.0.0.1:{ports[port]}"
    return ADDRESS.sub(local, text).replace("/etc/gdrkv", str(tmp_path / "etc" / "gdrkv"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def repo_copy(tmp_path):
    """The repository root's entries, linked, and a `.venv` that is this
    test environment: where a snippet runs."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in os.listdir(ROOT):
        if not name.startswith((".venv", ".git")):
            (root / name).symlink_to(os.path.join(ROOT, name))
    bindir = root / ".venv" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "python").symlink_to(sys.executable)
    shim = bindir / "gdrkv"
    shim.write_text('#!/usr/bin/env bash\ngdrkv "$@"\n')      # the prelude's function
    shim.chmod(0o755)
    return root


def run_sh(block, tmp_path, vllm_checker):
    out = tmp_path / "out"
    out.mkdir()
    bindir = os.path.dirname(sys.executable)
    real_gdrkv = os.path.join(bindir, "gdrkv")
    if not os.access(real_gdrkv, os.X_OK):     # an environment without console scripts
        bindir = str(tmp_path / "bin")
        real_gdrkv = os.path.join(bindir, "gdrkv")
        os.mkdir(bindir)
        with open(real_gdrkv, "w") as f:
            f.write(f'#!/bin/sh\nexec "{sys.executable}" -m gdrkv "$@"\n')
        os.chmod(real_gdrkv, 0o755)
    script = tmp_path / "snippet.sh"
    text = substitute(block.text, tmp_path)
    # After the snippet: LMCACHE_* variables it set, NUL-separated.
    script.write_text(f"source {PRELUDE}\n{text}\n"
                      'for v in ${!LMCACHE_@}; do printf "%s\\0%s\\0" "$v" "${!v}"; done '
                      '>"$SNIPPET_OUT/lmcache-vars"\n')
    cwd = repo_copy(tmp_path)
    etcds = start_etcds(text, tmp_path)
    env = dict(os.environ, SNIPPET_OUT=str(out), SNIPPET_PYTHON=sys.executable,
               SNIPPET_GDRKV=real_gdrkv, PATH=bindir + os.pathsep + os.environ["PATH"])
    try:
        done = subprocess.run(["bash", str(script)], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=SNIPPET_TIMEOUT_S, stdin=subprocess.DEVNULL)
    finally:
        for member in etcds:
            member.kill()
    logs = "".join(f"\n--- {p.name}\n{p.read_text()}" for p in sorted(out.glob("serve-*.log")))
    assert done.returncode == 0, f"{block.where} exited {done.returncode}:\n{text}\n" \
                                 f"{done.stdout}{done.stderr}{logs}"
    exits = (out / "serve-exits").read_text().split() if (out / "serve-exits").exists() else []
    assert set(exits) <= {"0"}, f"{block.where}: gdrkv serve exited {exits} on SIGTERM{logs}"

    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()] \
        if (out / "records.jsonl").exists() else []
    for record in records:
        check_record(block, record, vllm_checker)
    fields = (out / "lmcache-vars").read_text().split("\0")[:-1]
    lmcache_vars = dict(zip(fields[::2], fields[1::2]))
    if lmcache_vars:
        vllm_checker(block, {"lmcache_env": lmcache_vars, "cwd": str(cwd)})


def start_etcds(text, tmp_path):
    """A real etcd (one member) on each address the snippet's etcd:// and
    gdrkv+etcd:// URLs name, after the substitutions: the etcd the docs
    assume runs there."""
    from support.etcd import EtcdMember, wait_ready
    members = []
    ports = {int(port) for hosts in re.findall(r"etcd://([^/\s\"']+)/", text)
             for port in re.findall(r"127\.0\.0\.1:(\d+)", hosts)}
    for port in sorted(ports):
        name = f"snippet-{port}"
        peer = free_port()
        members.append(EtcdMember(str(tmp_path), name, port, peer,
                                  f"{name}=http://127.0.0.1:{peer}").start())
    wait_ready(members)
    return members


def check_record(block, record, vllm_checker):
    argv, env = record["argv"], record["env"]
    command = argv[0]
    if command == "vllm":
        vllm_checker(block, {"argv": argv[1:], "env": env, "cwd": record["cwd"]})
    elif command == "python":
        check_sglang(block, argv[3:])
    elif command == "gdrkv":
        from gdrkv.cli import make_parser
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            try:
                make_parser().parse_args(argv[1:])
            except SystemExit:
                pytest.fail(f"{block.where}: gdrkv {' '.join(argv[1:])}: "
                            f"{stderr.getvalue()[-1000:]}")
    else:
        assert command == "bash", record
        script = os.path.join(record["cwd"], argv[1])
        assert os.path.isfile(script), f"{block.where}: no {argv[1]}"
        subprocess.run(["bash", "-n", script], check=True)


def check_sglang(block, argv):
    """`python -m sglang.launch_server ARGS`: SGLang's ServerArgs parser, its
    reading of --hicache-storage-backend-extra-config, the class the dynamic
    backend factory would load, and the adapter's reading of its keys."""
    import argparse
    import importlib

    engines.require("sglang")
    engines.torchvision_stand_in()
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.server_args import ServerArgs

    from gdrkv.adapters.sglang_hicache.options import parse_extra_config
    from gdrkv.client import _parse_url, _resolve_options

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{block.where}: sglang.launch_server: {stderr.getvalue()[-1000:]}")
    assert args.hicache_storage_backend == "dynamic", args.hicache_storage_backend
    extra = HybridCacheController.parse_storage_backend_extra_config(
        args.hicache_storage_backend_extra_config)[0]
    module = importlib.import_module(extra["module_path"])
    assert extra["backend_name"] == "gdrkv" and hasattr(module, extra["class_name"]), extra
    options = parse_extra_config(extra)
    assert options.zero_copy, f"{block.where}: no interface_v1: SGLang would copy every page"
    _resolve_options(options.client_options)
    _parse_url(options.url)


@pytest.fixture(scope="module")
def vllm_checker(tmp_path_factory):
    """Checks a vLLM or LMCache record in one long-lived process of the
    vLLM environment (vLLM's imports cost tens of seconds)."""
    state = {}
    log_path = tmp_path_factory.mktemp("vllm-check") / "stderr"

    def check(block, request):
        if not VLLM_PYTHON.exists():
            message = f"no vLLM test environment at {VLLM_PYTHON}: run tests/install_vllm_env.sh"
            if os.environ.get("GDRKV_REQUIRE_ENGINES") == "1":
                pytest.fail(message)
            pytest.skip(message)
        if "proc" not in state:
            with open(log_path, "wb") as log:
                state["proc"] = subprocess.Popen(
                    [str(VLLM_PYTHON), VLLM_CHECK], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=log, text=True, env=vllm_env())
        proc = state["proc"]
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
        # One answer line per request, so nothing is left buffered between
        # them and select() sees each one.
        if not select.select([proc.stdout], [], [], SNIPPET_TIMEOUT_S)[0]:
            proc.kill()
            pytest.fail(f"{block.where}: no answer from the vLLM environment's checker "
                        f"in {SNIPPET_TIMEOUT_S} s:\n{log_path.read_text()[-4000:]}")
        line = proc.stdout.readline()
        assert line, f"{block.where}: the vLLM environment's checker died:\n" \
                     f"{log_path.read_text()[-4000:]}"
        answer = json.loads(line)
        assert answer["error"] is None, f"{block.where}: {answer['checked']}\n{answer['error']}"
        assert answer["checked"], block.where
    yield check
    if "proc" in state:
        state["proc"].stdin.close()
        state["proc"].wait(SNIPPET_TIMEOUT_S)


# ---------------------------------------------------------------- configs

def check_prometheus(block, tmp_path):
    """promtool, after the substitutions; a credentials_file the config
    names is made first (a token, mode 0600), as the operator makes it:
    promtool checks that it exists."""
    text = substitute(block.text, tmp_path)
    for secret in re.findall(r"credentials_file:\s*(\S+)", text):
        os.makedirs(os.path.dirname(secret), exist_ok=True)
        with open(os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(os.urandom(16).hex())
    path = tmp_path / "prometheus.yml"
    path.write_text(text)
    done = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, f"{block.where}:\n{done.stdout}{done.stderr}"


def check_server_toml(block, tmp_path):
    """gdrkv's own reader: `gdrkv serve --config FILE --print-config`."""
    path = tmp_path / "gdrkv.toml"
    path.write_text(block.text)
    done = subprocess.run([sys.executable, "-m", "gdrkv", "serve", "--config", str(path),
                           "--print-config"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{block.where}:\n{done.stderr}"


CONSUMERS = {
    "yaml": [(lambda text: "scrape_configs:" in text, check_prometheus)],
    "toml": [(lambda text: True, check_server_toml)],
    "json": [],
}
