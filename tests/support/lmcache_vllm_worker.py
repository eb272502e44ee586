"""One LMCache worker with the real vLLM installed, in a process of its own:
run by tests/engines/test_lmcache_vllm.py with the python of .venv-vllm
(tests/install_vllm_env.sh), never imported by pytest.

    python lmcache_vllm_worker.py start|write|read URL MODEL FIRST_TOKEN COUNT [ALGORITHM]
    python lmcache_vllm_worker.py guard

LMCache builds its LocalCPUBackend and the gdrkv plugin's RemoteBackend
from its own config, as in an engine, and its ChunkedTokenDatabase hashes
tokens FIRST_TOKEN.. (COUNT of them) into chunk keys, seeding the chain
from vLLM's NONE_HASH. Prints one JSON line: the vLLM version, LMCache's
NONE_HASH, whether the gdrkv backend was built (and if not, why: "start"
builds it again to catch the exception LMCache logs and swallows), the
chunk keys, and for "write" the chunks stored, for "read" which chunks came
back byte-exact. ALGORITHM is LMCache's pre_caching_hash_algorithm
(default builtin). "guard" prints, for hash algorithms and PYTHONHASHSEED
values, whether the adapter's determinism guard lets LMCache start.
"""
import asyncio
import hashlib
import json
import sys
import os
import threading

import torch
import vllm
from lmcache.utils import start_loop_in_thread_with_exceptions
from lmcache.v1 import token_database
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.exceptions import IrrecoverableException
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend import CreateStorageBackends
from lmcache.v1.storage_backend.remote_backend import RemoteBackend

from gdrkv.adapters.lmcache.chunk_keys import require_deterministic_hashing

CHUNK_TOKENS = 16
TIMEOUT_S = 30


def content(key, size):
    """The bytes stored for a chunk: a function of its hash, so the reader
    knows what it must get."""
    return hashlib.shake_256(f"{key.chunk_hash_hex}/{size}".encode()).digest(size)


def guard():
    """{"ALGORITHM SEED": whether the guard passes}: vLLM resolves its seed
    from the environment at each call, so one process can ask for all."""
    verdicts = {}
    for algorithm in ("builtin", "sha256", "sha256_cbor", "sha256_cbor_64bit", "xxhash"):
        for seed in (None, "random", "0"):
            if seed is None:
                os.environ.pop("PYTHONHASHSEED", None)
            else:
                os.environ["PYTHONHASHSEED"] = seed
            try:
                require_deterministic_hashing(algorithm)
                verdicts[f"{algorithm} {seed}"] = True
            except IrrecoverableException:
                verdicts[f"{algorithm} {seed}"] = False
    return verdicts


def main(mode, url, model, first, count, algorithm="builtin"):
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK_TOKENS, pre_caching_hash_algorithm=algorithm, local_cpu=False, max_local_cpu_size=0.01, remote_serde="naive",
        remote_storage_plugins=["gdrkv"], save_unfull_chunk=True, blocking_timeout_secs=10,
        extra_config={"remote_storage_plugin.gdrkv.module_path": "gdrkv.adapters.lmcache",
                      "remote_storage_plugin.gdrkv.class_name": "GdrkvConnectorAdapter",
                      "remote_storage_plugin.gdrkv.url": url, "save_chunk_meta": False})
    metadata = LMCacheMetadata(model_name=model, world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=torch.bfloat16,
                               kv_shape=(2, 2, CHUNK_TOKENS, 4, 8), use_mla=False,
                               chunk_size=CHUNK_TOKENS)
    loop = asyncio.new_event_loop()
    threading.Thread(target=start_loop_in_thread_with_exceptions, args=(loop,),
                     daemon=True).start()
    backends = CreateStorageBackends(config, metadata, loop)
    local_cpu = backends["LocalCPUBackend"]
    tokens = torch.tensor(range(first, first + count))
    chunks = [(key, end - start) for start, end, key in
              token_database.ChunkedTokenDatabase(config, metadata).process_tokens(tokens)]
    keys = [key for key, _ in chunks]
    remote = backends.get("RemoteBackend-gdrkv")
    report = {"vllm": vllm.__version__, "none_hash": token_database.NONE_HASH,
              "backend": remote is not None, "keys": [key.to_string() for key in keys]}

    if mode == "start":
        try:
            RemoteBackend(config, metadata, loop, local_cpu, "cpu", "gdrkv").close()
            report["error"] = None
        except IrrecoverableException as e:
            report["error"] = str(e)
    elif mode == "write" and remote is not None:
        objs = []
        for key, ntokens in chunks:
            obj = local_cpu.allocate(metadata.get_shapes(ntokens), metadata.get_dtypes(),
                                     MemoryFormat.KV_2LTD)
            obj.raw_data.copy_(torch.frombuffer(bytearray(content(key, obj.get_size())),
                                                dtype=torch.uint8))
            objs.append(obj)
        done = threading.Semaphore(0)
        remote.batched_submit_put_task(keys, objs, on_complete_callback=lambda _: done.release())
        for obj in objs:
            obj.ref_count_down()
        report["put"] = sum(done.acquire(timeout=TIMEOUT_S) for _ in keys)
        report["stored"] = remote.batched_contains(keys)
    elif mode == "read" and remote is not None:
        report["contains"] = remote.batched_contains(keys)
        hits = []
        for obj in remote.batched_get_blocking(keys):
            hits.append(obj is not None and bytes(obj.byte_array) == content(
                keys[len(hits)], obj.get_size()))
            if obj is not None:
                obj.ref_count_down()
        report["hits"] = hits

    for backend in reversed(backends.values()):
        backend.close()
    print(json.dumps(report))


if __name__ == "__main__":
    if sys.argv[1] == "guard":
        print(json.dumps({"vllm": vllm.__version__, "verdicts": guard()}))
    else:
        main(*sys.argv[1:4], *map(int, sys.argv[4:6]), *sys.argv[6:])
