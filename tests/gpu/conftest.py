"""Fixtures of the GPU tests."""
import pytest

from support.gpu import GPU_WHY


@pytest.fixture(scope="module")
def torch():
    try:
        import torch
    except ImportError:
        pytest.fail(f"a GPU is present ({GPU_WHY}) but torch, which these tests allocate "
                    "GPU memory with, is not installed")
    assert torch.cuda.is_available(), f"gdrkv sees a GPU ({GPU_WHY}) but torch does not"
    return torch
