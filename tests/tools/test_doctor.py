"""`gdrkv doctor` against a fake sysfs tree (fake_sysfs.py), on this
machine as it is, and its self-test's checks."""
import ctypes
import json
import os

import pytest

from support import fake_sysfs
from support.softverbs import SOFTVERBS
from support.util import run_gdrkv
from support.fake_sysfs import GPU_A, GPU_B, GPU_C
from gdrkv import client as client_module
from gdrkv.doctor import report as doctor, selftest as doctor_selftest
from gdrkv.sysinfo import gpu as sysinfo_gpu, pci as sysinfo_pci, rdma as sysinfo_rdma

HOST_HAS_RDMA = bool(os.listdir("/sys/class/infiniband")) \
    if os.path.isdir("/sys/class/infiniband") else False


def gdrkv(*args, env=None, timeout=120):
    return run_gdrkv(*args, env=env, timeout=timeout,
                     drop=("GDRKV_SYSFS_ROOT", "GDRKV_IBVERBS_LIB", "GDRKV_IB_GID_INDEX"))


@pytest.fixture
def tree(tmp_path, monkeypatch):
    root = fake_sysfs.build(tmp_path / "root")
    monkeypatch.setenv("GDRKV_SYSFS_ROOT", root)
    monkeypatch.delenv("GDRKV_IB_GID_INDEX", raising=False)
    return root


def by_name(devices):
    return {d["name"]: d for d in devices}


# ---------------------------------------------------------------- sysfs reading

def test_rdma_devices_from_the_fake_tree(tree):
    devices = by_name(sysinfo_rdma.devices())
    assert sorted(devices) == ["mlx5_0", "mlx5_1"]
    ib, roce = devices["mlx5_0"], devices["mlx5_1"]
    assert (ib["pci"], ib["numa_node"], ib["netdevs"]) == (fake_sysfs.NIC_IB, 0, ["ib0"])
    assert (roce["pci"], roce["numa_node"]) == (fake_sysfs.NIC_ROCE, 1)
    assert ib["sys_path"] == fake_sysfs.device_dir(fake_sysfs.NIC_IB)

    [ib_port], [roce_port] = ib["ports"], roce["ports"]
    assert (ib_port["state"], ib_port["phys_state"], ib_port["link_layer"], ib_port["lid"]) == \
        ("ACTIVE", "LinkUp", "InfiniBand", 5)
    assert roce_port["link_layer"] == "Ethernet" and roce_port["rate"].startswith("100 Gb/sec")
    # Zero GIDs are left out; the rest keep their index, type and netdev.
    assert [g["index"] for g in roce_port["gids"]] == [0, 1, 2, 3, 4]
    gid3 = roce_port["gids"][3]
    assert (gid3["gid"], gid3["type"], gid3["ndev"], gid3["ipv4"]) == \
        ("::ffff:192.168.7.11", "RoCE v2", "eth2", "192.168.7.11")
    assert roce_port["chosen_gid"] == 3, roce_port["chosen_gid_why"]
    assert ib_port["chosen_gid"] == 0 and "LID" in ib_port["chosen_gid_why"]


def gid(index, text, gid_type):
    import ipaddress
    address = ipaddress.IPv6Address(text)
    return {"index": index, "gid": text, "type": gid_type, "ndev": "eth0",
            "ipv4": str(address.ipv4_mapped) if address.ipv4_mapped else None,
            "link_local": address.is_link_local}


