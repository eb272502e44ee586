"""How far apart two PCIe devices are, from their paths under /sys/devices,
in the words of `nvidia-smi topo -m`:

  PIX   both hang off the same PCIe bridge (in practice: one PCIe switch)
  PXB   several bridges apart, but below one host bridge
  PHB   only the host bridge (the CPU's root complex) is shared
  NODE  different host bridges of the same NUMA node
  SYS   different NUMA nodes (traffic crosses the socket interconnect)

A device's sysfs path is its chain of ancestors, e.g.
/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:05:00.0
is host bridge pci0000:00, root port 00:01.0, switch upstream port 01:00.0,
switch downstream port 02:08.0, then the device. Two devices below the
same switch share its upstream port and each reach it through one
downstream port: that is PIX.
"""

DISTANCES = ("PIX", "PXB", "PHB", "NODE", "SYS")
LEGEND = {
    "PIX": "same PCIe switch",
    "PXB": "several PCIe bridges, same host bridge",
    "PHB": "through the host bridge (CPU root complex)",
    "NODE": "across host bridges within one NUMA node",
    "SYS": "across NUMA nodes",
}


def chain(sys_path):
    """The ancestors of a /sys/devices/... path, host bridge first, or None
    when it is not a PCI device path."""
    if not sys_path:
        return None
    parts = [p for p in sys_path.split("/") if p]
    if len(parts) < 4 or parts[:2] != ["sys", "devices"] or not parts[2].startswith("pci"):
        return None
    return parts[2:]


def distance(path_a, numa_a, path_b, numa_b):
    """One of DISTANCES for two /sys/devices paths and their NUMA nodes
    (None when unknown), or None when a path is not a PCI device path."""
    a, b = chain(path_a), chain(path_b)
    if a is None or b is None:
        return None
    if a[0] != b[0]:
        # Unknown NUMA nodes (None, or -1 on single-node machines) count as one node.
        return "NODE" if numa_a == numa_b else "SYS"
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    if common == 1:
        return "PHB"
    # Below the shared bridge a[common - 1]: each device is at most one
    # bridge (a switch's downstream port) further down for PIX.
    if len(a) - common <= 2 and len(b) - common <= 2:
        return "PIX"
    return "PXB"


def rank(dist):
    """Smaller is closer; unknown sorts last."""
    return DISTANCES.index(dist) if dist in DISTANCES else len(DISTANCES)
