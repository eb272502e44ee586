"""Warm restart (#18): a server started with --pool-file keeps its pool in
that file, and the next server on the file serves every object the last one
acknowledged, byte-exact, whether it stopped with SIGTERM or was killed with
SIGKILL, even in the middle of a batch of PUTs; what was being written when
it died is dropped, never served. Over tcp, shm (both write modes) and rdma
(softverbs). A file of another size, or no pool file at all, is refused with
its reason unless reset; a file in use by a live server is refused."""
import json
import mmap
import os
import signal
import time
import uuid

import pytest

import gdrkv
from support import wire
from support.content import batch_get_bytes, batch_put_bytes, check_read, content
from support.util import TESTS_DIR, run_gdrkv, unique, wait_for

POOL = "256MiB"
SIZES = [1, 100, 4096, 65536, (1 << 20) - 300, 1 << 20, 3 * (1 << 20) + 7]


@pytest.fixture
def pool_file():
    """A pool file on tmpfs, removed afterwards."""
    path = f"/dev/shm/gdrkv-test-{uuid.uuid4().hex[:12]}.pool"
    yield path
    if os.path.exists(path):
        os.unlink(path)


def start(server_factory, pool_file, *extra, memory=POOL):
    return server_factory(memory, args=["--pool-file", pool_file, *extra])


def read_all(client, keys, sizes):
    results, values = batch_get_bytes(client, keys, sizes)
    return [check_read(k, n, r, v) for k, n, r, v in zip(keys, sizes, results, values)]


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_acknowledged_objects_survive_a_restart(server_factory, make_client, pool_file, stop):
    server = start(server_factory, pool_file)
    assert server.stats()["pool_file"] == 1
    assert oct(os.stat(pool_file).st_mode & 0o777) == "0o600"
    ns_a, ns_b = unique("a"), unique("b")
    writer_a = make_client(server.url, namespace=ns_a, transport="tcp")
    writer_b = make_client(server.url, namespace=ns_b, transport="tcp")
    keys = [f"page-{i}" for i in range(len(SIZES))]
    assert batch_put_bytes(writer_a, keys, [content(k, n) for k, n in zip(keys, SIZES)]) == \
        [0] * len(SIZES)
    # The same keys in another namespace hold other bytes.
    assert batch_put_bytes(writer_b, keys, [content("b" + k, 4096) for k in keys]) == \
        [0] * len(keys)
    assert writer_a.batch_delete(keys[:1]) == [0]
    writer_a.close()
    writer_b.close()

    if stop == "sigterm":
        assert server.stop() == 0
    else:
        server.kill()
    server.restart()
    stats = server.stats()
    assert stats["restored_objects"] == 2 * len(keys) - 1
    assert stats["restore_dropped"] == 0
    assert stats["namespaces"] == 2

    for transport in ("tcp", "shm"):
        reader = make_client(server.url, namespace=ns_a, transport=transport)
        assert read_all(reader, keys, SIZES) == [False] + [True] * (len(keys) - 1), transport
        other = make_client(server.url, namespace=ns_b, transport=transport)
        results, values = batch_get_bytes(other, keys, [4096] * len(keys))
        assert [v == content("b" + k, 4096) for k, v in zip(keys, values)] == [True] * len(keys)

    # The restarted server goes on: it writes, deletes and evicts as before.
    writer = make_client(server.url, namespace=ns_a)
    assert batch_put_bytes(writer, ["after"], [content("after", 5000)]) == [0]
    assert writer.batch_exists(["after", keys[0], keys[1]]) == [True, False, True]