@pytest.mark.parametrize("gids, expected", [
    # RoCE v2 + IPv4-mapped wins wherever it is.
    ([gid(0, "fe80::1", "RoCE v2"), gid(1, "::ffff:10.0.0.1", "IB/RoCE v1"),
      gid(2, "2001:db8::1", "RoCE v2"), gid(3, "::ffff:10.0.0.1", "RoCE v2")], 3),
    # No IPv4: a global IPv6 RoCE v2 GID before a link-local one.
    ([gid(0, "fe80::1", "RoCE v2"), gid(1, "2001:db8::1", "IB/RoCE v1"),
      gid(2, "2001:db8::1", "RoCE v2")], 2),
    # RoCE v2 first, even over an IPv4-mapped RoCE v1 GID.
    ([gid(0, "::ffff:10.0.0.1", "IB/RoCE v1"), gid(1, "2001:db8::1", "RoCE v2")], 1),
    # Only RoCE v1: the IPv4-mapped one.
    ([gid(0, "fe80::1", "IB/RoCE v1"), gid(1, "::ffff:10.0.0.1", "IB/RoCE v1")], 1),
    ([], None),
])
def test_gid_choice_is_roce_v2_ipv4_first(gids, expected, monkeypatch):
    monkeypatch.delenv("GDRKV_IB_GID_INDEX", raising=False)
    assert sysinfo_rdma.choose_gid("Ethernet", gids)[0] == expected


def test_gid_index_override(tree, monkeypatch):
    monkeypatch.setenv("GDRKV_IB_GID_INDEX", "2")
    port = by_name(sysinfo_rdma.devices())["mlx5_1"]["ports"][0]
    assert port["chosen_gid"] == 2 and "GDRKV_IB_GID_INDEX" in port["chosen_gid_why"]
    monkeypatch.setenv("GDRKV_IB_GID_INDEX", "7")           # unpopulated
    port = by_name(sysinfo_rdma.devices())["mlx5_1"]["ports"][0]
    assert port["chosen_gid"] is None and "no populated GID" in port["chosen_gid_why"]


def test_port_counters_convert_data_words_to_bytes(tree):
    sample = sysinfo_rdma.all_port_counters()["mlx5_1/1"]
    words = fake_sysfs.COUNTERS["mlx5_1"]
    assert sample["xmit_bytes"] == 4 * words["port_xmit_data"]
    assert sample["rcv_bytes"] == 4 * words["port_rcv_data"]
    assert sample["counters"] == words
    # The RDMA request counters lead; every hw counter is there.
    assert list(sample["hw_counters"])[:3] == ["rx_read_requests", "rx_write_requests",
                                              "rx_atomic_requests"]
    assert sample["hw_counters"] == fake_sysfs.HW_COUNTERS["mlx5_1"]


def test_gpus_from_sysfs_with_bar1_and_numa(tree):
    gpus = {g["pci"]: g for g in sysinfo_gpu.gpus(cuda={"error": "none"}, smi_bar1={})}
    # 0000:07:00.1 is an NVIDIA audio function, not a GPU.
    assert sorted(gpus) == sorted([GPU_A, GPU_B, GPU_C])
    assert gpus[GPU_A]["bar1_bytes"] == fake_sysfs.BAR1_A       # resource1's size
    assert gpus[GPU_B]["bar1_bytes"] == fake_sysfs.BAR1_B       # line 1 of `resource`
    assert gpus[GPU_C]["numa_node"] == 1
    # nvidia-smi's figure wins over sysfs.
    gpus = {g["pci"]: g for g in sysinfo_gpu.gpus(cuda={"error": "none"},
                                                 smi_bar1={GPU_A: 128 << 30})}
    assert (gpus[GPU_A]["bar1_bytes"], gpus[GPU_A]["bar1_from"]) == (128 << 30, "nvidia-smi")


def test_pcie_distance_classification(tree):
    gpus = sysinfo_gpu.gpus(cuda={"error": "none"}, smi_bar1={})
    rows = {r["pci"]: r for r in doctor.topology(gpus, sysinfo_rdma.devices())}
    assert rows[GPU_A]["distances"] == {"mlx5_0": "PIX", "mlx5_1": "SYS"}
    assert rows[GPU_B]["distances"] == {"mlx5_0": "PHB", "mlx5_1": "SYS"}
    assert rows[GPU_C]["distances"] == {"mlx5_0": "SYS", "mlx5_1": "NODE"}
    assert [rows[g]["closest"] for g in (GPU_A, GPU_B, GPU_C)] == \
        [["mlx5_0"], ["mlx5_0"], ["mlx5_1"]]


