"""The LMCache plugin (gdrkv.adapters.lmcache) inside the real lmcache 0.5.6,
CPU only: LMCache builds its LocalCPUBackend and RemoteBackend-gdrkv from
its own config the way an engine does, and they talk to real `gdrkv serve`
processes. Chunk keys come from LMCache's own ChunkedTokenDatabase."""
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from support import engines

engines.require("lmcache")

import torch  # noqa: E402
from lmcache.utils import start_loop_in_thread_with_exceptions  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.exceptions import IrrecoverableException  # noqa: E402
from lmcache.v1.memory_management import MemoryFormat  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend import CreateStorageBackends  # noqa: E402
from lmcache.v1.storage_backend.remote_backend import RemoteBackend  # noqa: E402
from lmcache.v1.token_database import ChunkedTokenDatabase  # noqa: E402

from support.content import content  # noqa: E402
from support.etcd import wait_members  # noqa: E402
from support.servers import drain  # noqa: E402
from support.util import unique, wait_for  # noqa: E402
from gdrkv import E_TOO_LARGE, GdrkvError  # noqa: E402
from gdrkv.adapters.lmcache import GdrkvConnectorAdapter  # noqa: E402

CHUNK_TOKENS = 16
LAYERS = 2
BLOCKING_TIMEOUT_S = 2      # LMCache's bound on a remote get, in these tests
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "lmcache"


def plugin_settings(name, url):
    prefix = f"remote_storage_plugin.{name}."
    return {prefix + "module_path": "gdrkv.adapters.lmcache",
            prefix + "class_name": "GdrkvConnectorAdapter",
            prefix + "url": url}


def engine_config(plugins, **overrides):
    """LMCache's config for the plugins {name: url}: the settings of
    configs/lmcache/, with a small CPU buffer and short timeouts."""
    extra = {"save_chunk_meta": False}
    for name, url in plugins.items():
        extra.update(plugin_settings(name, url))
    settings = dict(chunk_size=CHUNK_TOKENS, local_cpu=False, max_local_cpu_size=0.01,
                    remote_serde="naive", remote_storage_plugins=list(plugins),
                    extra_config=extra, save_unfull_chunk=True,
                    blocking_timeout_secs=BLOCKING_TIMEOUT_S)
    settings.update(overrides)
    return LMCacheEngineConfig.from_defaults(**settings)


def engine_metadata(model, world_size=1, worker_id=0, dtype=torch.bfloat16, use_mla=False,
                    layers=LAYERS):
    kv_heads, kv = (1, 1) if use_mla else (4, 2)
    return LMCacheMetadata(model_name=model, world_size=world_size, local_world_size=world_size,
                           worker_id=worker_id, local_worker_id=worker_id, kv_dtype=dtype,
                           kv_shape=(layers, kv, CHUNK_TOKENS, kv_heads, 8), use_mla=use_mla,
                           chunk_size=CHUNK_TOKENS)


def tokens(count):
    """count token ids no other test uses, so chunk hashes never collide."""
    start = uuid.uuid4().int % (1 << 40)
    return list(range(start, start + count))


