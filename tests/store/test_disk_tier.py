"""The disk tier (#18): `gdrkv serve --disk DIR --disk-size SIZE` keeps what
the pool evicts in a file in each directory; EXISTS sees it and a read
brings it back into the pool. A working set 8x the pool is served byte-exact
over tcp, shm and rdma (softverbs), and again after a SIGTERM restart (every
object) or a SIGKILL (what had reached the disk, and with --pool-file as
well, everything). Writers go unpaced, as engines do: one faster than the
disk is slowed to its speed (--disk-full-policy throttle, the default) and
nothing acknowledged is dropped, unless the operator chose drop. Deletes
and clears stay done across restarts. Disk full, disk errors and a slow
disk mean misses, failed writes and counters, never wrong bytes, nor a
server that spins or floods its log, and a slow disk never holds up reads
of objects in memory. Unusable paths and sizes are refused at start, with
the reason."""
import ctypes
import json
import os
import threading
import time

import pytest

import gdrkv
from support.content import batch_get_bytes, batch_put_bytes, check_read, content
from support.util import build_preload, cpu_seconds, run_gdrkv, unique, wait_for

POOL = "32MiB"
OBJECT = 512 << 10
COUNT = 512                         # 256 MiB: 8x the pool
DISK_SIZE = "1GiB"


def start(server_factory, disk_dir, *extra, size=DISK_SIZE, memory=POOL):
    return server_factory(memory, args=["--disk", str(disk_dir), "--disk-size", size, *extra])


def io_uring_here():
    """Whether this process may set up an io_uring (the kernel may lack it,
    forbid it by sysctl, or a container's seccomp filter may)."""
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)      # struct io_uring_params
    fd = libc.syscall(425, 2, params)              # __NR_io_uring_setup on x86-64
    if fd >= 0:
        os.close(fd)
    return fd >= 0


def keys_of(prefix, n=COUNT):
    return [f"{prefix}-{i}" for i in range(n)]


def write(client, keys, size=OBJECT, batch=32):
    """Writes the keys in calls of batch, as fast as the server takes them
    (as an engine does): the results, one per key."""
    results = []
    for i in range(0, len(keys), batch):
        part = keys[i:i + batch]
        results += batch_put_bytes(client, part, [content(k, size) for k in part])
    return results


def write_all(client, keys, size=OBJECT, batch=32):
    assert write(client, keys, size, batch) == [0] * len(keys)


def read_back(client, keys, size=OBJECT, batch=8):
    """Whether each key reads back byte-exact (False for a miss)."""
    found = []
    for i in range(0, len(keys), batch):
        part = keys[i:i + batch]
        results, values = batch_get_bytes(client, part, [size] * len(part))
        found += [check_read(k, size, r, v) for k, r, v in zip(part, results, values)]
    return found


@pytest.mark.parametrize("transport", ["tcp", "shm", "rdma"])
def test_a_working_set_8x_the_pool_is_served_through_the_disk(server_factory, make_client,
                                                              tmp_path, transport):
    server = start(server_factory, tmp_path)
    client = make_client(server.url, namespace=unique("ns"), transport=transport,
                         timeout_ms=30000)
    keys = keys_of("page")
    write_all(client, keys)         # unpaced, 16 MiB a call: the disk sets the pace
    stats = server.stats()
    assert stats["demotions"] >= COUNT * 3 // 4 and stats["evicted_not_on_disk"] == 0, stats
    assert stats["frames_waited_for_room"] > 0 and stats["put_no_space"] == 0, stats
    assert stats["disk_objects"] >= COUNT * 3 // 4
    assert client.batch_exists(keys) == [True] * COUNT
    assert read_back(client, keys) == [True] * COUNT
    stats = server.stats()
    assert stats["promotions"] >= COUNT * 3 // 4 and stats["frames_waited_for_disk"] > 0
    assert stats["disk_errors"] == 0 and stats["disk_bad_records"] == 0
    # A frame's keys are read side by side, through io_uring where it exists.
    assert (stats["disk_uring_reads"] > 0) == io_uring_here(), stats["disk_uring_reads"]