def flip_byte_of(pool_file, value, where):
    """Changes one byte of value where it lies in the (stopped server's)
    pool file: the byte at where, found by the 64 bytes around it."""
    at = max(0, min(where - 32, len(value) - 64))
    with open(pool_file, "r+b") as f, mmap.mmap(f.fileno(), 0) as pool:
        found = pool.find(value[at:at + 64])
        assert found >= 0 and pool.find(value[at:at + 64], found + 1) < 0
        pool[found + where - at] ^= 0x01


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_a_value_changed_while_the_server_was_down_is_a_miss(server_factory, make_client,
                                                             pool_file, stop):
    """The defect (#39, finding 10): a value byte flipped in the pool file
    while no server ran was served after the restart. Each value's head
    now keeps its checksum, checked on the object's first read: a changed
    value is dropped and read as a miss, over every transport and by get();
    the others read byte-exact."""
    server = start(server_factory, pool_file)
    ns = unique("flip")
    writer = make_client(server.url, namespace=ns, transport="tcp")
    keys = [f"page-{i}" for i in range(len(SIZES))]
    values = [content(k, n) for k, n in zip(keys, SIZES)]
    assert batch_put_bytes(writer, keys, values) == [0] * len(keys)
    writer.close()
    server.stop() if stop == "sigterm" else server.kill()
    changed = {1: 50, 3: 40000, 6: len(values[6]) - 5}     # the last in a later chunk
    for i, where in changed.items():
        flip_byte_of(pool_file, values[i], where)
    server.restart()
    assert server.stats()["restored_objects"] == len(keys)

    kept = [i not in changed for i in range(len(keys))]
    readers = [make_client(server.url, namespace=ns, transport=t) for t in ("shm", "tcp")]
    assert read_all(readers[0], keys[:4], SIZES[:4]) == kept[:4]
    assert read_all(readers[1], keys[4:], SIZES[4:]) == kept[4:]
    assert [readers[1].get(k) for k in keys] == [v if ok else None for v, ok in zip(values, kept)]
    stats = server.stats()
    assert stats["restore_bad_values"] == len(changed)
    assert readers[0].batch_exists(keys) == kept


def test_a_changed_value_never_reaches_the_disk_tier(server_factory, make_client, pool_file,
                                                     tmp_path):
    """With a disk tier under the pool, the demoter writes restored objects
    to disk as the pool fills: one whose value changed while the server was
    down must be checked first, or its disk record would serve the changed
    bytes as good ones. Every key reads byte-exact or misses, never wrong."""
    MiB = 1 << 20
    server = start(server_factory, pool_file, "--disk", str(tmp_path), "--disk-size", "512MiB",
                   memory="64MiB")
    ns = unique("demoted")
    writer = make_client(server.url, namespace=ns, transport="tcp")
    keys = [f"r-{i}" for i in range(24)]
    values = [content(k, MiB) for k in keys]
    for i in range(0, len(keys), 4):
        assert batch_put_bytes(writer, keys[i:i + 4], values[i:i + 4]) == [0] * 4
    writer.close()
    server.kill()
    for i in range(len(keys)):
        flip_byte_of(pool_file, values[i], 1000 + i)
    server.restart()
    assert server.stats()["restored_objects"] == len(keys)

    # Fill the pool well past its size: the demoter takes the restored
    # objects from the cold end.
    flood = make_client(server.url, namespace=unique("flood"), transport="tcp")
    for i in range(0, 96, 2):
        part = [f"f-{i}", f"f-{i + 1}"]
        assert batch_put_bytes(flood, part, [content(k, MiB) for k in part]) == [0, 0]
        wait_for(lambda: (lambda s: s["pool_used_bytes"] <= 0.95 * s["pool_bytes"])(
            server.stats()), 30, "the demoter to keep up")
    assert server.stats()["demotions"] > 0
    reader = make_client(server.url, namespace=ns, transport="tcp", timeout_ms=30000)
    for key in keys:
        results, got = batch_get_bytes(reader, [key], [MiB])
        check_read(key, MiB, results[0], got[0])    # a miss, or exactly its bytes
    assert server.stats()["restore_bad_values"] > 0