@pytest.mark.parametrize("a, b, numa, expected", [
    # Two switch levels: the GPU below the lower switch, the NIC below the upper one.
    ("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/0000:04:01.0/0000:05:00.0",
     "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:06:00.0", (0, 0), "PXB"),
    # The GPU behind one more bridge than the NIC below the same switch.
    ("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/0000:04:00.0",
     "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:06:00.0", (0, 0), "PXB"),
    # Both below the lower switch.
    ("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/0000:04:01.0/0000:05:00.0",
     "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0/0000:04:02.0/0000:07:00.0",
     (0, 0), "PIX"),
    # Two functions of one device.
    ("pci0000:00/0000:00:01.0/0000:03:00.0", "pci0000:00/0000:00:01.0/0000:03:00.1", (0, 0),
     "PIX"),
    ("pci0000:00/0000:00:01.0/0000:03:00.0", "pci0000:00/0000:00:02.0/0000:04:00.0", (0, 0),
     "PHB"),
    # Unknown NUMA on both sides (a single-node machine) counts as one node.
    ("pci0000:00/0000:00:01.0/0000:03:00.0", "pci0000:40/0000:40:01.0/0000:41:00.0",
     (None, None), "NODE"),
    ("pci0000:00/0000:00:01.0/0000:03:00.0", "pci0000:40/0000:40:01.0/0000:41:00.0", (0, 1),
     "SYS"),
])
def test_pcie_distance_rules(a, b, numa, expected):
    assert sysinfo_pci.distance("/sys/devices/" + a, numa[0], "/sys/devices/" + b,
                                numa[1]) == expected
    assert sysinfo_pci.distance("/sys/devices/" + b, numa[1], "/sys/devices/" + a,
                                numa[0]) == expected


def test_pcie_distance_unknown_without_a_pci_path():
    assert sysinfo_pci.distance(None, 0, "/sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0",
                                0) is None
    assert sysinfo_pci.distance("/sys/devices/platform/foo", 0,
                                "/sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0", 0) is None


def test_peermem_from_proc_modules_or_sys_module(tree):
    assert sysinfo_gpu.peermem() == "nvidia_peermem"
    fake_sysfs.write(tree, "/proc/modules", "ib_core 491520 8 - Live 0x0")
    assert sysinfo_gpu.peermem() is None
    os.makedirs(os.path.join(tree, "sys/module/nv_peer_mem"))
    assert sysinfo_gpu.peermem() == "nv_peer_mem"


NVIDIA_SMI_MEMORY = """
==============NVSMI LOG==============

Timestamp                                 : Mon Jan  1 00:00:00 2024
Driver Version                            : 550.54.15
CUDA Version                              : 12.4

Attached GPUs                             : 2
GPU 00000000:05:00.0
    FB Memory Usage
        Total                             : 143771 MiB
        Used                              : 0 MiB
    BAR1 Memory Usage
        Total                             : 262144 MiB
        Used                              : 1 MiB
        Free                              : 262143 MiB

GPU 00000000:C1:00.0
    FB Memory Usage
        Total                             : 81559 MiB
    BAR1 Memory Usage
        Total                             : 131072 MiB
    Conf Compute Protected Memory Usage
        Total                             : 0 MiB
"""


def test_nvidia_smi_bar1_parsing():
    assert sysinfo_gpu.parse_nvidia_smi_bar1(NVIDIA_SMI_MEMORY) == {
        GPU_A: 262144 << 20, GPU_C: 131072 << 20}


