"""A fake /sys and /proc for `gdrkv doctor` and `gdrkv stat --nic`, laid
out the way the kernel does it (class and bus entries are relative
symlinks into /sys/devices), read through GDRKV_SYSFS_ROOT.

PCIe tree (NUMA node in brackets):

  pci0000:00 [0]
    00:01.0 root port - 01:00.0 switch upstream
                          02:08.0 - 05:00.0  GPU A
                          02:10.0 - 06:00.0  mlx5_0 (InfiniBand port)
    00:03.0 root port - 07:00.0  GPU B            (no resource1: BAR1 from `resource`)
  pci0000:80 [1]
    80:01.0 root port - 81:00.0  mlx5_1 (RoCE port)
  pci0000:c0 [1]
    c0:01.0 root port - c1:00.0  GPU C

so GPU A-mlx5_0 is PIX, GPU B-mlx5_0 PHB, GPU C-mlx5_1 NODE, and every
pair across the NUMA nodes SYS.
"""
import os

GPU_A, GPU_B, GPU_C = "0000:05:00.0", "0000:07:00.0", "0000:c1:00.0"
NIC_IB, NIC_ROCE = "0000:06:00.0", "0000:81:00.0"
BAR1_A = 64 << 30
BAR1_B = 32 << 30
BAR1_C = 16 << 30

PCI_PATHS = {
    GPU_A: "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:05:00.0",
    NIC_IB: "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:06:00.0",
    GPU_B: "pci0000:00/0000:00:03.0/0000:07:00.0",
    NIC_ROCE: "pci0000:80/0000:80:01.0/0000:81:00.0",
    GPU_C: "pci0000:c0/0000:c0:01.0/0000:c1:00.0",
}
NUMA = {GPU_A: 0, NIC_IB: 0, GPU_B: 0, NIC_ROCE: 1, GPU_C: 1}

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# index: (gid, type, netdev). The gdrkv/NCCL choice is 3: RoCE v2 and IPv4-mapped.
ROCE_GIDS = {
    0: ("fe80:0000:0000:0000:0e42:a1ff:fe65:4a8d", "IB/RoCE v1", "eth2"),
    1: ("fe80:0000:0000:0000:0e42:a1ff:fe65:4a8d", "RoCE v2", "eth2"),
    2: ("0000:0000:0000:0000:0000:ffff:c0a8:070b", "IB/RoCE v1", "eth2"),
    3: ("0000:0000:0000:0000:0000:ffff:c0a8:070b", "RoCE v2", "eth2"),
    4: ("2001:0db8:0000:0000:0000:0000:0000:0011", "RoCE v2", "eth2"),
}
IB_GID0 = "fe80:0000:0000:0000:0c42:a103:0065:4a8c"

# port_*_data in 4-octet words.
COUNTERS = {
    "mlx5_0": {"port_xmit_data": 1 << 28, "port_rcv_data": 3 << 20,
               "port_xmit_packets": 262144, "port_rcv_packets": 1000},
    "mlx5_1": {"port_xmit_data": 5 << 20, "port_rcv_data": 7 << 28,
               "port_xmit_packets": 4242, "port_rcv_packets": 777777},
}
HW_COUNTERS = {
    "mlx5_0": {"rx_read_requests": 1234, "rx_write_requests": 5678, "out_of_buffer": 0},
    "mlx5_1": {"rx_read_requests": 91011, "rx_write_requests": 1213, "rx_atomic_requests": 0,
               "np_cnp_sent": 14},
}


