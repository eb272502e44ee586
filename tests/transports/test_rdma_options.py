"""The rdma settings of docs/transports.md, each with an effect a test can
see over softverbs: GDRKV_IB_QPS and GDRKV_IB_SQ_DEPTH in the client's
completion and doorbell counts, GDRKV_IB_GID_INDEX in the rdma report,
GDRKV_IB_HCA's prefix form in which device a server may open, and the
pool registration time in the server's stats."""
import re

import numpy as np
import pytest

import gdrkv
from support.softverbs import SOFTVERBS
from support.util import python_child, stat, unique

pytestmark = pytest.mark.skipif(SOFTVERBS is None, reason="built without softverbs "
                                "(no <infiniband/verbs.h>); run.sh requires it")

SIZE = 4096


def get_counts(make_client, server, n, env, monkeypatch):
    """(completions, doorbells) of one GET frame of n objects by a client
    that runs under env (the variables are read when rdma starts)."""
    for name in ("GDRKV_IB_QPS", "GDRKV_IB_SQ_DEPTH"):
        if name in env:
            monkeypatch.setenv(name, env[name])
        else:
            monkeypatch.delenv(name, raising=False)
    client = make_client(server.url, transport="rdma", conns=1, namespace=unique("opt"))
    buf = np.zeros(n * SIZE, np.uint8)
    base, _ = client.register(buf)
    keys = [f"k{i}" for i in range(n)]
    ptrs = [base + i * SIZE for i in range(n)]
    assert client.batch_put(keys, ptrs, [SIZE] * n) == [0] * n
    before = client.stats()["client"]
    assert client.batch_get(keys, ptrs, [SIZE] * n) == [SIZE] * n
    after = client.stats()["client"]
    assert after["rdma_work_requests"] - before["rdma_work_requests"] == n
    return (after["rdma_completions"] - before["rdma_completions"],
            after["rdma_doorbells"] - before["rdma_doorbells"])


@pytest.mark.parametrize("qps", [1, 4, 16])
def test_qps_per_connection(server_factory, make_client, monkeypatch, qps):
    """1024 READs go out in 32 chains spread over the QPs, and each QP asks
    for one completion (its last WR; a send queue of 4096 needs no other):
    as many completions as QPs."""
    server = server_factory()
    completions, _ = get_counts(make_client, server, 1024,
                                {"GDRKV_IB_QPS": str(qps), "GDRKV_IB_SQ_DEPTH": "4096"},
                                monkeypatch)
    assert completions == qps


def test_send_queue_depth(server_factory, make_client, monkeypatch):
    """A completion every sq_depth/2 WRs and chains of at most sq_depth/2:
    depth 8 takes a completion and a doorbell per 4 WRs; the default (512)
    one completion per QP."""
    server = server_factory()
    n = 256
    completions, doorbells = get_counts(make_client, server, n,
                                        {"GDRKV_IB_SQ_DEPTH": "8", "GDRKV_IB_QPS": "1"},
                                        monkeypatch)
    assert completions == n // 4 and doorbells >= n // 4
    completions, doorbells = get_counts(make_client, server, n, {"GDRKV_IB_QPS": "1"},
                                        monkeypatch)
    assert completions == 1 and doorbells <= n // 32


REPORT = r"""
from gdrkv._native import ffi, lib
buf = ffi.new("char[]", 8192)
lib.gdrkv_rdma_report(buf, 8192)
print(ffi.string(buf).decode())
"""


@pytest.mark.parametrize("index, expected", [(None, "1"), ("0", "0"), ("7", "-1")])
def test_gid_index_overrides_the_choice(monkeypatch, index, expected):
    """On RoCE softverbs has GID 0 (link-local) and GID 1 (IPv4-mapped,
    the automatic choice); the variable picks another, or one that does not
    exist."""
    monkeypatch.setenv("SOFTVERBS_LINK_LAYER", "ethernet")
    if index is None:
        monkeypatch.delenv("GDRKV_IB_GID_INDEX", raising=False)
    else:
        monkeypatch.setenv("GDRKV_IB_GID_INDEX", index)
    report = dict(line.split(" ", 1) for line in python_child(REPORT).splitlines() if " " in line)
    assert report["device.softverbs0.port.1.gid_index"] == expected


MTU_CLIENT = r"""
from gdrkv._native import ffi, lib
url, size = ARGS[0], 64 << 10
client = gdrkv.Client(url, transport="rdma", namespace="mtu-" + str(os.getpid()), conns=1)
src = np.frombuffer(os.urandom(32 * size), np.uint8).copy()
dst = np.zeros_like(src)
s, _ = client.register(src)
d, _ = client.register(dst)
keys = [f"m{i}" for i in range(32)]
assert client.batch_put(keys, [s + i * size for i in range(32)], [size] * 32) == [0] * 32
assert client.batch_get(keys, [d + i * size for i in range(32)], [size] * 32) == [size] * 32
assert (src == dst).all()
stats = client.stats()["client"]
buf = ffi.new("char[]", 8192)
lib.gdrkv_rdma_report(buf, 8192)
print(ffi.string(buf).decode())
print("frames", stats["rdma_write_frames"], stats["rdma_read_frames"],
      stats["rdma_fallback_frames"])
"""


@pytest.mark.parametrize("server_mtu, client_mtu", [("1024", "4096"), ("4096", "512")])
def test_path_mtu_is_the_smaller_port_mtu(server_factory, monkeypatch, server_mtu, client_mtu):
    """docs/transports.md: the path MTU is the smaller of the two ports'
    active MTUs. softverbs drops a message longer than the smaller path MTU
    when the two QPs' path MTUs differ (as a receiver drops oversized
    packets), so 64 KiB objects move only if both ends chose the same one."""
    monkeypatch.setenv("SOFTVERBS_MTU", server_mtu)
    monkeypatch.setenv("GDRKV_LOG", "info")             # the server names its port's MTU
    server = server_factory()
    out = python_child(MTU_CLIENT, server.url, env={"SOFTVERBS_MTU": client_mtu})
    report = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert report["device.softverbs0.port.1.active_mtu"] == client_mtu
    assert report["frames"] == "1 1 0"       # one WRITE frame, one READ frame, no fallback
    assert f"mtu {server_mtu}" in open(server.log_path).read()


@pytest.mark.parametrize("spec, allowed", [
    ("soft", True), ("softverbs", True), ("soft:1", True), ("nothing,soft", True),
    ("soft:2", False), ("=soft", False), ("verbs", False), ("softverbs0x", False),
])
def test_hca_prefix_form(monkeypatch, spec, allowed):
    """`mlx5` names every mlx5_N (prefix match); `=` asks for the whole
    name; `:N` for one port."""
    monkeypatch.setenv("GDRKV_IB_HCA", spec)
    if allowed:
        with gdrkv.Server(memory="16MiB", pretouch=False, unix_path="", rdma="on") as s:
            assert s.stats()["rdma_enabled"] == 1
    else:
        with pytest.raises(gdrkv.GdrkvError, match="GDRKV_IB_HCA"):
            gdrkv.Server(memory="16MiB", pretouch=False, unix_path="", rdma="on")


def test_pool_registration_time_is_reported(server_factory, monkeypatch):
    """rdma_pool_register_ms is the figure the server logs at start."""
    monkeypatch.setenv("GDRKV_LOG", "info")
    server = server_factory(memory="256MiB")
    match = re.search(r"rdma: pool of 256 MiB registered on \S+ port \d+ in (\d+) ms",
                      server.log_tail(20000))
    assert match, server.log_tail()
    assert stat(server.stats(), "rdma_pool_register_ms") == int(match.group(1))
