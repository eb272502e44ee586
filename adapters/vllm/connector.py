"""GdrkvStoreConnector: vLLM 0.33's KV connector over gdrkv (configs/vllm/README.md).

    --kv-transfer-config '{"kv_connector": "GdrkvStoreConnector",
        "kv_connector_module_path": "gdrkv.adapters.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"url": "gdrkv://10.0.0.5:7480"}}'

The scheduler's instance looks prefixes up and plans loads and saves
(planner.py); each worker's instance moves blocks between its KV tensors and
gdrkv on background threads (mover.py) and reports through get_finished.
Everything here is glue: vLLM's objects in, plans and keys out.
"""
import logging
import os
from dataclasses import dataclass, field

import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec

import gdrkv
from gdrkv.keys import KeyScheme, with_engine_namespace

from .kv_layout import KVLayout
from .mover import KVMover
from .planner import Group, Planner, StepPlan

log = logging.getLogger("gdrkv.vllm")

SUPPORTED_VLLM = "0.33."
DEFAULT_URL = "gdrkv://local"
# Connections per server of a worker's client unless conns is given: a
# save's GPU gather fills one staging frame per connection and the server
# copies each on one worker, so saves scale with connections up to about 8;
# loads do not depend on them (docs/benchmarks.md, "vLLM connector").
WORKER_CONNS = 8
# How long a preempted request's in-flight saves may hold up the step that
# reuses its blocks, in client timeouts (a save is one batch call).
_PREEMPT_WAIT_TIMEOUTS = 2


def check_vllm_version(version=None):
    version = vllm.__version__ if version is None else version
    if not version.startswith(SUPPORTED_VLLM):
        raise RuntimeError(f"gdrkv's vLLM connector is built for vllm {SUPPORTED_VLLM}x, this is "
                           f"vllm {version}: install vllm=={SUPPORTED_VLLM}* or a gdrkv release "
                           "for your vLLM")


@dataclass
class Options:
    url: str
    blocks_per_key: int
    model: str
    client_options: dict = field(default_factory=dict)


def parse_options(vllm_config):
    """url, blocks_per_key and model are the connector's; every other key of
    kv_connector_extra_config is a gdrkv.Client option (namespace, transport,
    timeout_ms, conns, gpu_copy, token_file), which the client validates."""
    extra = dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})
    blocks_per_key = extra.pop("blocks_per_key", 1)
    if isinstance(blocks_per_key, bool) or not isinstance(blocks_per_key, int) \
            or blocks_per_key < 1:
        raise ValueError(f"gdrkv: blocks_per_key must be an int >= 1, not {blocks_per_key!r}")
    model_config = vllm_config.model_config
    model = extra.pop("model", None) or model_config.served_model_name or model_config.model
    if isinstance(model, (list, tuple)):
        model = model[0]
    return Options(url=extra.pop("url", DEFAULT_URL), blocks_per_key=blocks_per_key,
                   model=model, client_options=extra)


def check_hashing(vllm_config, environ=os.environ):
    """Keys are vLLM's block hashes: refuse hashes that change per process."""
    algo = vllm_config.cache_config.prefix_caching_hash_algo
    if algo.startswith("xxhash") and environ.get("PYTHONHASHSEED") is None:
        raise ValueError(f"gdrkv: prefix_caching_hash_algo={algo!r} seeds its block hashes at "
                         "random in every process unless PYTHONHASHSEED is set, so no other "
                         "process (nor this one after a restart) would find what it stores: "
                         "set PYTHONHASHSEED to the same value on every instance, or use sha256")


def kv_groups(kv_cache_config):
    """The KV cache groups this connector stores (full attention or MLA, and
    sliding-window layers beside full attention in a hybrid model), or a
    clear refusal."""
    groups = list(kv_cache_config.kv_cache_groups)
    specs = [type(g.kv_cache_spec).__name__ for g in groups]
    if not groups or not all(isinstance(g.kv_cache_spec, (FullAttentionSpec, SlidingWindowSpec))
                             for g in groups):
        raise ValueError(f"gdrkv's vLLM connector stores full-attention, MLA and sliding-window "
                         f"KV cache groups; this model has {specs}: Mamba, chunked local "
                         "attention and other groups are not supported yet")
    if len(groups) > 1 and any(isinstance(g.kv_cache_spec, MLAAttentionSpec) for g in groups):
        raise ValueError(f"gdrkv's vLLM connector does not store hybrid MLA models yet "
                         f"(KV cache groups {specs})")
    sizes = {g.kv_cache_spec.block_size for g in groups}
    if len(sizes) != 1:
        raise ValueError(f"gdrkv's vLLM connector needs one block size across KV cache groups; "
                         f"this model's are {sorted(sizes)}")
    return groups