class Worker:
    """One LMCache worker's storage, as LMCache builds it for an engine."""

    def __init__(self, loop, config, metadata):
        self.config, self.metadata, self.loop = config, metadata, loop
        self.backends = CreateStorageBackends(config, metadata, loop)
        self.local_cpu = self.backends["LocalCPUBackend"]
        self.token_db = ChunkedTokenDatabase(config, metadata)
        self.fmt = MemoryFormat.KV_MLA_FMT if metadata.use_mla else MemoryFormat.KV_2LTD

    def remote(self, plugin="gdrkv"):
        """The RemoteBackend of a plugin, or of remote_url for plugin=None."""
        return self.backends["RemoteBackend" if plugin is None else f"RemoteBackend-{plugin}"]

    def connector(self, plugin="gdrkv"):
        return self.remote(plugin).connection.getWrappedConnector()

    def keys(self, token_ids):
        """[(CacheEngineKey, tokens in its chunk)] for a token sequence."""
        return [(key, end - start)
                for start, end, key in self.token_db.process_tokens(torch.tensor(token_ids))]

    def chunk(self, key, ntokens):
        """A MemoryObj of ntokens holding content determined by the chunk
        hash (so every worker and rank expects the same bytes)."""
        obj = self.local_cpu.allocate(self.metadata.get_shapes(ntokens),
                                      self.metadata.get_dtypes(), self.fmt)
        data = bytearray(content(key.chunk_hash_hex, obj.get_size()))
        obj.raw_data.copy_(torch.frombuffer(data, dtype=torch.uint8))
        return obj

    def store(self, token_ids, plugin="gdrkv"):
        """Writes the chunks of token_ids through RemoteBackend's batched
        put and waits for it; returns their keys."""
        chunks = self.keys(token_ids)
        keys = [key for key, _ in chunks]
        objs = [self.chunk(key, ntokens) for key, ntokens in chunks]
        done = []
        self.remote(plugin).batched_submit_put_task(keys, objs, on_complete_callback=done.append)
        for obj in objs:
            obj.ref_count_down()
        wait_for(lambda: len(done) == len(keys), 10, "puts to complete")
        return chunks

    def run(self, coroutine, timeout=10):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def allocated_bytes(self):
        return self.local_cpu.memory_allocator.pin_allocator.total_allocated_size

    def close(self):
        for backend in reversed(self.backends.values()):
            backend.close()


def check_chunk(obj, key, ntokens, metadata):
    """obj is exactly the chunk stored under key: shape and bytes."""
    assert obj is not None, f"miss for {key}"
    assert obj.meta.shape == metadata.get_shapes(ntokens)[0]
    assert bytes(obj.byte_array) == content(key.chunk_hash_hex, obj.get_size())


