"""Content that is a pure function of its key, so any read can be checked
without remembering what was written, and the batch helpers that move it
through one registered buffer."""
import hashlib

import numpy as np

import gdrkv


def as_key_bytes(key):
    return key.encode() if isinstance(key, str) else bytes(key)


def content(key, size):
    """The bytes a test stores under key: deterministic in (key, size), so a
    wrong object, a stale object or a torn write can never look right."""
    digest = hashlib.blake2b(as_key_bytes(key) + size.to_bytes(8, "little"), digest_size=8)
    return np.random.default_rng(int.from_bytes(digest.digest(), "little")).bytes(size)


def batch_put_bytes(client, keys, values, copies=False):
    """batch_put of in-memory values staged in one registered buffer (with
    copies: batch_put_copies, each key's result the copies written)."""
    staging = np.empty(max(1, sum(len(v) for v in values)), np.uint8)
    base, _ = client.register(staging)
    try:
        ptrs, sizes, off = [], [], 0
        for value in values:
            staging[off:off + len(value)] = np.frombuffer(value, np.uint8)
            ptrs.append(base + off)
            sizes.append(len(value))
            off += len(value)
        put = client.batch_put_copies if copies else client.batch_put
        return put(keys, ptrs, sizes)
    finally:
        client.unregister(base)


def batch_get_bytes(client, keys, capacities):
    """batch_get into a fresh registered buffer: (results, values), where
    values[i] holds the bytes read, or None when results[i] is an error."""
    dest = np.zeros(max(1, sum(capacities)), np.uint8)
    base, _ = client.register(dest)
    try:
        offsets = np.concatenate(([0], np.cumsum(capacities)[:-1])).astype(int).tolist()
        results = client.batch_get(keys, [base + off for off in offsets], list(capacities))
        values = [dest[off:off + r].tobytes() if r >= 0 else None
                  for off, r in zip(offsets, results)]
        return results, values
    finally:
        client.unregister(base)


def check_read(key, size, result, value, allowed_errors=(gdrkv.errors.E_NOT_FOUND,)):
    """A read is either one of the allowed errors or exactly content(key, size)."""
    if result < 0:
        assert result in allowed_errors, (
            f"{key!r}: unexpected error {result} ({gdrkv.errors.strerror(result)})")
        return False
    assert result == size, f"{key!r}: read {result} bytes, stored {size}"
    assert value == content(key, size), f"{key!r}: wrong bytes"
    return True
