"""Loads and saves of vLLM KV blocks between the engine's KV tensors and
gdrkv, off the forward pass. Imports no vLLM: tested on a GPU machine with
torch tensors alone.

Two threads, one for loads and one for saves, so a burst of saves never
delays a request waiting for its prefix. Each job is one batch call of the
gdrkv client (bounded by its timeout_ms); results are picked up by the
engine's step through finished() and load_errors():

- a load reports its request once every key has been tried; the blocks of a
  key that did not come back whole are load errors (vLLM recomputes them);
- a save counts against its request until its batch_put returns; a
  request's saves are over when finished() has been told the request
  finished and none is left. A failed save is only a future miss. Every
  rank reports a request that had saves, the ranks that write none of its
  shards too (note_saves): vLLM frees its blocks once all ranks did.

A save first waits for `ready` (a CUDA event recorded after the forward that
computed the blocks), so the copies read finished KV without ever queueing
behind, or in front of, the engine's own stream. The blocks a save reads are
known until it returns, so the engine can wait for them (wait_blocks) before
it writes a block vLLM handed out again.

A model with several KV cache groups (full attention and sliding window)
has a KVLayout per group, all over the same tensors; object i of a job is
of group groups[i].
"""
import collections
import logging
import queue
import threading

log = logging.getLogger("gdrkv.vllm")

Job = collections.namedtuple("Job", "req_id keys block_ids groups ready")