@pytest.fixture(scope="module")
def loop():
    """LMCache's storage event loop, on its own thread as in the engine."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=start_loop_in_thread_with_exceptions, args=(loop,),
                              daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


@pytest.fixture
def make_worker(loop):
    """make_worker(url or {plugin: url}, model=..., metadata fields...,
    config=overrides) -> Worker, closed at teardown."""
    workers = []

    def make(plugins, model=None, config=None, **metadata_fields):
        if isinstance(plugins, str):
            plugins = {"gdrkv": plugins}
        metadata = engine_metadata(model or unique("model"), **metadata_fields)
        workers.append(Worker(loop, engine_config(plugins, **(config or {})), metadata))
        return workers[-1]

    yield make
    for worker in workers:
        worker.close()


# ---------------------------------------------------------------- round trips

def test_full_and_partial_chunks_round_trip(server, make_worker):
    worker = make_worker(server.url)
    remote = worker.remote()
    chunks = worker.store(tokens(2 * CHUNK_TOKENS + 5))
    assert [n for _, n in chunks] == [CHUNK_TOKENS, CHUNK_TOKENS, 5]
    keys = [key for key, _ in chunks]

    assert remote.batched_contains(keys) == 3
    assert all(remote.contains(key) for key in keys)
    for key, ntokens in chunks:
        obj = remote.get_blocking(key)
        check_chunk(obj, key, ntokens, worker.metadata)
        obj.ref_count_down()
    objs = remote.batched_get_blocking(keys)
    for obj, (key, ntokens) in zip(objs, chunks):
        check_chunk(obj, key, ntokens, worker.metadata)
        obj.ref_count_down()
    assert worker.allocated_bytes() == 0



def test_lmcache_measures_the_gdrkv_connector(server, make_worker):
    """LMCache wraps every remote connector, plugins included, in its
    InstrumentedRemoteConnector, which feeds its stats monitor (what it
    reports to vLLM and Prometheus): the bytes gdrkv moved show up there."""
    from lmcache.observability import LMCStatsMonitor
    from lmcache.v1.storage_backend.connector.instrumented_connector import (
        InstrumentedRemoteConnector)
    worker = make_worker(server.url)
    assert isinstance(worker.remote().connection, InstrumentedRemoteConnector)
    monitor = LMCStatsMonitor.GetOrCreate()
    written, read = monitor.interval_remote_write_bytes, monitor.interval_remote_read_bytes
    chunks = worker.store(tokens(2 * CHUNK_TOKENS))
    assert monitor.interval_remote_write_bytes > written
    for obj in worker.remote().batched_get_blocking([key for key, _ in chunks]):
        obj.ref_count_down()
    assert monitor.interval_remote_read_bytes > read

def test_lookups_count_the_leading_hits(server, make_worker):
    worker = make_worker(server.url)
    remote = worker.remote()
    token_ids = tokens(4 * CHUNK_TOKENS)
    keys = [key for key, _ in worker.keys(token_ids)]
    worker.store(token_ids[:2 * CHUNK_TOKENS])

    assert remote.batched_contains(keys) == 2
    assert not remote.contains(keys[2])
    assert remote.get_blocking(keys[3]) is None
    objs = remote.batched_get_blocking(keys)
    assert [obj is not None for obj in objs] == [True, True, False, False]
    for obj in objs[:2]:
        obj.ref_count_down()
    assert worker.allocated_bytes() == 0


def test_async_loading_path(server, make_worker):
    worker = make_worker(server.url)
    remote = worker.remote()
    token_ids = tokens(3 * CHUNK_TOKENS)
    chunks = worker.keys(token_ids)
    keys = [key for key, _ in chunks]
    worker.store(token_ids[:CHUNK_TOKENS])
    worker.store(token_ids)     # the first chunk again: stored once, reported fine

    assert worker.run(remote.support_batched_async_contains())
    assert worker.run(remote.batched_async_contains("lookup-1", keys)) == 3
    objs = worker.run(remote.batched_get_non_blocking("lookup-1", keys))
    assert len(objs) == 3
    for obj, (key, ntokens) in zip(objs, chunks):
        check_chunk(obj, key, ntokens, worker.metadata)
        obj.ref_count_down()

    # A miss in the middle: only the chunks before it come back, and the
    # ones read after it are released.
    assert remote.remove(keys[1])
    assert worker.run(remote.batched_async_contains("lookup-2", keys)) == 1
    objs = worker.run(remote.batched_get_non_blocking("lookup-2", keys))
    assert len(objs) == 1
    objs[0].ref_count_down()
    assert worker.allocated_bytes() == 0


def test_connector_operations(server, make_worker):
    worker = make_worker(server.url)
    connector = worker.connector()
    (key, ntokens), = worker.keys(tokens(CHUNK_TOKENS))
    obj = worker.chunk(key, ntokens)
    worker.remote().submit_put_task(key, obj).result(10)     # the one-chunk put
    obj.ref_count_down()
    assert connector.exists_sync(key)
    assert worker.run(connector.exists(key))
    assert worker.run(connector.ping()) == 0
    assert worker.run(connector.list()) == []
    assert connector.remove_sync(key)
    assert not connector.remove_sync(key)
    assert not worker.run(connector.exists(key))


def test_replicas_read_what_one_wrote_through_a_cluster_url(etcd, cluster_name, start_member,
                                                            make_worker):
    """url: gdrkv+etcd://... (#40): the plugin's client finds the members in
    etcd; with replicas=2 each chunk is on both, and a reader of another
    worker reads them byte-exact."""
    servers = [start_member(i) for i in range(2)]
    wait_members(etcd, cluster_name, servers)
    url = etcd.url(cluster_name, "gdrkv+etcd") + "?replicas=2"
    model = unique("model")
    writer = make_worker(url, model=model)
    reader = make_worker(url, model=model)
    chunks = writer.store(tokens(2 * CHUNK_TOKENS + 3))
    keys = [key for key, _ in chunks]
    assert reader.remote().batched_contains(keys) == 3
    for obj, (key, ntokens) in zip(reader.remote().batched_get_blocking(keys), chunks):
        check_chunk(obj, key, ntokens, reader.metadata)
        obj.ref_count_down()
    assert [s.stats()["objects"] for s in servers] == [3, 3]


# ---------------------------------------------------------------- keys

def test_another_replica_reads_what_one_wrote(server, make_worker):
    """DP replicas run the same metadata; nothing of theirs is in the key."""
    model = unique("model")
    writer = make_worker(server.url, model=model)
    reader = make_worker(server.url, model=model)
    token_ids = tokens(CHUNK_TOKENS + 3)
    writer.store(token_ids)
    chunks = reader.keys(token_ids)
    for obj, (key, ntokens) in zip(reader.remote().batched_get_blocking([k for k, _ in chunks]),
                                   chunks):
        check_chunk(obj, key, ntokens, reader.metadata)
        obj.ref_count_down()


@pytest.mark.parametrize("reader", [
    dict(world_size=2, worker_id=1),       # another TP shard
    dict(world_size=2, worker_id=0, dtype=torch.float16),
    dict(world_size=2, worker_id=0, layers=LAYERS + 1),   # same name, other geometry
])
def test_reader_of_other_bytes_misses(server, make_worker, reader):
    model = unique("model")
    writer = make_worker(server.url, model=model, world_size=2, worker_id=0)
    other = make_worker(server.url, model=model, **reader)
    token_ids = tokens(2 * CHUNK_TOKENS)
    writer.store(token_ids)
    keys = [key for key, _ in other.keys(token_ids)]
    assert other.remote().batched_contains(keys) == 0
    assert other.remote().batched_get_blocking(keys) == [None, None]


def test_mla_ranks_read_the_first_rank_chunks(server, make_worker):
    """Under MLA LMCache maps every rank's keys to worker 0 (and only rank 0
    writes): the adapter keys on what LMCache hands it."""
    model = unique("mla")
    rank0 = make_worker(server.url, model=model, world_size=2, worker_id=0, use_mla=True)
    rank1 = make_worker(server.url, model=model, world_size=2, worker_id=1, use_mla=True)
    token_ids = tokens(CHUNK_TOKENS + 7)
    rank0.store(token_ids)
    chunks = rank1.keys(token_ids)
    keys = [key for key, _ in chunks]
    assert {key.worker_id for key in keys} == {1}
    assert rank1.remote().batched_contains(keys) == 2
    for obj, (key, ntokens) in zip(rank1.remote().batched_get_blocking(keys), chunks):
        check_chunk(obj, key, ntokens, rank1.metadata)
        obj.ref_count_down()


def write_chunks(url, model, first_token, count):
    """Run in another process: stores count tokens' chunks through LMCache."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=start_loop_in_thread_with_exceptions, args=(loop,),
                     daemon=True).start()
    worker = Worker(loop, engine_config({"gdrkv": url}), engine_metadata(model))
    worker.store(list(range(first_token, first_token + count)))
    worker.close()


