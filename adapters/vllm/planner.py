"""The scheduler side of the vLLM connector: which prefix of a request the
store holds, and which blocks the workers load and save each step. Works on
vLLM's objects by their attributes only, so it imports no vLLM.

Objects are chunks of blocks_per_key blocks, keyed by the vLLM block hash of
the chunk's last block (a hash chains over every token before it, so it
names the whole prefix). Only full chunks of prompt tokens are stored.

Each KV cache group has objects of its own (a hybrid model's full-attention
and sliding-window layers are separate groups, each with its own blocks).

Lookup: one batch_exists over the chunks past the engine's own prefix hit,
for every group and every shard the deployment writes (each TP rank and PP
stage of MHA; one for MLA). The hit ends where, before it, every chunk of a
full-attention group and the chunks of a sliding-window group that vLLM
keeps below the hit point (its window) have all their shards. A lookup that
fails is a miss. A hit never covers the prompt's last token: vLLM must
compute it to sample the next one.

Loads are asynchronous: the request waits in WAITING_FOR_REMOTE_KVS until
the workers report it. Saves go out in the step whose forward computed their
chunk; a finished request with saves keeps its blocks until the workers
report the saves over (request_finished answers True).

A sliding-window group frees a running request's blocks once they fall out
of the window, and vLLM may hand them to another request at once, while a
save may still be reading them. So with such groups each step's plan names
the blocks its forward and loads write (`written`): the workers let the saves
that read them finish first.
"""
import logging
from dataclasses import dataclass, field

log = logging.getLogger("gdrkv.vllm")


# vLLM's null block: the placeholder of a sliding-window group's blocks that
# fell out of the window. Never read nor written.
NULL_BLOCK = 0


@dataclass
class Group:
    """A KV cache group's objects: the key prefix of each shard a hit needs,
    and for a sliding-window group the tokens below a hit point whose blocks
    vLLM keeps (its num_retained_tokens; None: all of them, full attention)."""
    prefixes: list
    retained: int = None


@dataclass
class Transfer:
    """One request's load or save this step: hashes[i] (hex) names object
    i, of KV cache group groups[i]; block_ids[i] its blocks (-1: a block
    the load must not write, held already by the engine or out of the
    window)."""
    req_id: str
    hashes: list
    block_ids: list
    groups: list


@dataclass
class StepPlan:
    loads: list = field(default_factory=list)
    saves: list = field(default_factory=list)
    preempted: set = field(default_factory=set)
    written: set = field(default_factory=set)   # blocks written this step (windowed groups)


@dataclass
class _Tracked:
    request: object
    block_ids: list         # per group
    chunks_done: int        # chunks saved, or held by the store or the engine already