@pytest.mark.parametrize("stop", ["sigterm", "sigkill", "sigkill with a pool file"])
def test_the_disk_outlives_the_server(server_factory, make_client, tmp_path, stop):
    """SIGTERM writes what is not on disk yet before the server exits: the
    next server has every object. SIGKILL keeps what was on disk; with a
    pool file too, the pool keeps the rest."""
    pool_file = f"/dev/shm/gdrkv-test-{unique('disk')}.pool"
    extra = ["--pool-file", pool_file] if "pool file" in stop else []
    try:
        server = start(server_factory, tmp_path, *extra)
        ns = unique("ns")
        client = make_client(server.url, namespace=ns, transport="tcp", timeout_ms=30000)
        keys = keys_of("kept", 256)
        write_all(client, keys)
        on_disk = server.stats()["disk_objects"]
        client.close()
        if stop == "sigterm":
            assert server.stop() == 0
        else:
            server.kill()
        server.restart()
        stats = server.stats()
        reader = make_client(server.url, namespace=ns, transport="tcp", timeout_ms=30000)
        found = read_back(reader, keys)
        if stop == "sigkill":
            assert stats["disk_restored_objects"] >= on_disk
            assert sum(found) >= on_disk, (sum(found), on_disk)
        else:
            assert found == [True] * len(keys), found.count(False)
    finally:
        if os.path.exists(pool_file):
            os.unlink(pool_file)


def test_deletes_and_clears_reach_the_disk(server_factory, make_client, tmp_path):
    server = start(server_factory, tmp_path)
    ns, other = unique("ns"), unique("other")
    client = make_client(server.url, namespace=ns, transport="tcp")
    keys = keys_of("gone", 160)
    write_all(client, keys)
    kept = make_client(server.url, namespace=other, transport="tcp")
    write_all(kept, keys[:4])
    # The first keys live on disk only by now.
    assert client.batch_delete(keys[:2]) == [0, 0]
    assert client.batch_exists(keys[:3]) == [False, False, True]
    assert client.clear() == len(keys) - 2
    assert client.batch_exists(keys) == [False] * len(keys)
    assert server.stop() == 0
    server.restart()
    client = make_client(server.url, namespace=ns, transport="tcp")
    assert client.batch_exists(keys) == [False] * len(keys)
    kept = make_client(server.url, namespace=other, transport="tcp")
    assert read_back(kept, keys[:4]) == [True] * 4


@pytest.fixture
def disk_faults(tmp_path, monkeypatch):
    """Servers started from here see the disk tier's I/O fail or slow down
    while the switch file exists (tests/native/disk_faults.c)."""
    switch = tmp_path / "fault-on"
    monkeypatch.setenv("LD_PRELOAD", build_preload("disk_faults", tmp_path))
    # The shim sees preads; io_uring's reads would pass it by.
    monkeypatch.setenv("GDRKV_IO_URING", "0")
    monkeypatch.setenv("DISK_FAULT_SWITCH", str(switch))

    def set_fault(kind, on, ms=0):
        monkeypatch.setenv("DISK_FAULT", kind)
        monkeypatch.setenv("DISK_FAULT_MS", str(ms))
        if on:
            switch.touch()
        elif switch.exists():
            switch.unlink()
    return set_fault