def test_chunks_outlive_the_process_and_hash_seed_that_wrote_them(server, make_worker):
    model, first, count = unique("model"), 12345, 2 * CHUNK_TOKENS + 1
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    writer = subprocess.run([sys.executable, "-c", "import test_lmcache as t; "
                             f"t.write_chunks({server.url!r}, {model!r}, {first}, {count})"],
                            cwd=Path(__file__).parent, env=dict(os.environ, PYTHONHASHSEED=seed),
                            capture_output=True, timeout=120)
    assert writer.returncode == 0, writer.stderr.decode(errors="replace")[-4000:]
    reader = make_worker(server.url, model=model)
    chunks = reader.keys(list(range(first, first + count)))
    for obj, (key, ntokens) in zip(reader.remote().batched_get_blocking([k for k, _ in chunks]),
                                   chunks):
        check_chunk(obj, key, ntokens, reader.metadata)
        obj.ref_count_down()


# ---------------------------------------------------------------- configuration

def test_several_plugin_instances(server_factory, make_worker):
    store_a, store_b = server_factory(), server_factory()
    worker = make_worker({"gdrkv.a": store_a.url, "gdrkv.b": store_b.url})
    token_ids = tokens(2 * CHUNK_TOKENS)
    chunks = worker.store(token_ids, plugin="gdrkv.a")
    keys = [key for key, _ in chunks]
    assert worker.remote("gdrkv.a").batched_contains(keys) == 2
    assert worker.remote("gdrkv.b").batched_contains(keys) == 0
    assert store_a.stats()["objects"] == 2 and store_b.stats()["objects"] == 0

    worker.store(token_ids, plugin="gdrkv.b")
    assert store_b.stats()["objects"] == 2
    for obj, (key, ntokens) in zip(worker.remote("gdrkv.b").batched_get_blocking(keys), chunks):
        check_chunk(obj, key, ntokens, worker.metadata)
        obj.ref_count_down()


