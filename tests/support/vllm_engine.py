"""A vLLM 0.33 engine without a model, in a process of its own, for
tests/engines/test_vllm.py (run with the python of .venv-vllm, never imported by
pytest): vLLM's real Scheduler and KV cache manager, gdrkv's connector
built by vLLM's factory from a --kv-transfer-config, real CPU KV tensors
from vLLM's allocate_kv_cache, and each step's connector calls made by
vLLM's own model-runner mixin, outputs merged by its KVOutputAggregator.

The "model" writes, when a step's forward completes a block, bytes that are
a function of the block's hash, the layer and (for MHA) the TP rank: a
loaded block is right when it holds exactly those bytes. A hybrid scenario
({"window": W}) makes layer 0 full attention and layer 1 a sliding window of
W tokens, two KV cache groups over the same memory (a block id belongs to
one group at a time), as vLLM lays out such models.

    python vllm_engine.py '[{"url": ..., "phases": [...]}, ...]'

runs an engine for each scenario, one after another, and prints one JSON
line: a report per scenario, what each request saw. Importing vLLM takes
a process seconds, an engine starts in far less: tests that need no
restart between two engines run both in one process.
"""
import collections
import hashlib
import json
import os
import signal
import sys
import tempfile
import time

import torch
import vllm
from vllm import SamplingParams
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                         ParallelConfig, SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer import kv_transfer_state
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.forward_context import set_forward_context
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        KVCacheTensor, MLAAttentionSpec, SlidingWindowSpec)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin
from vllm.v1.worker.utils import allocate_kv_cache

import gdrkv

BLOCK = 16
LAYERS = 2
EOS = 2


def model_dir():
    """A folder holding only an OPT config.json: all ModelConfig needs."""
    path = os.path.join(tempfile.gettempdir(), "gdrkv-vllm-opt-2l")
    os.makedirs(path, exist_ok=True)
    # Written aside and renamed: engines of tests running side by side
    # (pytest-xdist) must never read a half-written config.
    part = os.path.join(path, f"config.json.{os.getpid()}")
    with open(part, "w") as f:
        json.dump({"architectures": ["OPTForCausalLM"], "model_type": "opt",
                   "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": LAYERS,
                   "ffn_dim": 128, "max_position_embeddings": 4096, "vocab_size": 1000,
                   "word_embed_proj_dim": 64, "torch_dtype": "bfloat16",
                   "eos_token_id": EOS, "bos_token_id": 1, "pad_token_id": 1}, f)
    os.replace(part, os.path.join(path, "config.json"))
    return path


def make_config(scenario):
    extra = {"url": scenario["url"], "namespace": scenario["namespace"],
             "timeout_ms": scenario.get("timeout_ms", 5000), **scenario.get("extra", {})}
    model = ModelConfig(model=model_dir(), dtype="bfloat16", seed=0, skip_tokenizer_init=True,
                        served_model_name=scenario.get("model", "opt-2l"))
    cache = CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.9, enable_prefix_caching=True,
                        cache_dtype="auto",
                        prefix_caching_hash_algo=scenario.get("hash_algo", "sha256"))
    cache.kv_cache_layout = "LBNHC"
    return VllmConfig(
        model_config=model, cache_config=cache, device_config=DeviceConfig("cpu"),
        scheduler_config=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=scenario.get(
            "batch_tokens", 4096), max_model_len=4096, enable_chunked_prefill=True,
            is_encoder_decoder=False),
        parallel_config=ParallelConfig(tensor_parallel_size=scenario.get("tp", 1),
                                       pipeline_parallel_size=scenario.get("pp", 1),
                                       data_parallel_rank=scenario.get("dp_rank", 0)),
        kv_transfer_config=KVTransferConfig(
            kv_connector=scenario.get("connector", "GdrkvStoreConnector"),
            kv_connector_module_path="gdrkv.adapters.vllm",
            kv_role=scenario.get("role", "kv_both"), kv_connector_extra_config=extra,
            kv_load_failure_policy="recompute"))