@pytest.mark.parametrize("policy", ["throttle", "drop"])
@pytest.mark.parametrize("fault", ["enospc", "eio"])
def test_a_failing_disk_loses_objects_never_bytes(server_factory, make_client, tmp_path,
                                                  disk_faults, fault, policy):
    """Writes to disk that fail leave the objects out of the tier
    (disk_errors); reads that fail are misses. Throttled, a writer the
    failing disk can't make room for gets NO_SPACE, at once rather than
    after its bound (nor the client's timeout), and every key it was told
    is stored reads back; dropping, the pool evicts what the disk did not
    take (evicted_not_on_disk). Nothing read is ever wrong, and the server
    goes on; when the disk is back, so is the tier."""
    disk_faults(fault, on=False)
    disk_dir = tmp_path / "disk"
    disk_dir.mkdir()
    server = start(server_factory, disk_dir, "--disk-full-policy", policy,
                   "--disk-full-wait-ms", "20000")
    client = make_client(server.url, namespace=unique("ns"), transport="tcp",
                         timeout_ms=30000)
    before = keys_of("before", 96)
    write_all(client, before)
    disk_faults(fault, on=True)
    during = keys_of("during", 96)
    start_s = time.monotonic()
    results = write(client, during, batch=8)
    stats = server.stats()
    assert stats["disk_errors"] > 0, stats
    if policy == "throttle":
        assert set(results) == {0, gdrkv.errors.E_NO_SPACE}, results
        assert time.monotonic() - start_s < 20, "a failing disk's writers waited their bound"
        assert stats["evicted_not_on_disk"] == 0, stats
    else:
        assert results == [0] * len(during) and stats["evicted_not_on_disk"] > 0, stats
    found = read_back(client, before + during)     # misses allowed, wrong bytes never
    if policy == "throttle":
        stored = [ok for ok, r in zip(found[len(before):], results) if r == 0]
        assert stored == [True] * len(stored)
    if fault == "eio":
        assert not all(found[:len(before)])
    disk_faults(fault, on=False)
    # The demoter sees the disk is back at the end of its back-off.
    wait_for(lambda: server.stats()["disk_backoff_ms"] == 0, 30, "a disk write to succeed")
    # Throttled, the tier takes a working set over the pool again; dropping,
    # only what the pool holds is sure to stay.
    after = keys_of("after", 96 if policy == "throttle" else 16)
    write_all(client, after)
    assert read_back(client, after) == [True] * len(after)
    assert server.alive


@pytest.mark.alone
@pytest.mark.parametrize("fault", ["enospc", "eio"])
def test_a_failing_disk_under_a_full_pool_costs_no_cpu_and_little_log(
        server_factory, make_client, tmp_path, disk_faults, fault):
    """A pool full of objects the disk refuses, and no traffic: the demoter
    backs off (exponentially, capped) instead of trying again at once, the
    failures are logged one line per interval with their count, and the
    tier evicts no region for them."""
    disk_faults(fault, on=False)
    disk_dir = tmp_path / "disk"
    disk_dir.mkdir()
    server = start(server_factory, disk_dir)
    client = make_client(server.url, namespace=unique("ns"), transport="tcp", timeout_ms=30000)
    write_all(client, keys_of("before", 16))
    disk_faults(fault, on=True)
    write(client, keys_of("during", 96), batch=8)   # more than the pool: some fail NO_SPACE
    wait_for(lambda: server.stats()["disk_errors"] > 0, 10, "the demoter to try the disk")
    before, lines = server.stats(), os.path.getsize(server.log_path)
    cpu = cpu_seconds(server.proc.pid)
    start_s = time.monotonic()
    time.sleep(4)                                  # the idle time under test
    spent, elapsed = cpu_seconds(server.proc.pid) - cpu, time.monotonic() - start_s
    after = server.stats()
    with open(server.log_path, "rb") as f:
        f.seek(lines)
        logged = f.read().decode(errors="replace").splitlines()
    assert after["disk_errors"] > before["disk_errors"]        # it still tries
    assert spent < 0.05 * elapsed, f"{spent:.2f} s of CPU in {elapsed:.1f} s idle"
    assert len(logged) <= elapsed, logged
    assert after["disk_evicted_regions"] == before["disk_evicted_regions"], after
    assert server.alive


def test_the_drop_policy_lets_a_fast_writer_lose_what_the_disk_did_not_take(
        server_factory, make_client, tmp_path):
    """--disk-full-policy drop: the operator chose memory speed over keeping
    everything. Unpaced writes all succeed at once, and the excess is
    evicted before it reached the disk (counted, and misses, never wrong bytes)."""
    server = start(server_factory, tmp_path, "--disk-full-policy", "drop")
    client = make_client(server.url, namespace=unique("ns"), transport="tcp", timeout_ms=30000)
    keys = keys_of("fast")
    write_all(client, keys)
    stats = server.stats()
    assert stats["evicted_not_on_disk"] > 0 and stats["frames_waited_for_room"] == 0, stats
    assert not all(read_back(client, keys))