def test_authenticated_server(server_factory, make_worker, tmp_path):
    """A server with a token, reached with token_file in the plugin's url:
    LMCache stores and loads through it; without the token it gets nothing
    (the chunks miss) and the server stored nothing for it."""
    token = tmp_path / "token"
    token.write_text("lmcache-test-token-0123456789\n")
    token.chmod(0o600)
    store = server_factory(args=["--auth-token-file", str(token)])
    worker = make_worker(f"{store.url}?token_file={token}")
    chunks = worker.store(tokens(2 * CHUNK_TOKENS))
    keys = [key for key, _ in chunks]
    assert worker.remote().batched_contains(keys) == 2
    for obj, (key, ntokens) in zip(worker.remote().batched_get_blocking(keys), chunks):
        check_chunk(obj, key, ntokens, worker.metadata)
        obj.ref_count_down()
    stranger = make_worker(store.url, model=worker.metadata.model_name)
    assert stranger.remote().batched_contains(keys) == 0
    stranger.store(tokens(CHUNK_TOKENS))
    assert store.stats()["objects"] == 2 and store.stats()["auth_denied"] >= 1


def test_environment_form(server, loop, monkeypatch):
    monkeypatch.setenv("LMCACHE_CHUNK_SIZE", str(CHUNK_TOKENS))
    monkeypatch.setenv("LMCACHE_LOCAL_CPU", "False")
    monkeypatch.setenv("LMCACHE_MAX_LOCAL_CPU_SIZE", "0.01")
    monkeypatch.setenv("LMCACHE_REMOTE_SERDE", "naive")
    monkeypatch.setenv("LMCACHE_REMOTE_STORAGE_PLUGINS", "gdrkv")
    monkeypatch.setenv("LMCACHE_EXTRA_CONFIG", json.dumps(
        {**plugin_settings("gdrkv", server.url), "save_chunk_meta": False}))
    worker = Worker(loop, LMCacheEngineConfig.from_env(), engine_metadata(unique("model")))
    try:
        (key, ntokens), = worker.store(tokens(CHUNK_TOKENS))
        obj = worker.remote().get_blocking(key)
        check_chunk(obj, key, ntokens, worker.metadata)
        obj.ref_count_down()
    finally:
        worker.close()


def test_deprecated_external_url_form(server, loop):
    config = engine_config({}, remote_storage_plugins=None, remote_url=(
        f"external://{server.address}/gdrkv.adapters.lmcache/"
        f"?connector_name=GdrkvConnector&namespace={unique('ns')}"))
    worker = Worker(loop, config, engine_metadata(unique("model")))
    try:
        (key, ntokens), = worker.store(tokens(CHUNK_TOKENS), plugin=None)
        obj = worker.remote(plugin=None).get_blocking(key)
        check_chunk(obj, key, ntokens, worker.metadata)
        obj.ref_count_down()
    finally:
        worker.close()


def test_adapter_answers_only_for_gdrkv_plugins_and_urls():
    adapter = GdrkvConnectorAdapter()
    assert adapter.can_parse("plugin://gdrkv") and adapter.can_parse("plugin://gdrkv.a")
    assert not adapter.can_parse("plugin://gdrkv2") and not adapter.can_parse("plugin://fs")
    assert adapter.can_parse("gdrkv://10.0.0.5:7480")
    assert not adapter.can_parse("redis://10.0.0.5:6379") and not adapter.can_parse("lm://h:1")


def test_a_folder_named_vllm_is_no_vllm(tmp_path, monkeypatch):
    """Without vLLM installed, LMCache hashes only integers: the guard lets
    it start without PYTHONHASHSEED, even with a vllm/ folder on the path
    (the current directory, say), which LMCache cannot use either."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    from gdrkv.adapters.lmcache.chunk_keys import require_deterministic_hashing
    for algorithm in ("builtin", "sha256_cbor"):
        require_deterministic_hashing(algorithm)


def remote_url_config(server, **overrides):
    """configs/lmcache/remote-url.yaml as LMCache reads it, with its url
    pointed at server and the test's small buffer and timeouts."""
    config = LMCacheEngineConfig.from_file(str(CONFIGS / "remote-url.yaml"))
    config.remote_url = f"{server.url}?namespace={unique('ns')}"
    config.max_local_cpu_size = 0.01
    config.chunk_size = CHUNK_TOKENS
    config.blocking_timeout_secs = BLOCKING_TIMEOUT_S
    config.save_unfull_chunk = True
    for name, value in overrides.items():
        setattr(config, name, value)
    return config


