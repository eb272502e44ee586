"""The C unit, server/client and fuzz tests (tests/native, under ASan and
UBSan), run through their Makefile so `pytest` is the one test command."""
import os
import re
import subprocess

NATIVE_TESTS = os.path.dirname(os.path.abspath(__file__))


def test_native_check():
    assert os.path.exists(os.path.join(NATIVE_TESTS, "Makefile")), "no tests/native/Makefile"
    result = subprocess.run(["make", "-C", NATIVE_TESTS, "check"], capture_output=True, text=True,
                            timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, (f"make check exited {result.returncode}\n"
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