# A child that writes batches of 16 objects of 1 MiB (every value made
# beforehand), 10 ms apart so that it can't finish before the parent stops
# the server, and appends "start N" before batch N and "acked N" once it
# returned all zeros, until the server goes away.
WRITER = """
from support.content import content
client = gdrkv.Client(ARGS[0], namespace=ARGS[1], transport=ARGS[2], timeout_ms=2000)
log = open(ARGS[3], "a", buffering=1)
batches, size = int(ARGS[4]), 1 << 20
staging = np.empty(batches * 16 * size, np.uint8)
for batch in range(batches):
    for i in range(16):
        at = (batch * 16 + i) * size
        staging[at:at + size] = np.frombuffer(content(f"b{batch}-{i}", size), np.uint8)
base, _ = client.register(staging)
log.write("ready\\n")
for batch in range(batches):
    keys = [f"b{batch}-{i}" for i in range(16)]
    log.write(f"start {batch}\\n")
    try:
        at = base + batch * 16 * size
        results = client.batch_put(keys, [at + i * size for i in range(16)], [size] * 16)
    except gdrkv.GdrkvError:
        break
    if results != [0] * 16:
        break
    log.write(f"acked {batch}\\n")
    time.sleep(0.01)
"""


@pytest.mark.parametrize("transport, args", [
    ("tcp", []),
    ("shm", []),
    ("shm", ["--single-tenant"]),
    ("rdma", []),
])
def test_sigkill_in_the_middle_of_puts(server_factory, pool_file, tmp_path, transport, args,
                                       make_client):
    """Every batch the writer saw acknowledged is there byte-exact; of the
    batch in flight when the server died, each object is there byte-exact
    or not at all."""
    server = start(server_factory, pool_file, *args, memory="512MiB")
    ns, log = unique("w"), tmp_path / "writer.log"
    log.write_text("")
    batches = 24                        # 384 MiB: nothing is evicted
    writer = python_writer(server.url, ns, transport, log, batches)
    wait_for(lambda: "ready\n" in log.read_text(), 60, "the writer's values")
    # Polled closely: a batch takes a few ms, and the server is frozen as
    # soon as one starts, so the kill mostly lands with a batch in flight.
    deadline = time.monotonic() + 60
    while "start 4\n" not in log.read_text():
        assert time.monotonic() < deadline, "the writer did not reach its fifth batch"
        time.sleep(0.001)
    server.proc.send_signal(signal.SIGSTOP)
    time.sleep(0.05)
    server.kill()
    writer.wait(60)
    lines = log.read_text().split()[1:]
    acked = {int(n) for word, n in zip(lines[::2], lines[1::2]) if word == "acked"}
    started = max(int(n) for word, n in zip(lines[::2], lines[1::2]) if word == "start")
    assert acked and started < batches - 1, "the writer was not cut off mid-run"

    server.restart()
    reader = make_client(server.url, namespace=ns, transport="tcp")
    for batch in range(started + 1):
        keys = [f"b{batch}-{i}" for i in range(16)]
        there = read_all(reader, keys, [1 << 20] * 16)
        if batch in acked:
            assert there == [True] * 16, f"batch {batch} was acknowledged"
    assert reader.batch_exists([f"b{started + 1}-0"]) == [False]
    stats = server.stats()
    assert stats["restored_objects"] >= 16 * len(acked)
    print(f"{transport} {args}: {len(acked)} batches acked, restored "
          f"{stats['restored_objects']} objects, dropped {stats['restore_dropped']} in flight")


def python_writer(url, ns, transport, log, batches):
    import subprocess
    import sys
    from support.util import CHILD_PRELUDE
    return subprocess.Popen([sys.executable, "-c", CHILD_PRELUDE + WRITER,
                             TESTS_DIR, url, ns, transport, str(log),
                             str(batches)], stdin=subprocess.DEVNULL)


def test_local_clients_get_the_file_read_only(server_factory, pool_file):
    """What an shm client is handed instead of a sealed memfd: the pool
    file, read-only, private to the server's user, and no larger mapping
    or truncation through that descriptor."""
    server = start(server_factory, pool_file, memory="64MiB")
    with wire.connect_unix(server.unix_path) as conn:
        hdr, results, fd = wire.hello(conn)
    assert hdr.status == 0 and fd is not None
    try:
        (status, size), = results
        st = os.fstat(fd)
        assert status == 0 and size == 64 << 20 and st.st_size >= size
        assert (st.st_ino, st.st_uid, st.st_mode & 0o777) == \
            (os.stat(pool_file).st_ino, os.geteuid(), 0o600)
        mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ).close()
        with pytest.raises(PermissionError):
            mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        with pytest.raises(OSError):
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
    assert os.stat(pool_file).st_size > 64 << 20