def _group_kind(spec):
    """How a hybrid model's group is named in its keys."""
    if isinstance(spec, SlidingWindowSpec):
        return f"sw{spec.sliding_window}"
    return "full"


def kv_dtype(cache_dtype, spec_dtype):
    """The KV element type for keys: the model's where --kv-cache-dtype is
    auto; vLLM's "fp8" is e4m3; fp8 caches live in uint8 tensors, so the
    spec's dtype cannot tell them apart."""
    if cache_dtype == "auto":
        return spec_dtype
    return "fp8_e4m3" if cache_dtype == "fp8" else cache_dtype


def _ranks(vllm_config):
    """(tp, pp, pcp, dcp) rank of this worker: vLLM's process groups, or
    its global rank where they are not set up (tools, tests)."""
    pc = vllm_config.parallel_config
    try:
        from vllm.distributed import parallel_state as ps
        return (ps.get_tensor_model_parallel_rank(), ps.get_pp_group().rank_in_group,
                ps.get_pcp_group().rank_in_group if pc.prefill_context_parallel_size > 1 else 0,
                ps.get_dcp_group().rank_in_group if pc.decode_context_parallel_size > 1 else 0)
    except (AssertionError, AttributeError):
        tp, pcp, pp = (pc.tensor_parallel_size, pc.prefill_context_parallel_size,
                       pc.pipeline_parallel_size)
        r = pc.rank
        return r % tp, (r // (tp * pcp)) % pp, (r // tp) % pcp, \
            (r % tp) % pc.decode_context_parallel_size


@dataclass
class _GroupKeys:
    layout: str             # the key's layout field
    dtype: str
    layers_per_stage: list
    segment_bytes: int      # a block of a layer, no padding
    retained: int           # sliding window: vLLM's num_retained_tokens; else None


class Shards:
    """The deployment's key schemes: one per KV cache group and shard the
    store holds of a chunk (every TP rank, PP stage and context-parallel
    rank whose bytes differ; MLA's TP ranks share one). A hybrid model's
    groups carry their index and kind in the layout field."""

    def __init__(self, vllm_config, groups, options, block_size):
        pc = vllm_config.parallel_config
        self.mla = isinstance(groups[0].kv_cache_spec, MLAAttentionSpec)
        self.sizes = (pc.tensor_parallel_size, pc.pipeline_parallel_size,
                      pc.prefill_context_parallel_size, pc.decode_context_parallel_size)
        layout = vllm_config.cache_config.kv_cache_layout or "LBNHC"
        self.groups = []
        for i, group in enumerate(groups):
            spec = group.kv_cache_spec
            self.groups.append(_GroupKeys(
                layout=layout if len(groups) == 1 else f"{layout}.g{i}.{_group_kind(spec)}",
                dtype=kv_dtype(vllm_config.cache_config.cache_dtype, spec.dtype),
                layers_per_stage=_layers_per_stage(vllm_config, group.layer_names),
                segment_bytes=spec.real_page_size_bytes,
                retained=spec.num_retained_tokens if isinstance(spec, SlidingWindowSpec)
                else None))
        self._common = dict(engine="vllm", model=options.model,
                            page_tokens=block_size * options.blocks_per_key)
        self.blocks_per_key = options.blocks_per_key

    def scheme(self, tp, pp, pcp, dcp, group=0):
        tp_size, pp_size, pcp_size, dcp_size = self.sizes
        g = self.groups[group]
        return KeyScheme(
            **self._common, layout=g.layout, dtype=g.dtype,
            segments=g.layers_per_stage[pp] * self.blocks_per_key,
            segment_bytes=g.segment_bytes,
            tp_rank=None if self.mla else tp, tp_size=None if self.mla else tp_size,
            pp_rank=pp, pp_size=pp_size,
            cp_rank=pcp if pcp_size > 1 else None, cp_size=pcp_size if pcp_size > 1 else None,
            dcp_rank=dcp if self.mla and dcp_size > 1 else None,
            dcp_size=dcp_size if self.mla and dcp_size > 1 else None)

    def all_prefixes(self, group=0):
        tp_size, pp_size, pcp_size, dcp_size = self.sizes
        prefixes = {self.scheme(tp, pp, pcp, tp % dcp_size, group).prefix()
                    for tp in range(tp_size) for pp in range(pp_size) for pcp in range(pcp_size)}
        return sorted(prefixes)

    def lookups(self):
        """The planner's view: per group, its shards' prefixes and window."""
        return [Group(self.all_prefixes(i), g.retained) for i, g in enumerate(self.groups)]

    def writes(self, tp, dcp):
        """Whether a worker writes its shard: MLA's TP ranks hold the same
        bytes (per DCP rank), so only the first of them does."""
        return not self.mla or tp == dcp


def _layers_per_stage(vllm_config, layer_names):
    pp_size = vllm_config.parallel_config.pipeline_parallel_size
    if pp_size == 1:
        return [len(layer_names)]
    from vllm.distributed.utils import get_pp_indices
    from vllm.model_executor.models.utils import extract_layer_index
    total = vllm_config.model_config.get_total_num_hidden_layers()
    indices = [extract_layer_index(n) for n in layer_names]
    counts = []
    for stage in range(pp_size):
        start, end = get_pp_indices(total, stage, pp_size)
        counts.append(sum(start <= i < end for i in indices))
    return counts


@dataclass
class GdrkvConnectorMetadata(KVConnectorMetadata):
    plan: StepPlan


@dataclass
class GdrkvConnectorStats(KVConnectorStats):
    """Keys and bytes loaded and saved, and the keys that failed, since the
    last report, summed over the workers (vLLM logs reduce())."""

    def reset(self):
        self.data = {}

    def aggregate(self, other):
        for name, value in other.data.items():
            self.data[name] = self.data.get(name, 0) + value
        return self

    def reduce(self):
        return dict(self.data)

    def is_empty(self):
        return not any(self.data.values())


class GdrkvStoreConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM's KV connector slot, over gdrkv (kv_role kv_both, kv_producer:
    saves only, kv_consumer: loads only)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        check_vllm_version()
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        if kv_cache_config is None:
            raise ValueError("gdrkv's vLLM connector needs vLLM's kv_cache_config")
        check_hashing(vllm_config)
        self.options = parse_options(vllm_config)
        self.groups = kv_groups(kv_cache_config)
        block_size, _ = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
        self.shards = Shards(vllm_config, self.groups, self.options, block_size)
        role_name = vllm_config.kv_transfer_config.kv_role
        client_options = with_engine_namespace(self.options.url, self.options.client_options,
                                               "vllm", self.options.model)
        if role == KVConnectorRole.WORKER:
            client_options.setdefault("conns", WORKER_CONNS)
        self.client = gdrkv.Client(self.options.url, **client_options)
        self.planner = self.mover = None
        if role == KVConnectorRole.SCHEDULER:
            if vllm_config.kv_transfer_config.kv_load_failure_policy != "recompute":
                log.warning("gdrkv: kv_load_failure_policy is %r: a key that fails to load "
                            "fails its request; 'recompute' recomputes it instead",
                            vllm_config.kv_transfer_config.kv_load_failure_policy)
            self.planner = Planner(self.client, self.shards.lookups(), block_size,
                                   self.options.blocks_per_key,
                                   load=role_name in ("kv_both", "kv_consumer"),
                                   save=role_name in ("kv_both", "kv_producer"))
        else:
            tp, pp, pcp, dcp = _ranks(vllm_config)
            self.schemes = [self.shards.scheme(tp, pp, pcp, dcp, g)
                            for g in range(len(self.groups))]
            self.writer = self.shards.writes(tp, dcp)
            self.num_blocks = kv_cache_config.num_blocks

    # ------------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self.planner.matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        block_ids = blocks.get_block_ids() if num_external_tokens else ()
        self.planner.after_alloc(request, block_ids, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return GdrkvConnectorMetadata(self.planner.plan(scheduler_output))

    def request_finished(self, request, block_ids):
        return self.planner.finished(request.request_id), None

    def request_finished_all_groups(self, request, block_ids):
        return self.planner.finished(request.request_id), None

    # ------------------------------------------------------------ worker side

    def register_kv_caches(self, kv_caches):
        layouts = []
        for group, keys in zip(self.groups, self.shards.groups):
            names = set(group.layer_names)
            layout = KVLayout({n: t for n, t in kv_caches.items() if n in names}, self.num_blocks)
            if layout.segment_bytes != keys.segment_bytes:
                raise ValueError(f"gdrkv: a block of a layer takes {layout.segment_bytes} bytes "
                                 f"in the KV tensors and {keys.segment_bytes} in vLLM's spec")
            layouts.append(layout)
        scratch_ptr = None
        if self.options.blocks_per_key > 1:
            import torch
            nbytes = max(layout.segment_bytes for layout in layouts)
            self._scratch = torch.empty(nbytes, dtype=torch.uint8, device=layouts[0].device)
            scratch_ptr = self._scratch.data_ptr()
            layouts[0].regions.append((scratch_ptr, nbytes))
        self._cuda = layouts[0].device.startswith("cuda")
        self.mover = KVMover(self.client, layouts, scratch_ptr)

    def bind_connector_metadata(self, connector_metadata):
        """The step's plan, before its forward is launched (vLLM starts async
        loads only after it): blocks a sliding window let go that vLLM
        handed out again are written by this forward or a load, so the
        saves still reading them finish first."""
        super().bind_connector_metadata(connector_metadata)
        written = connector_metadata.plan.written
        if self.mover is None or not written:
            return
        timeout = _PREEMPT_WAIT_TIMEOUTS * self.client.timeout_ms / 1000
        if not self.mover.wait_blocks(written, timeout):
            log.warning("gdrkv: saves reading reused blocks still running after %.1f s", timeout)

    def start_load_kv(self, forward_context, **kwargs):
        for load in self._plan().loads:
            self.mover.load(load.req_id, self._keys(load), load.block_ids, load.groups)

    def wait_for_layer_load(self, layer_name):
        return

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return

    def wait_for_save(self):
        saves = self._plan().saves
        if not saves:
            return
        if not self.writer:
            for save in saves:
                self.mover.note_saves(save.req_id)
            return
        ready = self._forward_done() if self._cuda else None
        for save in saves:
            self.mover.save(save.req_id, self._keys(save), save.block_ids, ready, save.groups)

    def handle_preemptions(self, kv_connector_metadata):
        preempted = kv_connector_metadata.plan.preempted
        if preempted and self.mover is not None:
            timeout = _PREEMPT_WAIT_TIMEOUTS * self.client.timeout_ms / 1000
            if not self.mover.wait_saves(preempted, timeout):
                log.warning("gdrkv: saves of preempted requests still running after %.1f s",
                            timeout)

    def get_finished(self, finished_req_ids):
        return self.mover.finished(finished_req_ids)

    def get_block_ids_with_load_errors(self):
        return self.mover.load_errors()

    def get_kv_connector_stats(self):
        counters = self.mover.take_counters() if self.mover is not None else None
        return GdrkvConnectorStats(data=dict(counters)) if counters else None

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return GdrkvConnectorStats(data=dict(data or {}))

    def shutdown(self):
        if self.mover is not None:
            self.mover.close()
            self.mover = None
        self.client.close()

    # ------------------------------------------------------------ helpers

    def _keys(self, transfer):
        return [self.schemes[g].key(h) for h, g in zip(transfer.hashes, transfer.groups)]

    def _plan(self):
        meta = self._get_connector_metadata()
        return meta.plan

    def _forward_done(self):
        """A wait for the work queued so far on the engine's stream (the
        forward that computed the blocks to save)."""
        import torch
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream())
        return event.synchronize