class Planner:
    """client: a gdrkv.Client for lookups; groups: a Group per KV cache
    group, in vLLM's order; block_size, blocks_per_key; load and save:
    whether this engine reads and writes the store (kv_role)."""

    def __init__(self, client, groups, block_size, blocks_per_key, load=True, save=True):
        self.client = client
        self.groups = list(groups)
        self.windowed = any(g.retained is not None for g in self.groups)
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
        keys = [prefix + h for h in hashes for g in self.groups for prefix in g.prefixes]
        try:
            present = iter(self.client.batch_exists(keys))
        except Exception as e:      # a store that cannot answer is a miss
            log.warning("gdrkv: lookup of request %s failed (%s): a miss", request.request_id, e)
            return 0, False
        # held[c][g]: chunk first + c of group g has every shard.
        held = [[all([next(present) for _ in g.prefixes]) for g in self.groups] for _ in hashes]
        run = 0
        while run < len(hashes) and all(h or g.retained is not None
                                        for h, g in zip(held[run], self.groups)):
            run += 1
        for end in range(first + run, first, -1):
            hit = min(end * self.chunk_tokens, request.num_tokens - 1)
            if hit <= num_computed_tokens:
                break
            if all(held[c - first][i] for i, g in enumerate(self.groups)
                   for c in self._window_chunks(g, hit, first, end)):
                self._hits[request.request_id] = (first, end - first, num_computed_tokens)
                return hit - num_computed_tokens, True
        return 0, False

    def _skipped_blocks(self, group, tokens):
        """Blocks of group below a request's first `tokens` tokens that vLLM
        keeps as null blocks (out of the window)."""
        if group.retained is None:
            return 0
        return max(0, tokens - group.retained) // self.block_size

    def _window_chunks(self, group, hit, first, end):
        """The chunks in [first, end) of a sliding-window group that a hit of
        hit tokens must load: those holding a block in its window."""
        if group.retained is None:
            return range(0)
        return range(max(first, self._skipped_blocks(group, hit) // self.blocks_per_key), end)

    def after_alloc(self, request, block_ids, num_external_tokens):
        """vLLM's update_state_after_alloc; block_ids: the request's blocks,
        a list per KV cache group."""
        self._requests[request.request_id] = request
        hit = self._hits.pop(request.request_id, None)
        if not num_external_tokens or hit is None:
            return
        first, run, local_tokens = hit
        n = self.blocks_per_key
        local_blocks = local_tokens // self.block_size
        hashes = self.chunk_hashes(request, first, first + run)
        load = Transfer(request.request_id, [], [], [])
        for i, group in enumerate(self.groups):
            ids = block_ids[i]
            low = max(local_blocks,
                      self._skipped_blocks(group, local_tokens + num_external_tokens))
            for c in range(first, first + run):
                blocks = [ids[b] if b >= low and ids[b] != NULL_BLOCK else -1
                          for b in range(c * n, (c + 1) * n)]
                if any(b >= 0 for b in blocks):
                    load.hashes.append(hashes[c - first])
                    load.block_ids.append(blocks)
                    load.groups.append(i)
        self._pending_loads[request.request_id] = load

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
        for load in plan.loads:
            self._note_written(load.block_ids, plan)
        for new in out.scheduled_new_reqs:
            # Blocks below its computed tokens are prefix-cache hits: read only.
            self._note_written(new.block_ids, plan, new.num_computed_tokens // self.block_size)
            tracked = self._tracked.get(new.req_id)
            if tracked is not None:
                # Resumed after preemption (vLLM's v2 model runner lists it
                # as new): new blocks; the chunks saved before stay saved.
                tracked.block_ids = [list(ids) for ids in new.block_ids]
            else:
                request = self._requests.pop(new.req_id, None)
                if request is None:
                    continue
                tracked = _Tracked(request, [list(ids) for ids in new.block_ids],
                                   new.num_computed_tokens // self.chunk_tokens)
                self._tracked[new.req_id] = tracked
            self._save_computed(tracked, new.num_computed_tokens
                                + out.num_scheduled_tokens[new.req_id], plan)
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            new_blocks = cached.new_block_ids[i]
            self._note_written(new_blocks, plan)
            tracked = self._tracked.get(req_id)
            if tracked is None:
                continue
            if req_id in cached.resumed_req_ids:
                tracked.block_ids = [list(ids) for ids in new_blocks] if new_blocks else \
                    [[] for _ in self.groups]
            elif new_blocks:
                for ids, more in zip(tracked.block_ids, new_blocks):
                    ids.extend(more)
            self._save_computed(tracked, cached.num_computed_tokens[i]
                                + out.num_scheduled_tokens[req_id], plan)
        return plan

    def _note_written(self, block_ids, plan, first=0):
        """Blocks this step's forward or loads write (lists of block ids from
        index first on, or None; -1 is no block): with windowed groups they
        may be ones a save still reads."""
        if self.windowed and block_ids:
            for ids in block_ids:
                plan.written.update(b for b in ids[first:] if b >= 0)

    def _save_computed(self, tracked, computed_tokens, plan):
        """Saves the full prompt chunks the step's forward computes."""
        if not self.save_enabled:
            return
        request, n = tracked.request, self.blocks_per_key
        blocks_held = min(len(ids) for ids in tracked.block_ids)
        end = min(computed_tokens, request.num_prompt_tokens,
                  blocks_held * self.block_size) // self.chunk_tokens
        end = min(end, len(request.block_hashes) // n)
        if end <= tracked.chunks_done:
            return
        first = tracked.chunks_done
        tracked.chunks_done = end
        hashes = self.chunk_hashes(request, first, end)
        save = Transfer(request.request_id, [], [], [])
        for i, ids in enumerate(tracked.block_ids):
            for c in range(first, end):
                blocks = ids[c * n:(c + 1) * n]
                # A block already out of a window is gone: that object is
                # not saved (a later lookup stops before it).
                if NULL_BLOCK not in blocks:
                    save.hashes.append(hashes[c - first])
                    save.block_ids.append(blocks)
                    save.groups.append(i)
        if save.hashes:
            plan.saves.append(save)
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
