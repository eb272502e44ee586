"""The package's layering: the library never pulls in the commands'
packages (bench, doctor, sysinfo), and bench's measuring core imports none
of its siblings. Each check runs in a fresh interpreter, so what another
test imported cannot hide an import."""
import subprocess
import sys

import pytest

LIBRARY = ["gdrkv", "gdrkv.client", "gdrkv.server", "gdrkv.keys", "gdrkv.errors",
           "gdrkv.local", "gdrkv.gpu", "gdrkv.softverbs", "gdrkv.sizes", "gdrkv.table",
           "gdrkv._capi", "gdrkv.cluster.etcd", "gdrkv.cluster.members",
           "gdrkv.cluster.registration", "gdrkv.cluster.watcher", "gdrkv.cluster.status"]
COMMAND_PACKAGES = ("gdrkv.bench", "gdrkv.doctor", "gdrkv.sysinfo")


def loaded_after(module):
    """The gdrkv modules a fresh interpreter holds after importing module."""
    code = (f"import sys, {module}; "
            "print('\\n'.join(m for m in sys.modules if m.startswith('gdrkv')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    return set(done.stdout.split())


@pytest.mark.parametrize("module", LIBRARY)
def test_library_imports_no_command_package(module):
    pulled = sorted(m for m in loaded_after(module) if m.startswith(COMMAND_PACKAGES))
    assert not pulled, f"{module} imports {pulled}"


def test_bench_harness_imports_no_sibling():
    siblings = {m for m in loaded_after("gdrkv.bench.harness") if m.startswith("gdrkv.bench.")}
    assert siblings == {"gdrkv.bench.harness"}, siblings