def write(root, path, text):
    full = os.path.join(root, path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as f:
        f.write(text + "\n")
    return full


def link(root, path, target):
    """A relative symlink at path to target (both host paths), as sysfs has."""
    full = os.path.join(root, path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    os.symlink(os.path.relpath(os.path.join(root, target.lstrip("/")), os.path.dirname(full)),
               full)


def device_dir(address):
    return f"/sys/devices/{PCI_PATHS[address]}"


def build(root):
    """Writes the whole tree under root (a str) and returns root."""
    root = str(root)
    for address, numa in NUMA.items():
        base = device_dir(address)
        write(root, f"{base}/numa_node", str(numa))
        link(root, f"/sys/bus/pci/devices/{address}", base)
    for address in (GPU_A, GPU_B, GPU_C):
        base = device_dir(address)
        write(root, f"{base}/vendor", "0x10de")
        write(root, f"{base}/class", "0x030200")
    # BAR1 sizes: A and C from their resource1 file's size (sparse), B from `resource`.
    for address, size in ((GPU_A, BAR1_A), (GPU_C, BAR1_C)):
        with open(write(root, f"{device_dir(address)}/resource1", ""), "r+") as f:
            f.truncate(size)
    start = 0x38000000000
    write(root, f"{device_dir(GPU_B)}/resource",
          "0x00000000d8000000 0x00000000d8ffffff 0x0000000000040200\n"
          f"0x{start:016x} 0x{start + BAR1_B - 1:016x} 0x000000000014220c\n"
          "0x0000000000000000 0x0000000000000000 0x0000000000000000")
    for address in (NIC_IB, NIC_ROCE):
        write(root, f"{device_dir(address)}/vendor", "0x15b3")
        write(root, f"{device_dir(address)}/class", "0x020700")
    # An NVIDIA audio function must not count as a GPU.
    write(root, "/sys/devices/pci0000:00/0000:00:03.0/0000:07:00.1/vendor", "0x10de")
    write(root, "/sys/devices/pci0000:00/0000:00:03.0/0000:07:00.1/class", "0x040300")
    link(root, "/sys/bus/pci/devices/0000:07:00.1",
         "/sys/devices/pci0000:00/0000:00:03.0/0000:07:00.1")

    _rdma_device(root, "mlx5_0", NIC_IB, "ib0", link_layer="InfiniBand",
                 rate="200 Gb/sec (4X HDR)", lid="0x5",
                 gids={0: (IB_GID0, "IB/RoCE v1", "")})
    _rdma_device(root, "mlx5_1", NIC_ROCE, "eth2", link_layer="Ethernet",
                 rate="100 Gb/sec (4X EDR)", lid="0x0", gids=ROCE_GIDS)

    write(root, "/proc/meminfo", "MemTotal:       65536000 kB\nMemAvailable:   60000000 kB\n"
          "HugePages_Total:     512\nHugePages_Free:      500\nHugepagesize:       2048 kB")
    write(root, "/proc/cpuinfo", "processor\t: 0\nmodel name\t: Fake CPU 9000")
    write(root, "/proc/modules",
          "ib_core 491520 8 rdma_ucm,ib_uverbs, Live 0x0000000000000000\n"
          "nvidia_peermem 16384 0 - Live 0x0000000000000000 (OE)")
    write(root, "/sys/kernel/mm/transparent_hugepage/enabled", "always madvise [never]")
    return root


def _rdma_device(root, name, address, netdev, link_layer, rate, lid, gids):
    base = f"{device_dir(address)}/infiniband/{name}"
    link(root, f"/sys/class/infiniband/{name}", base)
    link(root, f"{base}/device", device_dir(address))
    write(root, f"{device_dir(address)}/net/{netdev}/mtu", "4096")
    write(root, f"{base}/node_type", "1: CA")
    write(root, f"{base}/fw_ver", "28.39.1002")
    port = f"{base}/ports/1"
    write(root, f"{port}/state", "4: ACTIVE")
    write(root, f"{port}/phys_state", "5: LinkUp")
    write(root, f"{port}/link_layer", link_layer)
    write(root, f"{port}/rate", rate)
    write(root, f"{port}/lid", lid)
    for index in range(8):
        gid, gid_type, ndev = gids.get(index, (ZERO_GID, None, None))
        write(root, f"{port}/gids/{index}", gid)
        # The kernel fails reads of an unpopulated entry's type (EINVAL);
        # here the file is simply absent.
        if gid_type:
            write(root, f"{port}/gid_attrs/types/{index}", gid_type)
        if ndev:
            write(root, f"{port}/gid_attrs/ndevs/{index}", ndev)
    set_counters(root, name, COUNTERS[name], HW_COUNTERS[name])


def set_counters(root, name, counters=None, hw_counters=None):
    port = f"/sys/class/infiniband/{name}/ports/1"
    for counter, value in (counters or {}).items():
        write(str(root), f"{port}/counters/{counter}", str(value))
    for counter, value in (hw_counters or {}).items():
        write(str(root), f"{port}/hw_counters/{counter}", str(value))
