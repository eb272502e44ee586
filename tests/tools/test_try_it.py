"""README's "Try it" block, run as a newcomer runs it: bash alone, in a fresh
copy of the repository's tracked files, nothing substituted. It builds
gdrkv into a new virtual environment and runs `gdrkv bench --ceiling`,
which must exit 0 and print a row per size and op with the two ceiling
columns filled in, then the ceilings themselves.

It builds a gdrkv of its own, not the build under test, so the sanitized
pass of tests/run.sh leaves it out (no_asan); it has a file of its own so
that pytest-xdist runs it beside the other snippets (test_snippets.py)."""
import os
import re
import shutil
import subprocess

import pytest

from support.markdown import ROOT, blocks

pytestmark = pytest.mark.no_asan("builds and runs a gdrkv of its own (README's Try it), "
                                    "not the build under test")

# A virtual environment, a build of gdrkv (pip fetches its build
# requirements) and the bench: minutes on a loaded 2-core machine.
TRY_IT_TIMEOUT_S = 1200
OPS = ("put", "get", "exists")


def try_it_block():
    found = [b for b in blocks("README.md") if b.lang == "sh" and "pip install ." in b.text]
    assert len(found) == 1, f"README.md has {len(found)} blocks that install gdrkv, not 1"
    return found[0]


def tracked_copy(dest):
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if os.path.isfile(os.path.join(ROOT, name)):
            os.makedirs(os.path.join(dest, os.path.dirname(name)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, name), os.path.join(dest, name))


def test_try_it_builds_and_benches_as_written(tmp_path):
    block = try_it_block()
    copy = tmp_path / "gdrkv"
    tracked_copy(copy)
    # The newcomer's shell: none of the test environment's venv or preloads.
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "VIRTUAL_ENV",
                        "PYTHONPATH")}
    done = subprocess.run(["bash", "-eo", "pipefail", "-c", block.text], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=TRY_IT_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{block.where}:\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
    check_bench_output(done.stdout)


def check_bench_output(stdout):
    lines = stdout.splitlines()
    header = ["size", "op", "GB/s", "Mkeys/s", "batch", "p50", "ms", "%", "TCP", "ceiling", "%",
              "memcpy"]
    start = next((i for i, line in enumerate(lines) if line.split() == header), None)
    assert start is not None, stdout[-4000:]
    rows = [line.split() for line in lines[start + 1:]
            if line.split()[:1] and re.fullmatch(r"\d+[KMG]iB", line.split()[0])]
    sizes = list(dict.fromkeys(r[0] for r in rows))
    assert sizes and [(r[0], r[1]) for r in rows] == [(s, op) for s in sizes for op in OPS], rows
    for size, op, gbs, mkeys, p50, tcp, mem in rows:
        assert float(mkeys) >= 0 and float(p50) > 0, (size, op)
        if op == "exists":                  # no bytes move: no bandwidth, no ceiling
            assert (gbs, tcp, mem) == ("-", "-", "-")
        else:
            # Figures, not "-" (small ones may round to 0 on a loaded machine).
            assert float(gbs) >= 0 and int(tcp) >= 0 and int(mem) >= 0, (size, op)
    ceilings = re.search(r"loopback TCP stream ([\d.]+) GB/s, memcpy ([\d.]+) GB/s", stdout)
    assert ceilings and all(float(x) > 0 for x in ceilings.groups()), stdout[-4000:]
