"""Many threads sharing one Client, and many processes sharing one server,
on overlapping keys, over tcp and over shm: every read is a miss or the
exact bytes.

Run as a script (`test_concurrency.py URL NAMESPACE SEED`) it is one of the
worker processes of test_processes_share_a_server."""
import functools
import random
import subprocess
import sys

import pytest

from support import softverbs
from support.content import batch_get_bytes, batch_put_bytes, check_read, content
from support.util import run_threads, stat, unique, wait_for
from gdrkv import errors

pytestmark = pytest.mark.pool_file

SERVER_MEMORY = "128MiB"
KEYS = [f"shared-{i}" for i in range(64)]
OPS = 150


def size_of(key):
    return 1024 * (1 + (int(key.rsplit("-", 1)[1]) * 37) % 256)


def hammer(client, seed, ops=OPS):
    """Random puts, gets and exists over KEYS; returns the keys it put."""
    rng = random.Random(seed)
    put = set()
    for _ in range(ops):
        keys = rng.sample(KEYS, rng.randint(1, 8))
        op = rng.choice(("put", "get", "get", "exists"))
        if op == "put":
            results = batch_put_bytes(client, keys, [content(k, size_of(k)) for k in keys])
            # BUSY: another thread is writing the same key right now, and
            # the store cannot yet promise that write will complete.
            assert all(r in (0, errors.E_BUSY) for r in results), results
            put.update(k for k, r in zip(keys, results) if r == 0)
        elif op == "get":
            results, values = batch_get_bytes(client, keys, [size_of(k) for k in keys])
            for key, result, value in zip(keys, results, values):
                check_read(key, size_of(key), result, value)
        else:
            assert all(client.batch_exists([k for k in keys if k in put]))
    return put


def assert_all_present(client, keys):
    keys = sorted(keys)
    results, values = batch_get_bytes(client, keys, [size_of(k) for k in keys])
    for key, result, value in zip(keys, results, values):
        check_read(key, size_of(key), result, value, allowed_errors=())


def connections_settle(server):
    # Our own STATS connection is the one left.
    wait_for(lambda: stat(server.stats(), "connections_current") <= 1, 10,
             "the server to notice the clients closed their connections")


TRANSPORTS = pytest.mark.parametrize("transport", softverbs.TRANSPORTS)


@TRANSPORTS
def test_threads_share_a_client(server, make_client, transport):
    client = make_client(server.url, namespace=unique("threads"), transport=transport)
    put = set()
    run_threads(*[functools.partial(lambda s: put.update(hammer(client, s)), seed)
                  for seed in range(8)], timeout=120)
    assert_all_present(client, put)
    client.close()
    connections_settle(server)


@TRANSPORTS
def test_processes_share_a_server(server, make_client, transport):
    ns = unique("procs")
    url = f"{server.url}?transport={transport}"
    procs = [subprocess.Popen([sys.executable, __file__, url, ns, str(seed)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for seed in range(4)]
    outputs = [p.communicate(timeout=120)[0].decode(errors="replace") for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out
    put = set().union(*(out.split()[-1].split(",") for out in outputs))
    client = make_client(server.url, namespace=ns)
    assert_all_present(client, put)
    client.close()
    connections_settle(server)


if __name__ == "__main__":
    import gdrkv
    url, namespace, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with gdrkv.Client(url, namespace=namespace) as c:
        print(",".join(sorted(hammer(c, seed + 100))))
