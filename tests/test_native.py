"""The C unit, server/client and fuzz tests (tests/native, under ASan and
UBSan), run through their Makefile so `pytest` is the one test command."""
import os
import subprocess

NATIVE_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native")


def test_native_check():
    assert os.path.exists(os.path.join(NATIVE_TESTS, "Makefile")), "no tests/native/Makefile"
    result = subprocess.run(["make", "-C", NATIVE_TESTS, "check"], capture_output=True, text=True,
                            timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, (f"make check exited {result.returncode}\n"
                                    f"{result.stdout[-20000:]}\n{result.stderr[-20000:]}")