class FakeCuda:
    """The few driver entry points doctor calls, writing through the
    ctypes pointers like the real ones: one Ampere GPU with dma-buf but
    no GPUDirect RDMA flag, one Hopper."""
    ATTRIBUTES = {0: {75: 8, 76: 0, 124: 1, 116: 0}, 1: {75: 9, 76: 0, 124: 1, 116: 1}}
    BUS_IDS = {0: b"0000:05:00.0", 1: b"0000:C1:00.0"}

    def cuInit(self, flags):
        return 0

    def cuDriverGetVersion(self, out):
        out._obj.value = 12040
        return 0

    def cuDeviceGetCount(self, out):
        out._obj.value = 2
        return 0

    def cuDeviceGet(self, out, ordinal):
        out._obj.value = ordinal
        return 0

    def cuDeviceGetName(self, buf, size, dev):
        buf.value = [b"NVIDIA A100-SXM4-80GB", b"NVIDIA H200"][dev.value]
        return 0

    def cuDeviceGetPCIBusId(self, buf, size, dev):
        buf.value = self.BUS_IDS[dev.value]
        return 0

    def cuDeviceTotalMem_v2(self, out, dev):
        out._obj.value = 80 << 30
        return 0

    def cuDeviceGetAttribute(self, out, attribute, dev):
        value = self.ATTRIBUTES[dev.value].get(attribute)
        if value is None:
            return 1                        # CUDA_ERROR_INVALID_VALUE
        out._obj.value = value
        return 0


def test_cuda_facts_and_their_join_with_sysfs(tree):
    cuda = sysinfo_gpu._query_cuda(FakeCuda())
    assert cuda["driver_version"] == 12040
    a100, h200 = cuda["devices"]
    assert (a100["pci"], a100["dma_buf"], a100["gpudirect_rdma"], a100["needs_flush_read"]) == \
        (GPU_A, True, False, True)
    assert (h200["pci"], h200["compute_capability"], h200["needs_flush_read"]) == \
        (GPU_C, "9.0", False)
    gpus = sysinfo_gpu.gpus(cuda=cuda, smi_bar1={})
    labels = {g["pci"]: doctor.gpu_label(g) for g in gpus}
    # CUDA's ordinals, sysfs's NUMA node and BAR1; GPU B is hidden from CUDA.
    assert labels == {GPU_A: "gpu0", GPU_C: "gpu1", GPU_B: "gpu@" + GPU_B}
    joined = {g["pci"]: g for g in gpus}
    assert (joined[GPU_C]["name"], joined[GPU_C]["numa_node"], joined[GPU_C]["bar1_bytes"]) == \
        ("NVIDIA H200", 1, fake_sysfs.BAR1_C)
    text = doctor.render_gpus(gpus)
    assert "NVIDIA H200" in text and "flush READ" in text


def test_cuda_failure_is_a_verdict_not_a_crash():
    class Broken(FakeCuda):
        def cuInit(self, flags):
            return 100                      # CUDA_ERROR_NO_DEVICE
    assert sysinfo_gpu.cuda_devices("libdoes-not-exist.so.1")["error"].startswith(
        "libdoes-not-exist.so.1 not loadable")
    with pytest.raises(sysinfo_gpu._CudaError, match="cuInit failed with CUresult 100"):
        sysinfo_gpu._query_cuda(Broken())


# ---------------------------------------------------------------- the verbs report

REPORT = """rdma_built 1
rdma_library /opt/lib/libsoftverbs.so
rdma_available 1
device softverbs0
device.softverbs0.max_mr_size 1099511627776
device.softverbs0.max_qp_wr 4096
device.softverbs0.max_sge 16
device.softverbs0.max_qp_rd_atom 16
device.softverbs0.port.1.state ACTIVE
device.softverbs0.port.1.link_layer Ethernet
device.softverbs0.port.1.active_mtu 4096
device.softverbs0.port.1.lid 0
device.softverbs0.port.1.gid_index 1
"""


def test_verbs_report_parsing_and_rendering():
    report = doctor.parse_verbs_report(REPORT)
    assert report["rdma_available"] == 1 and report["rdma_library"].endswith("softverbs.so")
    dev = report["devices"]["softverbs0"]
    assert dev["max_mr_size"] == 1 << 40 and dev["max_qp_rd_atom"] == 16
    assert dev["ports"]["1"] == {"state": "ACTIVE", "link_layer": "Ethernet",
                                 "active_mtu": 4096, "lid": 0, "gid_index": 1}
    text = doctor.render_verbs(report)
    assert "softverbs0/1" in text and "1TiB" in text and "ACTIVE" in text
    unavailable = doctor.parse_verbs_report("rdma_built 1\nrdma_library -\nrdma_available 0\n"
                                            "rdma_why no device has an active port\n")
    assert unavailable["rdma_why"] == "no device has an active port"
    assert "no device has an active port" in doctor.render_verbs(unavailable)
    assert "built but unavailable (no device has an active port)" in \
        doctor._transports(unavailable)


