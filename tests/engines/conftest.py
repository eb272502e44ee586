"""Fixtures of the engine adapters' tests."""
import os

import pytest

from support.util import unique
from support.vllm_env import VLLM_PYTHON


@pytest.fixture
def make_backend(server):
    """make_backend(options=..., **storage config fields) -> gdrkv's SGLang
    HiCache backend on the module's server in this test's namespace, closed
    at teardown (the SGLang tests; imports SGLang on first use)."""
    from support import sglang_pools as sp
    from gdrkv.adapters.sglang_hicache import GdrkvHiCacheStorage

    namespace = unique("ns")
    backends = []

    def make(options=None, **fields):
        extra = sp.extra_config(server.url, namespace=namespace, **(options or {}))
        backends.append(GdrkvHiCacheStorage(sp.storage_config(extra=extra, **fields), {}))
        return backends[-1]

    yield make
    for backend in backends:
        backend.close()


@pytest.fixture(scope="module")
def vllm_python():
    if not VLLM_PYTHON.exists():
        message = f"no vLLM test environment at {VLLM_PYTHON}: run tests/install_vllm_env.sh"
        if os.environ.get("GDRKV_REQUIRE_ENGINES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return str(VLLM_PYTHON)