def test_a_writer_waits_for_a_slow_disk_no_longer_than_its_bound(server_factory, make_client,
                                                                  tmp_path, disk_faults):
    """A disk that takes a second per write, a writer of twice the pool: a
    PUT waits for room at most --disk-full-wait-ms, then its keys without
    room fail NO_SPACE, long before the client's timeout; none it was told
    is stored is lost."""
    disk_faults("slow-writes", on=False, ms=1000)
    disk_dir = tmp_path / "disk"
    disk_dir.mkdir()
    server = start(server_factory, disk_dir, "--disk-full-wait-ms", "300")
    client = make_client(server.url, namespace=unique("ns"), transport="tcp", timeout_ms=60000)
    disk_faults("slow-writes", on=True, ms=1000)
    keys = keys_of("slow", 128)
    results = write(client, keys, batch=8)
    assert set(results) == {0, gdrkv.errors.E_NO_SPACE}, results
    stats = server.stats()
    assert stats["frames_waited_for_room"] > 0 and stats["evicted_not_on_disk"] == 0, stats
    disk_faults("slow-writes", on=False)
    stored = [k for k, r in zip(keys, results) if r == 0]
    assert read_back(client, stored) == [True] * len(stored)


def cold_keys_on_one_worker(server_factory, make_client, tmp_path, disk_faults, prefix, ms):
    """A one-worker server whose disk reads will take ms each once the
    slow-reads fault is on, with 96 keys written: the first ones on disk
    only by then, the newest still in memory. (server, namespace, a
    client of it, the keys)."""
    disk_faults("slow-reads", on=False, ms=ms)
    disk_dir = tmp_path / "disk"
    disk_dir.mkdir()
    server = start(server_factory, disk_dir, "--workers", "1")
    ns = unique("ns")
    client = make_client(server.url, namespace=ns, transport="tcp", timeout_ms=30000)
    keys = keys_of(prefix, 96)
    write_all(client, keys)
    return server, ns, client, keys


def test_a_slow_disk_does_not_hold_up_reads_from_memory(server_factory, make_client, tmp_path,
                                                       disk_faults):
    """While one client waits 3 s for a key the disk reads slowly, another
    reads keys in memory in milliseconds: the disk threads wait, the
    network workers don't."""
    server, ns, writer, keys = cold_keys_on_one_worker(server_factory, make_client, tmp_path,
                                                       disk_faults, "cold", 3000)
    assert writer.batch_exists(keys[:1]) == [True]
    disk_faults("slow-reads", on=True, ms=3000)
    slow = make_client(server.url, namespace=ns, transport="tcp", timeout_ms=30000)
    done = {}
    thread = threading.Thread(target=lambda: done.setdefault("cold", read_back(slow, keys[:1])))
    thread.start()
    wait_for(lambda: server.stats()["frames_waited_for_disk"] > 0, 10, "the cold read to park")
    fast = make_client(server.url, namespace=ns, transport="tcp", timeout_ms=30000)
    start_s = time.monotonic()
    assert read_back(fast, keys[-4:]) == [True] * 4            # the newest: in memory
    assert time.monotonic() - start_s < 1.0
    thread.join(30)
    assert done["cold"] == [True]


def test_a_slow_disk_does_not_hold_up_deletes(server_factory, make_client, tmp_path,
                                              disk_faults):
    """A DELETE of keys on disk answers at once: they leave the disk's index
    on the network worker, and the demoter marks them dead in their files
    behind it (a read and a write each, one second per read here). A
    SIGTERM waits for the marks, so the next server still finds them gone."""
    server, ns, client, keys = cold_keys_on_one_worker(server_factory, make_client, tmp_path,
                                                       disk_faults, "doomed", 1000)
    disk_faults("slow-reads", on=True, ms=1000)
    start_s = time.monotonic()
    assert client.batch_delete(keys[:2]) == [0, 0]      # the first keys: on disk only
    assert read_back(client, keys[-4:]) == [True] * 4    # the newest: in memory
    assert time.monotonic() - start_s < 0.5
    assert client.batch_exists(keys[:3]) == [False, False, True]
    assert server.stop() == 0
    disk_faults("slow-reads", on=False)
    server.restart()
    client = make_client(server.url, namespace=ns, transport="tcp")
    assert client.batch_exists(keys[:3]) == [False, False, True]