def test_verbs_report_from_this_library():
    """What this process's library reports: with the rdma transport built,
    the libibverbs the suite loads (softverbs, conftest.py) and its device."""
    report = doctor.verbs_report()
    from gdrkv._native import lib
    if not hasattr(lib, "gdrkv_rdma_report"):
        assert report["rdma_why"] == "rdma transport not built in this library"
        return
    assert report["rdma_built"] == 1
    assert report["rdma_library"] == os.environ["GDRKV_IBVERBS_LIB"] == SOFTVERBS
    assert report["rdma_available"] == 1, report.get("rdma_why")
    assert report["devices"]["softverbs0"]["ports"]["1"]["state"] == "ACTIVE"


# ---------------------------------------------------------------- the command

def test_doctor_on_the_fake_tree(tree):
    result = gdrkv("doctor", env={"GDRKV_SYSFS_ROOT": tree})
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    for expected in ("mlx5_0/1", "mlx5_1/1", "InfiniBand", "Ethernet", "0000:81:00.0",
                     "3 ::ffff:192.168.7.11 (RoCE v2, IPv4 192.168.7.11)",
                     "500 free of 512 x 2MiB", "Fake CPU 9000", "nvidia_peermem loaded",
                     "64GiB", "32GiB"):
        assert expected in out, f"{expected!r} not in:\n{out}"
    assert "transparent hugepages  never" in out
    topology = out[out.index("gpu <-> nic pcie distance"):]
    assert any(line.split() == [f"gpu@{GPU_A}", "PIX", "SYS", "mlx5_0"]
               for line in topology.splitlines()), topology
    # Devices in sysfs, but no usable rdma transport (this build, or
    # libibverbs without devices): the self-test is skipped, saying why.
    assert "skipped: the rdma transport is unavailable" in out, out


def test_doctor_json_on_the_fake_tree(tree):
    result = gdrkv("doctor", "--json", "--no-self-test", env={"GDRKV_SYSFS_ROOT": tree})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    devices = by_name(report["rdma"]["devices"])
    assert devices["mlx5_1"]["ports"][0]["chosen_gid"] == 3
    assert devices["mlx5_0"]["ports"][0]["lid"] == 5
    topology = {row["pci"]: row["distances"] for row in report["topology"]}
    assert topology[GPU_B] == {"mlx5_0": "PHB", "mlx5_1": "SYS"}
    assert report["self_test"] == {"ran": False, "reason": "--no-self-test"}
    assert report["sysfs_root"] == tree


