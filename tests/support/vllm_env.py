"""The vLLM environment's side of the tests: its python and how scripts run
there."""
import json
import os
import subprocess
from pathlib import Path

# vLLM pins another transformers than SGLang, so it has a virtual environment
# of its own (tests/install_vllm_env.sh; tests/run.sh makes it): tests run
# scripts there as fresh processes against real `gdrkv serve` processes.
VLLM_PYTHON = Path(os.environ.get("GDRKV_VLLM_PYTHON",
                                  Path(__file__).resolve().parents[2] / ".venv-vllm/bin/python"))


def vllm_env(**extra):
    """The environment of a script in the vLLM environment: CPU, offline, no
    PYTHONHASHSEED unless given. The sanitized pass of tests/run.sh
    instruments .venv-test's gdrkv and softverbs, not that environment's
    gdrkv: neither its runtime nor that softverbs may be loaded there (the
    client picks shm on this host anyway)."""
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1")
    for name in ("PYTHONHASHSEED", "LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS",
                 "GDRKV_IBVERBS_LIB"):
        env.pop(name, None)
    env.update(extra)
    return env


def run_vllm_script(python, args, env, timeout=300):
    """Runs a script of tests/ in the vLLM environment; its last stdout line
    (JSON), decoded."""
    done = subprocess.run([python, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
