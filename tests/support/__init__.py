"""What the tests share besides fixtures (those live in the conftest.py
files): servers (servers), content and batch helpers (content), waits,
threads and child processes (util), raw protocol frames (wire), softverbs
(softverbs), the engines' imports and pools (engines, sglang_pools), the vLLM
environment (vllm_env, and the scripts run there: vllm_engine,
lmcache_vllm_worker), a fake /sys (fake_sysfs) and the GPU probe (gpu).

tests/ is on sys.path (pyproject.toml's pythonpath; conftest.py puts it on
PYTHONPATH for children), so a test imports `from support.content import
content`. A script run from here (sglang_pools, vllm_engine,
lmcache_vllm_worker) has this folder first on its sys.path: no module here
may share a name with a package such a script imports."""