def test_remote_url_form_has_one_gdrkv_backend(server, loop):
    """remote_url: gdrkv://... with the plugin declared but given no url:
    LMCache's backends hold the remote_url backend alone (the plugin refuses
    to build a second one, which would accept puts and store nothing), and
    it stores and serves every chunk once."""
    worker = Worker(loop, remote_url_config(server), engine_metadata(unique("model")))
    try:
        assert [name for name in worker.backends if name.startswith("RemoteBackend")] == [
            "RemoteBackend"]
        assert type(worker.connector(plugin=None)).__name__ == "GdrkvConnector"
        puts = server.stats()["puts"]
        chunks = worker.store(tokens(2 * CHUNK_TOKENS + 3), plugin=None)
        assert server.stats()["puts"] == puts + 3
        for key, ntokens in chunks:
            obj = worker.remote(plugin=None).get_blocking(key)
            check_chunk(obj, key, ntokens, worker.metadata)
            obj.ref_count_down()
    finally:
        worker.close()


def basic_check(server, tmp_path, mode, *args, local_cpu=True):
    """LMCache's own check tool, run as its docs say, against server through
    configs/lmcache/remote-url.yaml: its output."""
    config = (CONFIGS / "remote-url.yaml").read_text().replace(
        "gdrkv://10.0.0.5:7480?timeout_ms=2000&token_file=/etc/gdrkv/token",
        f"{server.url}?namespace={unique('ns')}").replace(
        "max_local_cpu_size: 20", "max_local_cpu_size: 1")
    if not local_cpu:
        config = config.replace("local_cpu: true", "local_cpu: false")
    assert server.url in config and ("local_cpu: false" in config) != local_cpu
    path = tmp_path / f"lmcache-{mode}.yaml"
    path.write_text(config)
    done = subprocess.run([sys.executable, "-m", "lmcache.v1.basic_check", "--mode", mode,
                           *args], env=dict(os.environ, LMCACHE_CONFIG_FILE=str(path),
                                            PYTHONHASHSEED="0"),
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    return out


def passed(out, op):
    """The Pass/All column of op's row in basic_check's table."""
    row, = [line for line in out.splitlines() if line.startswith(f"| {op} ")]
    return row.split("|")[5].strip()


def test_basic_check_test_remote_passes(server, tmp_path):
    out = basic_check(server, tmp_path, "test_remote", "--num-keys", "8")
    assert "Validation (content correct): 8/8 passed" in out, out[-4000:]
    for op in ("EXISTS (non-exist)", "PUT", "EXISTS (exist)", "GET"):
        assert passed(out, op) == "8/8", op


def test_basic_check_test_storage_manager(server, tmp_path):
    """LMCache's StorageManager with local_cpu off, every chunk from and to
    gdrkv. basic_check's default objects are 512 tokens where its metadata's
    chunk_size is 256: longer than any chunk LMCache makes, and than the
    buffer a read allocates, so they are refused at put (never stored to be
    unreadable). Objects of one chunk (--obj-size 512) pass."""
    out = basic_check(server, tmp_path, "test_storage_manager", "--num-keys", "8",
                      "--obj-size", "512", local_cpu=False)
    assert "Validation (content correct): 8/8 passed" in out, out[-4000:]
    for op in ("EXISTS (non-exist)", "PUT", "EXISTS (exist)", "GET"):
        assert passed(out, op) == "8/8", op
    objects = server.stats()["objects"]
    out = basic_check(server, tmp_path, "test_storage_manager", "--num-keys", "8",
                      local_cpu=False)
    assert passed(out, "GET") == "0/8" and server.stats()["objects"] == objects


def test_chunks_longer_than_a_chunk_are_refused(server, make_worker):
    worker = make_worker(server.url)
    connector = worker.connector()
    (key, _), (long_key, _) = worker.keys(tokens(CHUNK_TOKENS)) + worker.keys(tokens(CHUNK_TOKENS))
    chunk = worker.chunk(key, CHUNK_TOKENS)
    too_long = worker.local_cpu.allocate(worker.metadata.get_shapes(2 * CHUNK_TOKENS),
                                         worker.metadata.get_dtypes(), worker.fmt)
    with pytest.raises(GdrkvError) as refused:
        worker.run(connector.batched_put([key, long_key], [chunk, too_long]))
    assert refused.value.code == E_TOO_LARGE and "longer than a full chunk" in str(refused.value)
    assert worker.run(connector.exists(key)) and not worker.run(connector.exists(long_key))
    chunk.ref_count_down()
    too_long.ref_count_down()


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_config_examples_load_the_plugin(path, server, loop):
    """Each example, loaded by LMCache, builds a working gdrkv backend per
    plugin (with the example's addresses pointed at the test server)."""
    config = LMCacheEngineConfig.from_file(str(path))
    assert config.remote_serde == "naive"
    assert config.extra_config["save_chunk_meta"] is False
    for plugin in config.remote_storage_plugins:
        settings = plugin_settings(plugin, "")
        if config.remote_url:                   # remote-url.yaml: the plugin has no url
            assert config.remote_url.startswith("gdrkv://"), path.name
            config.remote_url = server.url
            del settings[f"remote_storage_plugin.{plugin}.url"]
        for option in settings:
            assert option in config.extra_config, f"{path.name}: no {option}"
        if not config.remote_url:
            config.extra_config[f"remote_storage_plugin.{plugin}.url"] = server.url
    config.max_local_cpu_size = 0.01
    worker = Worker(loop, config, engine_metadata(unique("model"), use_mla="mla" in path.name))
    try:
        for plugin in ([None] if config.remote_url else config.remote_storage_plugins):
            assert worker.run(worker.connector(plugin).ping()) == 0
    finally:
        worker.close()


@pytest.mark.parametrize("problem, overrides", [
    ("no url", dict(extra_config={k: v for k, v in plugin_settings("gdrkv", "").items()
                                  if not k.endswith(".url")})),
    ("serde", dict(remote_serde="cachegen")),
    ("layerwise", dict(use_layerwise=True)),
    ("bad url", dict(extra_config=plugin_settings("gdrkv", "gdrkv://h:1?colour=red"))),
])
def test_unusable_configuration_is_irrecoverable(problem, overrides, server, loop):
    config = engine_config({"gdrkv": server.url}, **overrides)
    metadata = engine_metadata(unique("model"))
    backends = CreateStorageBackends(config, metadata, loop)
    try:
        assert "RemoteBackend-gdrkv" not in backends
        with pytest.raises(IrrecoverableException, match="gdrkv: "):
            RemoteBackend(config, metadata, loop, backends["LocalCPUBackend"], "cpu", "gdrkv")
    finally:
        backends["LocalCPUBackend"].close()


# With the real vLLM installed, LMCache's chunk hashes depend on
# PYTHONHASHSEED: tests/engines/test_lmcache_vllm.py (vLLM has its own environment).


# ---------------------------------------------------------------- failures

def freeze(server):
    """SIGSTOP, and wait until it has taken effect: the kernel delivers it
    asynchronously, and a request may still be served meanwhile."""
    os.kill(server.proc.pid, signal.SIGSTOP)
    stat = Path(f"/proc/{server.proc.pid}/stat")
    wait_for(lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "T", 5, "SIGSTOP")


LOAD_SLACK_S = 4      # what a loaded 2-core machine may add to a bounded call


@pytest.mark.parametrize("failure", ["killed", "hung"])
def test_server_down_then_back(failure, server_factory, make_worker):
    server = server_factory()
    timeout_ms = 1000
    worker = make_worker(server.url + f"?timeout_ms={timeout_ms}&backoff_max_ms=200")
    remote, connector = worker.remote(), worker.connector()
    keys = [key for key, _ in worker.store(tokens(2 * CHUNK_TOKENS))]
    assert remote.batched_contains(keys) == 2

    if failure == "killed":
        server.kill()
    else:
        freeze(server)
    start = time.monotonic()
    assert remote.batched_contains(keys) == 0
    # LMCache bounds no lookup: on a hung server only timeout_ms ends it.
    assert time.monotonic() - start < timeout_ms / 1000 + LOAD_SLACK_S, \
        "a lookup must not wait past timeout_ms"
    start = time.monotonic()
    assert remote.get_blocking(keys[0]) is None
    assert remote.batched_get_blocking(keys) == [None, None]
    assert worker.run(remote.batched_get_non_blocking("down", keys)) == []
    assert time.monotonic() - start < 3 * BLOCKING_TIMEOUT_S, "gets must end in time"
    assert worker.run(connector.ping()) != 0
    wait_for(lambda: worker.allocated_bytes() == 0, 5, "failed gets to release their chunks")

    if failure == "killed":
        server.restart()
    else:
        os.kill(server.proc.pid, signal.SIGCONT)
    wait_for(lambda: worker.run(connector.ping()) == 0, 10, "ping to see the server back")
    if failure == "killed":         # it came back empty: store something new
        keys = [key for key, _ in worker.store(tokens(CHUNK_TOKENS))]
    assert remote.batched_contains(keys) == len(keys)
    for obj in remote.batched_get_blocking(keys):
        assert obj is not None
        obj.ref_count_down()


def test_full_cpu_buffer_turns_gets_into_misses(server, make_worker):
    # A get waiting for memory would end only at LMCache's blocking timeout:
    # long here, so the bound below tells waiting from not waiting.
    blocking_timeout_s = 60
    worker = make_worker(server.url, config=dict(blocking_timeout_secs=blocking_timeout_s))
    remote = worker.remote()
    keys = [key for key, _ in worker.store(tokens(2 * CHUNK_TOKENS))]
    shapes, dtypes = worker.metadata.get_shapes(), worker.metadata.get_dtypes()
    hoard = list(iter(lambda: worker.local_cpu.allocate(shapes, dtypes, worker.fmt,
                                                        busy_loop=False), None))

    start = time.monotonic()
    assert remote.get_blocking(keys[0]) is None
    assert remote.batched_get_blocking(keys) == [None, None]
    assert worker.run(remote.batched_get_non_blocking("full", keys)) == []
    assert time.monotonic() - start < 3 * LOAD_SLACK_S < blocking_timeout_s, \
        "a full buffer must not make gets wait"

    hoard.pop().ref_count_down()    # room for one chunk: the first one hits
    objs = remote.batched_get_blocking(keys)
    assert objs[0] is not None and objs[1] is None
    objs[0].ref_count_down()
    for obj in hoard:
        obj.ref_count_down()
    assert worker.allocated_bytes() == 0


def test_cancelled_get_keeps_its_chunk_until_the_client_let_go(fake_server, make_worker):
    """LMCache cancels a get after blocking_timeout_secs and moves on; the
    chunk being read into must stay allocated until the client call ended
    (timeout_ms later), or the client would write into memory reused."""
    silent = fake_server(drain)
    worker = make_worker(silent.url + "?timeout_ms=2000", config=dict(blocking_timeout_secs=1))
    (key, _), = worker.keys(tokens(CHUNK_TOKENS))
    start = time.monotonic()
    assert worker.remote().get_blocking(key) is None
    assert worker.allocated_bytes() > 0, "released while the client may still write into it"
    wait_for(lambda: worker.allocated_bytes() == 0, 5, "the cancelled get to release its chunk")
    assert time.monotonic() - start > 1.9


def test_put_returns_only_after_the_client_let_go(fake_server, make_worker):
    """Even a put whose caller gave up returns only once the client call has
    ended: LMCache frees the chunk as soon as put returns."""
    silent = fake_server(drain)
    worker = make_worker(silent.url + "?timeout_ms=1000")
    connector = worker.connector()
    (key, ntokens), = worker.keys(tokens(CHUNK_TOKENS))
    obj = worker.chunk(key, ntokens)

    async def impatient_put():
        await asyncio.wait_for(connector.put(key, obj), 0.1)

    start = time.monotonic()
    with pytest.raises(asyncio.TimeoutError):
        worker.run(impatient_put())
    assert time.monotonic() - start > 0.9
    obj.ref_count_down()
