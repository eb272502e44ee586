"""Imports of optional test dependencies (the engines, torch).

On a developer's machine a missing engine skips its tests; under
tests/run.sh (GDRKV_REQUIRE_ENGINES=1), which installs every engine, a
missing one is a failure, so CI can never pass by skipping the adapters."""
import importlib
import importlib.util
import os
import sys

import pytest

# tests/stand_ins (bench --engines points PYTHONPATH there too).
STAND_INS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "stand_ins")


def require(module, reason="tests/install_engines.sh installs it"):
    if os.environ.get("GDRKV_REQUIRE_ENGINES") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=reason)


def torchvision_stand_in():
    """Puts tests/stand_ins on sys.path when no torchvision is installed:
    SGLang's host pool and controller modules import torchvision at module
    top but never call it (tests/stand_ins/README.md)."""
    if importlib.util.find_spec("torchvision") is None and STAND_INS not in sys.path:
        sys.path.append(STAND_INS)
