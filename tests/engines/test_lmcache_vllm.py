"""The LMCache plugin with the real vLLM 0.33.0 installed (docs/keys.md):
LMCache then seeds its chunk hash chain from vLLM's NONE_HASH, random in
every process unless PYTHONHASHSEED holds a number.

vLLM's pins clash with SGLang's, so it lives in its own environment,
.venv-vllm (tests/install_vllm_env.sh; tests/run.sh makes it): each test
runs LMCache workers there as fresh processes (tests/support/lmcache_vllm_worker.py)
against a real `gdrkv serve` process."""
from pathlib import Path

import pytest

from support.util import unique
from support.vllm_env import run_vllm_script, vllm_env

WORKER = Path(__file__).resolve().parents[1] / "support" / "lmcache_vllm_worker.py"
CHUNK_TOKENS = 16                 # lmcache_vllm_worker.CHUNK_TOKENS


# Their engines run in the vLLM environment with its own optimised gdrkv
# (support/vllm_env.py): the sanitized pass leaves them out.
pytestmark = pytest.mark.vllm_env


def worker(python, mode, server, model, hashseed, first=5000, count=2 * CHUNK_TOKENS + 3,
           algorithm="builtin"):
    """Runs one LMCache worker process with PYTHONHASHSEED=hashseed (None:
    unset) and LMCache's pre_caching_hash_algorithm, and returns its report."""
    env = vllm_env()
    if hashseed is not None:
        env["PYTHONHASHSEED"] = hashseed
    report = run_vllm_script(python, [WORKER, mode, server.url, model, str(first), str(count),
                                      algorithm], env)
    assert report["vllm"] == "0.33.0"
    return report


@pytest.mark.parametrize("hashseed", [None, "random"])
def test_random_chunk_hashes_refuse_to_start(vllm_python, server, hashseed):
    """Unset or "random": two processes hash the same tokens to other keys,
    and the adapter refuses to start, saying what to set."""
    model = unique("model")
    reports = [worker(vllm_python, "start", server, model, hashseed) for _ in range(2)]
    # Why it must refuse: vLLM gave each process another NONE_HASH.
    assert reports[0]["none_hash"] != reports[1]["none_hash"]
    assert reports[0]["keys"] != reports[1]["keys"]
    for report in reports:
        assert not report["backend"]
        assert "PYTHONHASHSEED" in report["error"]
        assert "export PYTHONHASHSEED=0" in report["error"]


def test_same_hash_seed_shares_chunks_across_processes(vllm_python, server):
    """PYTHONHASHSEED=0 in two processes: the same keys, and the second
    process reads byte-exact what the first stored. Another seed makes other
    keys, which miss instead of reading wrong chunks."""
    model = unique("model")
    chunks = 3
    writer = worker(vllm_python, "write", server, model, "0")
    assert writer["backend"] and writer["none_hash"] != 0       # vLLM's NONE_HASH, not 0
    assert writer["put"] == chunks and writer["stored"] == chunks

    reader = worker(vllm_python, "read", server, model, "0")
    assert reader["none_hash"] == writer["none_hash"]
    assert reader["keys"] == writer["keys"]
    assert reader["contains"] == chunks and reader["hits"] == [True] * chunks

    other = worker(vllm_python, "read", server, model, "1")
    assert other["backend"] and other["none_hash"] != writer["none_hash"]
    assert not set(other["keys"]) & set(writer["keys"])
    assert other["contains"] == 0 and other["hits"] == [False] * chunks


def test_vllm_hashes_share_chunks_without_a_hash_seed(vllm_python, server):
    """sha256_cbor: vLLM seeds NONE_HASH from a fixed string when
    PYTHONHASHSEED is unset, so the adapter starts and a second process
    hits what the first stored."""
    model = unique("model")
    writer = worker(vllm_python, "write", server, model, None, algorithm="sha256_cbor")
    assert writer["backend"] and writer["stored"] == 3
    reader = worker(vllm_python, "read", server, model, None, algorithm="sha256_cbor")
    assert reader["none_hash"] == writer["none_hash"] != 0
    assert reader["keys"] == writer["keys"] and reader["hits"] == [True] * 3


def test_the_guard_follows_vllms_own_seed_rules(vllm_python):
    """Python's hash() needs a numeric PYTHONHASHSEED; vLLM's sha256 hashes
    need none; its xxhash, any seed at all (else vLLM seeds it randomly)."""
    report = run_vllm_script(vllm_python, [WORKER, "guard"], vllm_env())
    passes = {case for case, ok in report["verdicts"].items() if ok}
    assert passes == {"builtin 0", "xxhash random", "xxhash 0",
                      *(f"{sha} {seed}" for sha in ("sha256", "sha256_cbor", "sha256_cbor_64bit")
                        for seed in (None, "random", "0"))}