class KVMover:
    """client: a gdrkv.Client; layout: a KVLayout (or a list of them, one
    per KV cache group) whose regions are registered with it here;
    scratch_ptr: segment_bytes of registered memory on the layout's device
    for the blocks a load skips (only needed when objects hold several
    blocks)."""

    def __init__(self, client, layout, scratch_ptr=None):
        self.layouts = list(layout) if isinstance(layout, (list, tuple)) else [layout]
        self.client, self.scratch_ptr = client, scratch_ptr
        self._registered = []
        regions = dict(r for lay in self.layouts for r in lay.regions)   # groups share tensors
        for ptr, nbytes in sorted(regions.items()):
            client.register(ptr, nbytes)
            self._registered.append(ptr)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._loaded = set()            # requests whose load finished, not yet reported
        self._errors = set()            # blocks that failed to load, not yet reported
        self._saving = collections.Counter()   # request -> saves not finished
        self._reading = collections.Counter()  # block -> saves not finished that read it
        self._with_saves = set()         # requests that had saves, until reported
        self._finishing = set()          # requests vLLM finished that had saves
        self.counters = collections.Counter()
        self._loads, self._saves = queue.Queue(), queue.Queue()
        self._threads = [threading.Thread(target=self._serve, args=(q, run), daemon=True,
                                          name=f"gdrkv-vllm-{name}")
                         for q, run, name in ((self._loads, self._load, "load"),
                                              (self._saves, self._save, "save"))]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------ the engine's side

    def load(self, req_id, keys, block_ids, groups=None):
        """Reads keys[i] into the blocks block_ids[i] (a list per key) of
        KV cache group groups[i] (default: all the first)."""
        self._loads.put(Job(req_id, keys, block_ids, groups, None))

    def save(self, req_id, keys, block_ids, ready=None, groups=None):
        """Writes the blocks block_ids[i] of group groups[i] under keys[i],
        once ready() returned."""
        with self._lock:
            self._saving[req_id] += 1
            self._with_saves.add(req_id)
            self._reading.update(b for blocks in block_ids for b in blocks if b >= 0)
        self._saves.put(Job(req_id, keys, block_ids, groups, ready))

    def note_saves(self, req_id):
        """req_id had saves that other ranks write."""
        with self._lock:
            self._with_saves.add(req_id)

    def finished(self, finished_req_ids):
        """(requests whose saves are over, requests whose load is over) since
        the last call. finished_req_ids: the requests vLLM finished since the
        last step; those that had saves keep their blocks until reported."""
        with self._lock:
            self._finishing.update(r for r in finished_req_ids if r in self._with_saves)
            saved = {r for r in self._finishing if not self._saving[r]}
            self._finishing -= saved
            self._with_saves -= saved
            for r in saved:
                self._saving.pop(r, None)
            loaded, self._loaded = self._loaded, set()
        return saved, loaded

    def take_counters(self):
        """Keys and bytes loaded and saved (and keys that failed) since the
        last call."""
        with self._lock:
            counters, self.counters = self.counters, collections.Counter()
        return counters

    def load_errors(self):
        """Blocks that failed to load since the last call."""
        with self._lock:
            errors, self._errors = self._errors, set()
        return errors

    def wait_saves(self, req_ids, timeout):
        """Blocks until no save of req_ids is left (their blocks are about
        to be reused) or timeout seconds passed; returns whether they were."""
        with self._idle:
            return self._idle.wait_for(lambda: not any(self._saving[r] for r in req_ids), timeout)

    def wait_blocks(self, blocks, timeout):
        """Blocks until no save reads any of blocks (vLLM handed them out
        again and is about to write them) or timeout seconds passed; returns
        whether none is read any more."""
        with self._idle:
            return self._idle.wait_for(lambda: not any(self._reading[b] for b in blocks), timeout)

    def close(self):
        """Lets the queued jobs finish, stops the threads, unregisters."""
        for q in (self._loads, self._saves):
            q.put(None)
        for t in self._threads:
            t.join()
        for ptr in self._registered:
            self.client.unregister(ptr)
        self._registered = []

    # ------------------------------------------------------------ the threads

    def _serve(self, jobs, run):
        while (job := jobs.get()) is not None:
            try:
                run(job)
            except Exception:       # never let a thread die: the engine would wait forever
                log.exception("gdrkv: %s of request %s failed", run.__name__, job.req_id)

    def _segments(self, job):
        groups = job.groups or [0] * len(job.block_ids)
        layouts = [self.layouts[g] for g in groups]
        ptrs = [lay.segments(blocks, self.scratch_ptr)
                for lay, blocks in zip(layouts, job.block_ids)]
        return ptrs, [[lay.segment_bytes] * len(p) for lay, p in zip(layouts, ptrs)]

    def _load(self, job):
        bad, results = list(range(len(job.keys))), None
        try:
            ptrs, sizes = self._segments(job)
            results = self.client.batch_get(job.keys, ptrs, sizes)
            bad = [i for i, (r, s) in enumerate(zip(results, sizes)) if r != sum(s)]
        finally:
            failed = {b for i in bad for b in job.block_ids[i] if b >= 0}
            with self._lock:
                self._errors |= failed
                self._loaded.add(job.req_id)
                self.counters["load_keys"] += len(job.keys)
                self.counters["load_failed_keys"] += len(bad)
                self.counters["load_bytes"] += sum(r for r in results if r > 0) if results else 0
        if bad:
            log.warning("gdrkv: %d of %d keys of request %s did not load; vLLM recomputes "
                        "their %d blocks", len(bad), len(job.keys), job.req_id, len(failed))

    def _save(self, job):
        failed, stored = len(job.keys), 0
        try:
            if job.ready is not None:
                job.ready()
            ptrs, sizes = self._segments(job)
            results = self.client.batch_put(job.keys, ptrs, sizes)
            failed = sum(r < 0 for r in results)
            stored = sum(sum(s) for r, s in zip(results, sizes) if r == 0)
        finally:
            with self._lock:
                self._saving[job.req_id] -= 1
                self._reading.subtract(b for blocks in job.block_ids for b in blocks if b >= 0)
                self._reading += collections.Counter()      # drops the zeros
                self.counters["save_keys"] += len(job.keys)
                self.counters["save_failed_keys"] += failed
                self.counters["save_bytes"] += stored
                self._idle.notify_all()
        if failed:
            log.warning("gdrkv: %d of %d keys of request %s were not saved (a later miss)",
                        failed, len(job.keys), job.req_id)