def test_doctor_on_an_empty_root_says_no_rdma_plainly(tmp_path):
    result = gdrkv("doctor", env={"GDRKV_SYSFS_ROOT": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert doctor.NO_RDMA in result.stdout
    assert "self-test\n  skipped: no RDMA devices" in result.stdout, result.stdout


@pytest.mark.skipif(HOST_HAS_RDMA, reason="this host has RDMA devices")
def test_doctor_on_this_host_without_rdma():
    result = gdrkv("doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    assert doctor.NO_RDMA in result.stdout
    assert "skipped: no RDMA devices" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(HOST_HAS_RDMA, reason="this host has RDMA devices")
def test_forced_self_test_without_rdma_fails_with_a_reason():
    result = gdrkv("doctor", "--self-test", "--runs", "1")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "FAILED" in result.stdout and "Traceback" not in out, out
    report = json.loads(gdrkv("doctor", "--self-test", "--runs", "1", "--json").stdout)
    failed = [c for c in report["self_test"]["checks"] if not c["ok"]]
    assert report["self_test"]["ok"] is False and failed and failed[0]["detail"], report


def softverbs_env(tmp_path, **settings):
    """The environment of a `gdrkv doctor` whose libibverbs is softverbs."""
    if SOFTVERBS is None:           # conftest.py fails instead under GDRKV_REQUIRE_RDMA=1
        pytest.skip("softverbs not built (no libibverbs-dev)")
    return {"GDRKV_IBVERBS_LIB": SOFTVERBS, "SOFTVERBS_DIR": str(tmp_path), **settings}


def test_doctor_runs_the_self_test_when_rdma_is_there(tree, tmp_path):
    """Devices in sysfs and a libibverbs that works (softverbs): the
    self-test runs unasked, and its failure is the exit code."""
    env = {"GDRKV_SYSFS_ROOT": tree, **softverbs_env(tmp_path)}
    result = gdrkv("doctor", "--runs", "1", env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "self-test (transport=rdma, loopback)" in result.stdout
    assert result.stdout.rstrip().endswith("passed"), result.stdout[-4000:]

    # softverbs refusing to register a slab page: the server cannot start.
    env["SOFTVERBS_MAX_MR_SIZE"] = "65536"
    result = gdrkv("doctor", "--runs", "1", env=env, timeout=300)
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-4000:]
    assert "start a server rdma=on  FAILED  rdma: softverbs0 registers at most 65536" \
        in result.stdout, result.stdout[-4000:]

    result = gdrkv("doctor", "--no-self-test", env=env)
    assert result.returncode == 0 and "self-test (transport" not in result.stdout


# ---------------------------------------------------------------- the self-test itself

def test_self_test_checks_and_sweep_over_tcp():
    """The self-test's body, over tcp (this build has no rdma): every check
    passes and the sweep measures every size."""
    report = doctor_selftest.run(transport="tcp", server_options={}, runs=2, gpu="off")
    assert report["ok"], report["checks"]
    assert len(report["checks"]) == 5
    assert [(row["memory"], row["size"]) for row in report["sweep"]] == \
        [("host", size) for size in doctor_selftest.SWEEP_SIZES]
    assert all(row["put_gbps"] > 0 and row["get_gbps"] > 0 and row["runs"] == 2
               for row in report["sweep"])
    text = doctor.render_self_test({"ran": True, **report})
    assert "1MiB" in text and "READ (get) GB/s" in text and text.endswith("passed")


def test_self_test_catches_a_corrupted_read(monkeypatch):
    real_get = client_module.Client.batch_get

    def corrupting_get(self, keys, ptrs, sizes):
        results = real_get(self, keys, ptrs, sizes)
        last = ptrs[-1] if not isinstance(ptrs[-1], list) else ptrs[-1][-1]
        byte = ctypes.c_uint8.from_address(last)
        byte.value ^= 0xFF
        return results

    monkeypatch.setattr(client_module.Client, "batch_get", corrupting_get)
    report = doctor_selftest.run(transport="tcp", server_options={}, runs=1, gpu="off")
    assert not report["ok"]
    failed = {c["name"]: c["detail"] for c in report["checks"] if not c["ok"]}
    assert any("differ" in detail for detail in failed.values()), report["checks"]
    assert report["sweep"] == []


def test_self_test_reports_a_transport_it_cannot_use():
    report = doctor_selftest.run(transport="no-such-transport", server_options={}, runs=1)
    assert not report["ok"]
    assert "transport" in report["checks"][-1]["detail"], report["checks"]


def test_self_test_over_softverbs(tmp_path):
    """`gdrkv doctor --self-test` with softverbs as libibverbs: its server
    and client move every byte over rdma, and the report says so (verbs
    rows, checks, sweep, the client's rdma counters)."""
    env = softverbs_env(tmp_path)
    result = gdrkv("doctor", "--self-test", "--runs", "1", "--json", env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads(result.stdout)

    verbs = report["rdma"]["verbs"]
    assert (verbs["rdma_built"], verbs["rdma_available"], verbs["rdma_library"]) == \
        (1, 1, SOFTVERBS)
    assert verbs["devices"]["softverbs0"]["ports"]["1"]["state"] == "ACTIVE"

    test = report["self_test"]
    assert test["ok"] and test["transport"] == "rdma", test
    assert [c["name"] for c in test["checks"] if c["ok"]] == [c["name"] for c in test["checks"]]
    assert len(test["checks"]) == 5
    assert [(r["memory"], r["size"], r["runs"]) for r in test["sweep"]] == \
        [("host", size, 1) for size in doctor_selftest.SWEEP_SIZES]
    assert all(r["put_gbps"] > 0 and r["get_gbps"] > 0 for r in test["sweep"])

    # Every byte the self-test wrote and read went over rdma, none fell back.
    counters = test["client_counters"]
    segments = next(c["detail"] for c in test["checks"] if "3 segments" in c["name"])
    objects, size = segments.split()[::3]          # "4 objects of 15007 bytes"
    moved = (2 * sum(doctor_selftest.CHECK_SIZES) + 2 * int(objects) * int(size)
             + sum(2 * r["objects"] * r["size"] * r["runs"] for r in test["sweep"]))
    assert counters["rdma_bytes"] == moved, counters
    assert counters["rdma_open"] >= 1 and counters["rdma_fallback_frames"] == 0
    assert counters["rdma_write_frames"] > 0 and counters["rdma_read_frames"] > 0
    assert counters["rdma_work_requests"] >= counters["rdma_completions"] > 0

    text = gdrkv("doctor", "--self-test", "--runs", "1", env=env, timeout=300).stdout
    assert f"rdma: available through {SOFTVERBS}" in text
    assert any(line.split()[:2] == ["softverbs0/1", "ACTIVE"] for line in text.splitlines())
    assert "self-test (transport=rdma, loopback)" in text
    assert "the client's rdma counters after the test" in text
    assert any(line.split()[:1] == ["rdma_bytes"] and int(line.split()[1]) > 0
               for line in text.splitlines()), text
    assert text.rstrip().endswith("passed")


def test_self_test_rendering_of_a_failure_and_of_rdma_counters():
    test = {"ran": True, "ok": False, "transport": "rdma", "sweep": [],
            "checks": [{"name": "host memory WRITE then READ", "ok": False,
                        "detail": "object 2 differs"}],
            "client_counters": {"rdma_post_calls": 3, "rdma_wrs": 96}}
    text = doctor.render_self_test(test)
    assert "host memory WRITE then READ  FAILED  object 2 differs" in text
    assert "rdma_post_calls  3" in text and "rdma_wrs         96" in text
    assert text.endswith("FAILED") and "bandwidth" not in text


def test_doctor_checks_the_locked_memory_limit_against_the_pool():
    """--pool-size: a process whose RLIMIT_MEMLOCK is below what it may pin
    for GPU copies (and which has no CAP_IPC_LOCK to lift it) is told so,
    with the ways out; one whose limit covers it is not."""
    import resource
    import subprocess
    import sys
    code = ("import resource, sys, json\n"
            "resource.setrlimit(resource.RLIMIT_MEMLOCK, (int(sys.argv[1]), int(sys.argv[1])))\n"
            "from gdrkv.doctor import report\n"
            "report._can_lock = lambda: False\n"
            "print(json.dumps(report._memlock(int(sys.argv[2]))))\n")
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]

    def memlock(limit, plan):
        out = subprocess.run([sys.executable, "-c", code, str(limit), str(plan)],
                             capture_output=True, text=True, timeout=60, check=True)
        return json.loads(out.stdout)

    small = 64 << 20
    if hard != resource.RLIM_INFINITY and hard < small:
        small = hard
    said = memlock(small, 64 << 30)
    assert "below the 64GiB of the pool one process may pin" in said, said
    assert "gpu_pin_limit" in said and "ulimit -l" in said
    assert "may pin" not in memlock(small, small // 2)
