"""The C unit, server/client and fuzz tests (tests/native, under ASan and
UBSan), one pytest item per item of the Makefile's list (each test binary,
test_disk with io_uring off, each fuzzer, the verbs ABI and libFuzzer
checks), so `pytest` is the one test command and a failure names its binary.
Each item builds what it runs; they share one xdist worker (the group), as
the libFuzzer check and fuzz_server build the same binary."""
import os
import re
import subprocess

import pytest

NATIVE_TESTS = os.path.dirname(os.path.abspath(__file__))
ITEM_TIMEOUT_S = 300

pytestmark = [pytest.mark.native, pytest.mark.xdist_group("native")]


def make(*args, timeout=ITEM_TIMEOUT_S):
    return subprocess.run(["make", "-s", "-C", NATIVE_TESTS, *args], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def items():
    """The Makefile's list. A tool that GDRKV_REQUIRE_RDMA or
    GDRKV_REQUIRE_LIBFUZZER asks for and is missing stops make, and so
    collection: such a check never turns into a skip."""
    listed = make("list", timeout=60)
    assert listed.returncode == 0, f"make list exited {listed.returncode}:\n{listed.stderr}"
    # Make's NOTICE lines (a check left out) come first; the list is the last line.
    return listed.stdout.strip().splitlines()[-1].split()


@pytest.mark.parametrize("item", items())
def test_native(item):
    result = make(f"run-{item}")
    assert result.returncode == 0, (f"make run-{item} exited {result.returncode}\n"
                                    f"{result.stdout[-20000:]}\n{result.stderr[-20000:]}")


def test_native_sources_need_no_rdma_core_headers():
    """The verbs ABI is declared in native/common/verbs_abi.h: no source may
    lean on rdma-core's headers, which CI installs only to check that
    declaration (a build on a host without them must still work)."""
    root = os.path.join(NATIVE_TESTS, "..", "..", "native")
    offenders = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name.endswith((".c", ".h", ".cu")):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    if re.search(r"^\s*#\s*include\s*<(infiniband|rdma)/", f.read(), re.M):
                        offenders.append(os.path.relpath(path, root))
    assert not offenders, offenders
