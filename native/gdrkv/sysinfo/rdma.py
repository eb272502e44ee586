"""RDMA devices, ports, GIDs and traffic counters as the kernel shows them
in /sys/class/infiniband (read through sysinfo_fs, so under
$GDRKV_SYSFS_ROOT). Pure reading: nothing here opens a device.
"""
import ipaddress
import os
import re

from . import fs

CLASS_DIR = "/sys/class/infiniband"
# sysfs counts port_xmit_data and port_rcv_data in units of 4 octets (IBTA
# PortCounters: "divided by 4").
DATA_UNIT = 4
TRAFFIC_COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets")
# hw_counters an operator reads first: the RDMA operations that arrived.
FIRST_HW_COUNTERS = ("rx_read_requests", "rx_write_requests", "rx_atomic_requests")
ROCE_V2 = "RoCE v2"
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def devices():
    """Every RDMA device: [{"name", "pci", "sys_path", "numa_node", "ports": [...]}]."""
    return [device(name) for name in fs.listdir(CLASS_DIR)]


def device(name):
    base = f"{CLASS_DIR}/{name}"
    sys_path = fs.resolve(f"{base}/device")
    address = os.path.basename(sys_path) if sys_path else None
    numa = fs.read_int(f"{base}/device/numa_node")
    return {
        "name": name,
        "pci": address if address and _PCI_ADDRESS.match(address) else None,
        "sys_path": sys_path,
        "numa_node": numa if numa is not None and numa >= 0 else None,
        "node_type": fs.read(f"{base}/node_type"),
        "fw_ver": fs.read(f"{base}/fw_ver"),
        "netdevs": fs.listdir(f"{base}/device/net"),
        "ports": [port(name, p) for p in _port_numbers(name)],
    }


def _port_numbers(name):
    return sorted(int(p) for p in fs.listdir(f"{CLASS_DIR}/{name}/ports") if p.isdigit())


def port(name, number):
    base = f"{CLASS_DIR}/{name}/ports/{number}"
    link_layer = fs.read(f"{base}/link_layer")
    gids = port_gids(name, number)
    info = {
        "port": number,
        # "4: ACTIVE" and "5: LinkUp": the words are what people know.
        "state": _after_colon(fs.read(f"{base}/state")),
        "phys_state": _after_colon(fs.read(f"{base}/phys_state")),
        "link_layer": link_layer,
        "rate": fs.read(f"{base}/rate"),
        "lid": fs.read_int(f"{base}/lid"),
        "gids": gids,
    }
    info["chosen_gid"], info["chosen_gid_why"] = choose_gid(link_layer, gids)
    return info


def _after_colon(text):
    if text is None:
        return None
    return text.partition(":")[2].strip() if ":" in text else text


def port_gids(name, number):
    """The port's populated GIDs: [{"index", "gid", "type", "ndev", "ipv4"}].
    Unpopulated entries (all zeros; their type file can't even be read) are
    left out."""
    base = f"{CLASS_DIR}/{name}/ports/{number}"
    entries = []
    for index in sorted(int(i) for i in fs.listdir(f"{base}/gids") if i.isdigit()):
        text = fs.read(f"{base}/gids/{index}")
        try:
            address = ipaddress.IPv6Address(text)
        except (ipaddress.AddressValueError, ValueError, TypeError):
            continue
        if int(address) == 0:
            continue
        mapped = address.ipv4_mapped
        entries.append({
            "index": index,
            # "::ffff:192.168.7.11" rather than Python's "::ffff:c0a8:70b".
            "gid": f"::ffff:{mapped}" if mapped else str(address),
            "type": fs.read(f"{base}/gid_attrs/types/{index}"),
            "ndev": fs.read(f"{base}/gid_attrs/ndevs/{index}"),
            "ipv4": str(mapped) if mapped else None,
            "link_local": address.is_link_local,
        })
    return entries


def choose_gid(link_layer, gids):
    """(GID index, why) as gdrkv picks it, the way NCCL does: on RoCE a
    RoCE v2 GID with an IPv4-mapped address first (routable, and what the
    switches' ECN/PFC setup expects), then RoCE v2 with a global IPv6
    address, then any RoCE v2, then whatever is left; $GDRKV_IB_GID_INDEX
    overrides. InfiniBand addresses by LID, so GID 0 (the port GID) is only
    used for a GRH."""
    override = os.environ.get("GDRKV_IB_GID_INDEX")
    if override is not None and override.strip().isdigit():
        index = int(override)
        if any(g["index"] == index for g in gids):
            return index, f"GDRKV_IB_GID_INDEX={index}"
        return None, f"GDRKV_IB_GID_INDEX={index} names no populated GID on this port"
    if link_layer == "InfiniBand":
        return (0, "InfiniBand: addressed by LID") if gids else (None, "InfiniBand, no GID")
    if not gids:
        return None, "no populated GID (is the netdev up with an address?)"

    def rank(g):
        return (g["type"] != ROCE_V2, g["ipv4"] is None, g["link_local"], g["index"])

    best = min(gids, key=rank)
    kind = [best["type"] or "unknown type"]
    kind.append(f"IPv4 {best['ipv4']}" if best["ipv4"] else
                "link-local IPv6" if best["link_local"] else "global IPv6")
    return best["index"], ", ".join(kind)


def port_counters(name, number):
    """A port's traffic counters: {"counters": {sysfs name: value},
    "hw_counters": {name: value}, "xmit_bytes", "rcv_bytes"}."""
    base = f"{CLASS_DIR}/{name}/ports/{number}"
    counters = {}
    for counter in TRAFFIC_COUNTERS:
        value = fs.read_int(f"{base}/counters/{counter}")
        if value is not None:
            counters[counter] = value
    hw = {}
    for counter in fs.listdir(f"{base}/hw_counters"):
        value = fs.read_int(f"{base}/hw_counters/{counter}")
        if value is not None:
            hw[counter] = value
    first = [c for c in FIRST_HW_COUNTERS if c in hw]
    hw = {c: hw[c] for c in first + [c for c in hw if c not in first]}
    sample = {"counters": counters, "hw_counters": hw}
    for direction in ("xmit", "rcv"):
        words = counters.get(f"port_{direction}_data")
        sample[f"{direction}_bytes"] = None if words is None else words * DATA_UNIT
    return sample


def all_port_counters():
    """{"dev/port": port_counters(dev, port)} for every port."""
    return {f"{name}/{number}": port_counters(name, number)
            for name in fs.listdir(CLASS_DIR) for number in _port_numbers(name)}
