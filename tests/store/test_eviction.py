"""A small pool under a write load many times its size: eviction makes room,
a read is a miss or the exact bytes (never wrong ones), and switching
between very different object sizes never wedges the allocator."""
import random

import pytest

from support.content import batch_get_bytes, batch_put_bytes, check_read, content
from support.util import stat

pytestmark = pytest.mark.pool_file

SERVER_MEMORY = "32MiB"
SMALL, LARGE, MULTI_CHUNK = 48 << 10, 1 << 20, (3 << 20) + 5
PHASE_BYTES = 64 << 20          # twice the pool per phase
BATCH_BYTES = 6 << 20
PHASES = [[SMALL], [LARGE], [MULTI_CHUNK], [SMALL], [SMALL, LARGE, MULTI_CHUNK]]


def check_pool(server):
    stats = server.stats()
    assert stat(stats, "pool_used_bytes") <= stat(stats, "pool_bytes")
    return stats


def test_churn_across_sizes(server, client):
    rng = random.Random(7)
    written = []                # (key, size) of every object ever put
    hits = misses = 0
    evictions_before = stat(check_pool(server), "evictions")

    for phase, sizes in enumerate(PHASES):
        phase_bytes = 0
        while phase_bytes < PHASE_BYTES:
            batch, batch_bytes = [], 0
            while batch_bytes < BATCH_BYTES - max(sizes):
                size = rng.choice(sizes)
                batch.append((f"p{phase}-{len(written) + len(batch)}-{size}", size))
                batch_bytes += size
            keys = [k for k, _ in batch]
            results = batch_put_bytes(client, keys, [content(k, s) for k, s in batch])
            assert results == [0] * len(batch), f"phase {phase} ({sizes}): puts failed: {results}"
            written += batch
            phase_bytes += batch_bytes

            # The batch just written is the newest data: it must all be there.
            results, values = batch_get_bytes(client, keys, [s for _, s in batch])
            for (key, size), result, value in zip(batch, results, values):
                assert check_read(key, size, result, value, allowed_errors=()), key

            sample = rng.sample(written, min(32, len(written)))
            results, values = batch_get_bytes(client, [k for k, _ in sample],
                                              [s for _, s in sample])
            for (key, size), result, value in zip(sample, results, values):
                if check_read(key, size, result, value):
                    hits += 1
                else:
                    misses += 1
            check_pool(server)

    stats = check_pool(server)
    assert stat(stats, "evictions") > evictions_before
    assert misses > 0, "several pools' worth of writes evicted nothing"
    assert hits > 0
    # Background eviction may still be running, so the count can only drop.
    present = sum(client.batch_exists([k for k, _ in written]))
    assert 0 < present <= stat(stats, "objects")