def make_kv_cache_config(scenario, layers=range(LAYERS)):
    """The KV cache of the given layers: all for the scheduler, a pipeline
    stage's own for its workers."""
    if scenario.get("mla"):
        spec = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=24,
                                dtype=torch.bfloat16)
    else:
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=8,
                                 dtype=torch.bfloat16)
    blocks = scenario.get("blocks", 128)
    names = [f"model.decoder.layers.{i}.self_attn.attn" for i in layers]
    page = spec.page_size_bytes
    if scenario.get("window"):
        # Layer 0 full, layer 1 sliding: each group's tensor starts at byte
        # 0 of the one allocation, so they alias.
        window = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=2, head_size=8,
                                   dtype=torch.bfloat16, sliding_window=scenario["window"])
        return KVCacheConfig(
            num_blocks=blocks,
            kv_cache_groups=[KVCacheGroupSpec(names[:1], spec), KVCacheGroupSpec(names[1:], window)],
            kv_cache_tensors=[KVCacheTensor(size=page * blocks, layers=[n], layer_stride=page * blocks,
                                            block_stride=page) for n in names])
    # Layer-outermost (LBNHC): each layer's blocks in a region of their own.
    return KVCacheConfig(num_blocks=blocks, kv_cache_groups=[KVCacheGroupSpec(names, spec)],
                         kv_cache_tensors=[KVCacheTensor(size=page * blocks * len(names),
                                                         layers=names, layer_stride=page * blocks,
                                                         block_stride=page)])


def block_bytes(block_hash, layer, rank, nbytes):
    return hashlib.shake_256(bytes(block_hash) + f"/{layer}/{rank}".encode()).digest(nbytes)


