"""The scheduler side of the vLLM connector: which prefix of a request the
store holds, and which blocks the workers load and save each step. Works on
vLLM's objects by their attributes only, so it imports no vLLM.

Objects are chunks of blocks_per_key blocks, keyed by the vLLM block hash of
the chunk's last block (a hash chains over every token before it, so it
names the whole prefix). Only full chunks of prompt tokens are stored.

Lookup: one batch_exists over the chunks past the engine's own prefix hit,
for every shard the deployment writes (each TP rank and PP stage of MHA; one
for MLA); the hit is the leading run of chunks whose every shard is there.
A lookup that fails is a miss. A hit never covers the prompt's last token:
vLLM must compute it to sample the next one.

Loads are asynchronous: the request waits in WAITING_FOR_REMOTE_KVS until
the workers report it. Saves go out in the step whose forward computed their
chunk; a finished request with saves keeps its blocks until the workers
report the saves over (request_finished answers True).
"""
import logging
from dataclasses import dataclass, field

log = logging.getLogger("gdrkv.vllm")


@dataclass
class Transfer:
    """One request's load or save this step: hashes[i] (hex) names object
    i, block_ids[i] its blocks (-1: a block the load must not write, held
    already by the engine)."""
    req_id: str
    hashes: list
    block_ids: list


@dataclass
class StepPlan:
    loads: list = field(default_factory=list)
    saves: list = field(default_factory=list)
    preempted: set = field(default_factory=set)


@dataclass
class _Tracked:
    request: object
    block_ids: list
    chunks_done: int        # chunks saved, or held by the store or the engine already


class Planner:
    """client: a gdrkv.Client for lookups; shard_prefixes: the key prefix
    of every shard a hit needs; block_size, blocks_per_key; load and save:
    whether this engine reads and writes the store (kv_role)."""

    def __init__(self, client, shard_prefixes, block_size, blocks_per_key, load=True,
                 save=True):
        self.client = client
        self.shard_prefixes = list(shard_prefixes)
        self.block_size, self.blocks_per_key = block_size, blocks_per_key
        self.chunk_tokens = block_size * blocks_per_key
        self.load_enabled, self.save_enabled = load, save
        self._hits = {}             # req_id -> (first chunk, chunks, local tokens)
        self._pending_loads = {}    # req_id -> Transfer
        self._tracked = {}          # req_id -> _Tracked
        self._requests = {}         # req_id -> Request, from alloc to schedule
        self._with_saves = set()

    def chunk_hashes(self, request, first, end):
        """Hex hashes of chunks [first, end) of request."""
        n, hashes = self.blocks_per_key, request.block_hashes
        return [bytes(hashes[(c + 1) * n - 1]).hex() for c in range(first, end)]

    # ------------------------------------------------------------ lookups

    def matched_tokens(self, request, num_computed_tokens):
        """vLLM's get_num_new_matched_tokens: (tokens to load, async)."""
        self._hits.pop(request.request_id, None)
        if not self.load_enabled:
            return 0, False
        first = num_computed_tokens // self.chunk_tokens
        end = len(request.block_hashes) // self.blocks_per_key
        if end <= first:
            return 0, False
        hashes = self.chunk_hashes(request, first, end)
        keys = [prefix + h for h in hashes for prefix in self.shard_prefixes]
        try:
            present = self.client.batch_exists(keys)
        except Exception as e:      # a store that cannot answer is a miss
            log.warning("gdrkv: lookup of request %s failed (%s): a miss", request.request_id, e)
            return 0, False
        shards = len(self.shard_prefixes)
        run = 0
        while run < len(hashes) and all(present[run * shards:(run + 1) * shards]):
            run += 1
        hit = min((first + run) * self.chunk_tokens, request.num_tokens - 1)
        if hit <= num_computed_tokens:
            return 0, False
        self._hits[request.request_id] = (first, run, num_computed_tokens)
        return hit - num_computed_tokens, True

    def after_alloc(self, request, block_ids, num_external_tokens):
        """vLLM's update_state_after_alloc; block_ids: the request's blocks
        (its KV group's list)."""
        self._requests[request.request_id] = request
        hit = self._hits.pop(request.request_id, None)
        if not num_external_tokens or hit is None:
            return
        first, run, local_tokens = hit
        n = self.blocks_per_key
        local_blocks = local_tokens // self.block_size
        blocks = [[block_ids[b] if b >= local_blocks else -1
                   for b in range(c * n, (c + 1) * n)] for c in range(first, first + run)]
        self._pending_loads[request.request_id] = Transfer(
            request.request_id, self.chunk_hashes(request, first, first + run), blocks)

    # ------------------------------------------------------------ each step

    def plan(self, out):
        """vLLM's build_connector_meta, from its SchedulerOutput."""
        plan = StepPlan(preempted=set(out.preempted_req_ids or ()))
        for req_id in out.finished_req_ids:
            self._forget(req_id)
        for req_id in plan.preempted:
            # Its blocks are gone; a resumed request brings new ones.
            self._pending_loads.pop(req_id, None)
        plan.loads = list(self._pending_loads.values())
        self._pending_loads.clear()
        for new in out.scheduled_new_reqs:
            tracked = self._tracked.get(new.req_id)
            if tracked is not None:
                # Resumed after preemption (vLLM's v2 model runner lists it
                # as new): new blocks; the chunks saved before stay saved.
                tracked.block_ids = list(new.block_ids[0])
            else:
                request = self._requests.pop(new.req_id, None)
                if request is None:
                    continue
                tracked = _Tracked(request, list(new.block_ids[0]),
                                   new.num_computed_tokens // self.chunk_tokens)
                self._tracked[new.req_id] = tracked
            self._save_computed(tracked, new.num_computed_tokens
                                + out.num_scheduled_tokens[new.req_id], plan)
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            tracked = self._tracked.get(req_id)
            if tracked is None:
                continue
            new_blocks = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                tracked.block_ids = list(new_blocks[0]) if new_blocks else []
            elif new_blocks:
                tracked.block_ids.extend(new_blocks[0])
            self._save_computed(tracked, cached.num_computed_tokens[i]
                                + out.num_scheduled_tokens[req_id], plan)
        return plan

    def _save_computed(self, tracked, computed_tokens, plan):
        """Saves the full prompt chunks the step's forward computes."""
        if not self.save_enabled:
            return
        request, n = tracked.request, self.blocks_per_key
        end = min(computed_tokens, request.num_prompt_tokens,
                  len(tracked.block_ids) * self.block_size) // self.chunk_tokens
        end = min(end, len(request.block_hashes) // n)
        if end <= tracked.chunks_done:
            return
        first = tracked.chunks_done
        tracked.chunks_done = end
        plan.saves.append(Transfer(request.request_id, self.chunk_hashes(request, first, end),
                                   [tracked.block_ids[c * n:(c + 1) * n]
                                    for c in range(first, end)]))
        self._with_saves.add(request.request_id)

    def finished(self, req_id):
        """vLLM's request_finished: whether the workers still hold its
        blocks for saves (they report it in get_finished)."""
        self._forget(req_id)
        if req_id in self._with_saves:
            self._with_saves.discard(req_id)
            return True
        return False

    def _forget(self, req_id):
        self._hits.pop(req_id, None)
        self._pending_loads.pop(req_id, None)
        self._tracked.pop(req_id, None)
        self._requests.pop(req_id, None)