def test_two_readers_of_one_key_on_disk_both_get_it(server_factory, make_client, tmp_path,
                                                    disk_faults):
    """Two readers (two TP ranks of an MLA model reading one page) ask for
    the same key on disk at once: the second waits for the first one's
    promotion instead of missing."""
    disk_faults("slow-reads", on=False, ms=1500)
    disk_dir = tmp_path / "disk"
    disk_dir.mkdir()
    server = start(server_factory, disk_dir)
    ns = unique("ns")
    writer = make_client(server.url, namespace=ns, transport="tcp", timeout_ms=30000)
    keys = keys_of("shared", 96)
    write_all(writer, keys)
    disk_faults("slow-reads", on=True, ms=1500)
    found = {}

    def read(name):
        reader = make_client(server.url, namespace=ns, transport="tcp", timeout_ms=30000)
        found[name] = read_back(reader, keys[:1])

    first = threading.Thread(target=read, args=("first",))
    first.start()
    wait_for(lambda: server.stats()["frames_waited_for_disk"] >= 1, 10, "the first read to park")
    second = threading.Thread(target=read, args=("second",))
    second.start()
    first.join(30)
    second.join(30)
    assert found == {"first": [True], "second": [True]}
    assert server.stats()["frames_waited_for_disk"] == 2


@pytest.mark.parametrize("args, message", [
    (["--disk", "{missing}", "--disk-size", "1GiB"], "No such file or directory"),
    (["--disk", "{file}", "--disk-size", "1GiB"], "not a directory"),
    (["--disk", "{tmp}", "--disk-size", "16MiB"], "too small"),
    (["--disk", "{tmp}"], "disk and disk_size go together"),
    (["--reset-disk"], "reset_disk needs a disk"),
    (["--disk", "{tmp}", "--disk-size", "1GiB", "--disk-full-policy", "never"],
     "disk_full_policy must be throttle or drop"),
])
def test_unusable_disks_are_refused_at_start(tmp_path, args, message):
    (tmp_path / "file").write_text("")
    args = [a.format(missing=tmp_path / "missing", tmp=tmp_path, file=tmp_path / "file")
            for a in args]
    done = run_gdrkv("serve", "--listen", "127.0.0.1:0", "--memory", "32MiB",
                     "--no-pretouch", *args, timeout=60)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_a_disk_file_of_another_size_or_in_use_is_refused(server_factory, tmp_path):
    server = start(server_factory, tmp_path)
    with pytest.raises(ValueError, match="another gdrkv server is using it"):
        gdrkv.Server(memory=POOL, disk=str(tmp_path), disk_size=DISK_SIZE)
    assert server.stop() == 0
    with pytest.raises(ValueError, match="another --disk-size"):
        gdrkv.Server(memory=POOL, disk=str(tmp_path), disk_size="512MiB")
    with gdrkv.Server(memory=POOL, disk=str(tmp_path), disk_size="512MiB",
                      reset_disk=True) as fresh:
        assert fresh.stats()["disk_bytes"] == 31 * (16 << 20)
    assert oct(os.stat(tmp_path / "gdrkv.disk").st_mode & 0o777) == "0o600"


def test_stat_shows_the_disk_tier(server_factory, tmp_path):
    server = start(server_factory, tmp_path)
    done = run_gdrkv("stat", server.url, timeout=60)
    assert done.returncode == 0
    for name in ("disk_bytes", "disk_objects", "demotions", "promotions", "disk_read_ns"):
        assert name in done.stdout, name


def test_bench_measures_the_disk_tier(tmp_path):
    """`gdrkv bench --disk-tier` on a tiny working set: every row measured
    (the figures themselves are the bench's business, not a test's)."""
    report = tmp_path / "disk.json"
    done = run_gdrkv("bench", "--disk-tier", str(tmp_path), "--disk-working-set", "48MiB",
                     "--disk-memory", "16MiB", "--sizes", "1MiB", "--repeat", "1", "--quiet",
                     "--json", str(report), timeout=600)
    assert done.returncode == 0, done.stderr
    rows = json.loads(report.read_text())["results"]
    systems = {r["system"] for r in rows}
    assert {"raw O_DIRECT", "gdrkv tcp from disk", "gdrkv shm from disk", "raw O_DIRECT write",
            "gdrkv tcp write, pool full", "gdrkv shm write, pool full"} <= systems
    assert all(r["gb_per_s"] > 0 and r["raw_x"] > 0 for r in rows)
    assert "raw O_DIRECT" in done.stdout