class Worker:
    """One rank (TP rank tp of pipeline stage pp): its connector, its KV
    tensors (its stage's layers), its "forward"."""

    def __init__(self, config, scenario, tp, pp):
        pc = config.parallel_config
        pc.rank = pp * pc.tensor_parallel_size + tp
        stage = LAYERS // pc.pipeline_parallel_size
        kv_cache_config = make_kv_cache_config(scenario, range(pp * stage, (pp + 1) * stage))
        self.shard = 0 if scenario.get("mla") else tp
        self.connector = KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER,
                                                             kv_cache_config)
        self.kv = allocate_kv_cache(kv_cache_config, torch.device("cpu"), KVCacheLayout.LBNHC)
        # The layers of each KV cache group, in vLLM's order of groups.
        self.groups = [sorted(g.layer_names) for g in kv_cache_config.kv_cache_groups]
        self.connector.register_kv_caches(self.kv)
        self.config = config
        if scenario.get("slow_saves_s"):
            # A slow store: each save reads its blocks only after this long.
            client, delay = self.connector.client, scenario["slow_saves_s"]
            put = client.batch_put

            def slow_put(*args, **kwargs):
                time.sleep(delay)
                return put(*args, **kwargs)
            client.batch_put = slow_put

    def block(self, layer, block_id):
        """Block block_id of a layer as its bytes in memory order (vLLM's
        layouts permute the dimensions inside a block)."""
        view = self.kv[layer][block_id]
        storage = view.untyped_storage()
        raw = torch.empty(0, dtype=torch.uint8).set_(storage)
        offset = view.data_ptr() - storage.data_ptr()
        return raw[offset:offset + view.numel() * view.element_size()]

    def expected(self, block_hash, layer):
        return block_bytes(block_hash, layer, self.shard, self.block(layer, 0).numel())

    def write_block(self, group, block_id, block_hash):
        for layer in self.groups[group]:
            self.block(layer, block_id).copy_(
                torch.frombuffer(bytearray(self.expected(block_hash, layer)), dtype=torch.uint8))

    def holds(self, group, block_id, block_hash):
        return all(bytes(self.block(layer, block_id).numpy()) == self.expected(block_hash, layer)
                   for layer in self.groups[group])

    def stored_exact(self, request):
        """For each block of request's prompt and each group: whether the
        store holds it as the forward wrote it (None: not stored)."""
        connector, found = self.connector, []
        for g, layers in enumerate(self.groups):
            for block_hash in request.block_hashes:
                raw = connector.client.get(connector.schemes[g].key(block_hash))
                found.append(None if raw is None else raw == b"".join(
                    self.expected(block_hash, layer) for layer in layers))
        return found

    def execute(self, out, requests, block_ids):
        """One step: the connector's calls around the forward, as vLLM's
        model runner makes them."""
        kv_transfer_state._KV_CONNECTOR_AGENT = self.connector
        meta = out.kv_connector_metadata
        self.connector.handle_preemptions(meta)
        with set_forward_context(None, self.config):
            with KVConnectorModelRunnerMixin._get_kv_connector_output(out) as kv_out:
                for req_id, n in out.num_scheduled_tokens.items():
                    request = requests[req_id]
                    # schedule() counted the step's tokens as computed already.
                    start = request.num_computed_tokens - n
                    for b in range(start // BLOCK, (start + n) // BLOCK):
                        for g, ids in enumerate(block_ids[req_id]):
                            if b < len(request.block_hashes) and ids[b]:    # 0: null block
                                self.write_block(g, ids[b], request.block_hashes[b])
        return ModelRunnerOutput(req_ids=[], req_id_to_index={}, sampled_token_ids=[],
                                 logprobs=None, prompt_logprobs_dict={}, pooler_output=None,
                                 kv_connector_output=kv_out)


class Engine:
    def __init__(self, scenario):
        config = make_config(scenario)
        kv_cache_config = make_kv_cache_config(scenario)
        config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(BLOCK, hash_fn)
        self.scheduler = Scheduler(vllm_config=config, kv_cache_config=kv_cache_config,
                                   log_stats=True,
                                   structured_output_manager=StructuredOutputManager(config),
                                   block_size=BLOCK)
        pc = config.parallel_config
        self.workers = [Worker(config, scenario, tp, pp) for pp in range(pc.pipeline_parallel_size)
                        for tp in range(pc.tensor_parallel_size)]
        self.aggregator = KVOutputAggregator(expected_finished_count=len(self.workers))
        self.seen = {}
        self.finished = {}      # req_id -> Request, once it left the scheduler
        self.breaks = None
        self.idle = []
        self.stats = collections.Counter()      # the connector's, as vLLM's logger gets them
        self.preemptions = 0
        connector = self.scheduler.connector
        matched, after_alloc = connector.get_num_new_matched_tokens, \
            connector.update_state_after_alloc

        def record_matched(request, num_computed_tokens):
            result = matched(request, num_computed_tokens)
            self.record(request.request_id)["local_tokens"] = num_computed_tokens
            return result

        def record_alloc(request, blocks, num_external_tokens):
            if num_external_tokens:
                self.record(request.request_id)["external_tokens"] = num_external_tokens
            return after_alloc(request, blocks, num_external_tokens)

        connector.get_num_new_matched_tokens = record_matched
        connector.update_state_after_alloc = record_alloc

    def record(self, req_id):
        return self.seen.setdefault(req_id, {"external_tokens": 0, "local_tokens": 0,
                                             "statuses": [], "prefill_tokens": 0})

    def add(self, req_id, tokens, max_tokens):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        params.update_from_generation_config({}, EOS)
        request = Request(request_id=req_id, prompt_token_ids=list(tokens),
                          sampling_params=params, pooling_params=None, mm_features=None,
                          block_hasher=self.hasher)
        self.scheduler.add_request(request)
        self.record(req_id)

    def step(self):
        sched = self.scheduler
        out = sched.schedule()
        self.preemptions += len(out.preempted_req_ids or ())
        requests = dict(sched.requests)
        block_ids = {r: [list(ids) for ids in sched.kv_cache_manager.get_block_ids(r)]
                     for r in requests if r in out.num_scheduled_tokens}
        for req_id, request in requests.items():
            seen = self.record(req_id)
            status = request.status.name
            if not seen["statuses"] or seen["statuses"][-1] != status:
                seen["statuses"].append(status)
            if req_id in block_ids:
                seen.setdefault("block_ids", block_ids[req_id][0])
                n = out.num_scheduled_tokens[req_id]
                start = request.num_computed_tokens - n
                seen["prefill_tokens"] += max(0, min(start + n, request.num_prompt_tokens) - start)
                self.check_loaded(request, block_ids[req_id])
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS and self.breaks:
                self.break_store(*self.breaks)
                self.breaks = None
        outputs = [w.execute(out, requests, block_ids) for w in self.workers]
        merged = self.aggregator.aggregate(outputs)
        stats = merged.kv_connector_output and merged.kv_connector_output.kv_connector_stats
        if stats:
            self.stats.update(stats.reduce())
        for block in merged.kv_connector_output.invalid_block_ids if \
                merged.kv_connector_output else ():
            for req_id, request in requests.items():
                if any(block in ids for ids in sched.kv_cache_manager.get_block_ids(req_id)):
                    seen = self.record(req_id)
                    seen["load_errors"] = seen.get("load_errors", 0) + 1
        # The sampled tokens: one per request whose prefill is done.
        scheduled = list(out.num_scheduled_tokens)
        merged.req_ids = scheduled
        merged.req_id_to_index = {r: i for i, r in enumerate(scheduled)}
        merged.sampled_token_ids = [
            [7] if requests[r].num_computed_tokens + out.num_scheduled_tokens[r]
            >= requests[r].num_tokens else [] for r in scheduled]
        sched.update_from_output(out, merged)
        for req_id in list(self.seen):
            if req_id not in sched.requests and req_id in requests:
                self.seen[req_id]["statuses"].append(requests[req_id].status.name)
                self.finished[req_id] = requests[req_id]
        return out

    def break_store(self, how, namespace, url, pid):
        """Between a lookup and its load: the objects go, or the server."""
        if how == "clear":
            with gdrkv.Client(url, namespace=namespace) as client:
                client.clear()
        else:
            os.kill(pid, signal.SIGKILL)

    def check_loaded(self, request, block_ids):
        """When first scheduled after a load, before its forward: whether
        the loaded blocks hold what the saving engine wrote, on every rank
        (a sliding-window group: the blocks vLLM did not leave null)."""
        seen = self.seen[request.request_id]
        if seen["external_tokens"] and "loaded_exact" not in seen:
            local = seen["local_tokens"]
            blocks = range(local // BLOCK, -(-(local + seen["external_tokens"]) // BLOCK))
            seen["loaded_blocks"] = [block_ids[0][b] for b in blocks]
            for g, name in enumerate(("loaded_exact", "window_exact")[:len(block_ids)]):
                seen[name] = [all(w.holds(g, block_ids[g][b], request.block_hashes[b])
                                  for w in self.workers) for b in blocks if block_ids[g][b]]

    def run(self, timeout_s=60):
        """Steps until the scheduler holds no request (loads and saves run
        on the connector's threads meanwhile); False if it never does."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.scheduler.has_requests():
                return True
            if not self.step().num_scheduled_tokens:
                time.sleep(0.001)
        return False


def run(scenario):
    """One engine over the scenario's phases: its report."""
    try:
        engine = Engine(scenario)
    except (ValueError, RuntimeError) as e:
        return {"error": str(e)}
    for phase in scenario["phases"]:
        if phase.get("occupy_blocks"):
            # A request holding the first blocks, so this engine's blocks
            # differ from those of the engine that saved.
            engine.add("occupier", list(range(900, 900 + phase["occupy_blocks"] * BLOCK)), 1)
            engine.step()
        if phase.get("drop"):
            # Objects gone from the store: group's objects of these blocks.
            drop = phase["drop"]
            hashes = Request(request_id="drop", prompt_token_ids=drop["tokens"],
                             sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                             mm_features=None, block_hasher=engine.hasher).block_hashes
            for worker in engine.workers:
                scheme = worker.connector.schemes[drop["group"]]
                worker.connector.client.batch_delete([scheme.key(hashes[b])
                                                      for b in drop["blocks"]])
        if phase.get("break_after_lookup"):
            engine.breaks = (phase["break_after_lookup"], scenario["namespace"],
                             scenario["url"], phase.get("server_pid"))
        for req_id, tokens in phase.get("requests", {}).items():
            engine.add(req_id, tokens, phase.get("max_tokens", 2))
        engine.idle.append(engine.run())
    if scenario.get("check_stored"):
        for req_id, request in engine.finished.items():
            engine.seen[req_id]["stored_exact"] = [
                x for w in engine.workers for x in w.stored_exact(request)]
    for worker in engine.workers:
        worker.connector.shutdown()
    return {"requests": engine.seen, "idle": engine.idle, "stats": dict(engine.stats),
            "preemptions": engine.preemptions,
            "free_blocks": engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()}


def main(scenarios):
    reports, version = [], vllm.__version__
    for scenario in scenarios:
        vllm.__version__ = scenario.get("pretend_version", version)
        reports.append(run(scenario))
    print(json.dumps(reports))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