def test_the_file_is_checked_before_it_is_used(server_factory, pool_file, make_client):
    server = start(server_factory, pool_file, memory="64MiB")
    client = make_client(server.url, namespace=unique("ns"))
    assert batch_put_bytes(client, ["k"], [b"v" * 100]) == [0]

    # In use by a live server.
    out = run_gdrkv("serve", "--listen", "127.0.0.1:0", "--memory", "64MiB", "--no-pretouch",
                    "--pool-file", pool_file, timeout=30)
    assert out.returncode == 1 and "another gdrkv server is using it" in out.stderr, out.stderr
    assert server.stop() == 0

    # Another size: refused, the file untouched; reset starts it empty.
    out = run_gdrkv("serve", "--listen", "127.0.0.1:0", "--memory", "128MiB", "--no-pretouch",
                    "--pool-file", pool_file, timeout=30)
    assert out.returncode == 1 and pool_file in out.stderr and "reset" in out.stderr, out.stderr
    server.restart()
    assert server.stats()["restored_objects"] == 1
    assert server.stop() == 0
    fresh = start(server_factory, pool_file, "--reset-pool-file", memory="128MiB")
    assert fresh.stats()["restored_objects"] == 0 and fresh.stats()["objects"] == 0
    assert fresh.stop() == 0

    # Not a pool file at all.
    with open(pool_file, "r+b") as f:
        f.seek(128 << 20)
        f.write(b"garbage!")
    out = run_gdrkv("serve", "--listen", "127.0.0.1:0", "--memory", "128MiB", "--no-pretouch",
                    "--pool-file", pool_file, timeout=30)
    assert out.returncode == 1 and "not a gdrkv pool file" in out.stderr, out.stderr

    # Readable by others.
    os.chmod(pool_file, 0o644)
    out = run_gdrkv("serve", "--listen", "127.0.0.1:0", "--memory", "128MiB", "--no-pretouch",
                    "--pool-file", pool_file, "--reset-pool-file", timeout=30)
    assert out.returncode == 1 and "chmod 600" in out.stderr, out.stderr

    # reset without a file.
    with pytest.raises(ValueError, match="needs a pool_file"):
        gdrkv.Server(memory="16MiB", reset_pool_file=True)


def test_in_process_server_on_a_pool_file(pool_file, make_client):
    with gdrkv.Server(memory="32MiB", pool_file=pool_file) as server:
        client = make_client(server.url)
        assert batch_put_bytes(client, ["x", "y"], [content("x", 70000), content("y", 9)]) == [0, 0]
        client.close()
    with gdrkv.Server(memory="32MiB", pool_file=pool_file) as server:
        assert server.stats()["restored_objects"] == 2
        client = make_client(server.url)
        assert read_all(client, ["x", "y"], [70000, 9]) == [True, True]


def test_bench_restart_reports_every_size(tmp_path):
    """gdrkv bench --restart: each size's pool is filled, re-attached whole
    (the bench checks the count and one object's bytes) and timed."""
    report = tmp_path / "restart.json"
    out = run_gdrkv("bench", "--restart", "--restart-memory", "64MiB", "--repeat", "1",
                    "--sizes", "4KiB,1MiB", "--json", str(report), timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.loads(report.read_text())["results"]
    assert [r["size"] for r in rows] == [4096, 1 << 20]
    for r in rows:
        # Filled to 90% of the pool (4 KiB values take 4800-byte chunks).
        assert r["objects"] * r["size"] >= 0.7 * (64 << 20)
        assert r["objects"] > 0 and r["restart_s"] > 0 and r["empty_start_s"] > 0
    assert "restart s per 64 GiB" in out.stdout
    assert not [p for p in os.listdir("/dev/shm") if p.startswith("gdrkv-bench-")]
