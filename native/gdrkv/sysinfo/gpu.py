"""GPU facts for `gdrkv doctor`: NVIDIA PCI devices from sysfs, what the
CUDA driver says about them (ctypes on libcuda.so.1, nothing to build),
BAR1 sizes and whether nvidia-peermem is loaded.
"""
import ctypes
import re
import shutil
import subprocess

from . import fs

PCI_DIR = "/sys/bus/pci/devices"
NVIDIA_VENDOR = 0x10de
# PCI class 0x0300xx VGA controller, 0x0302xx 3D controller (data-centre GPUs).
GPU_CLASSES = (0x0300, 0x0302)

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116
CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124
HOPPER_MAJOR = 9
_NVIDIA_SMI_TIMEOUT_S = 20


def normalize_bus_id(text):
    """"00000000:3B:00.0" (nvidia-smi), "0000:3b:00.0" (CUDA, sysfs) -> "0000:3b:00.0"."""
    m = re.fullmatch(r"\s*([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])\s*", text or "")
    if not m:
        return None
    domain, bus, dev, fn = (int(x, 16) for x in m.groups())
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def pci_gpus():
    """NVIDIA GPUs on the PCI bus: [{"pci", "sys_path", "numa_node", "bar1_bytes"}]."""
    gpus = []
    for address in fs.listdir(PCI_DIR):
        base = f"{PCI_DIR}/{address}"
        pci_class = fs.read_int(f"{base}/class")
        if fs.read_int(f"{base}/vendor") != NVIDIA_VENDOR or pci_class is None \
                or pci_class >> 8 not in GPU_CLASSES:
            continue
        numa = fs.read_int(f"{base}/numa_node")
        gpus.append({
            "pci": normalize_bus_id(address) or address,
            "sys_path": fs.resolve(base),
            "numa_node": numa if numa is not None and numa >= 0 else None,
            "bar1_bytes": bar1_from_sysfs(base),
        })
    return gpus


def bar1_from_sysfs(base):
    """BAR1's size: the size of the resource1 file, else from line 1 of
    `resource` ("start end flags" in hex)."""
    size = fs.size(f"{base}/resource1")
    if size:
        return size
    rows = fs.lines(f"{base}/resource")
    if len(rows) > 1:
        try:
            start, end = (int(x, 16) for x in rows[1].split()[:2])
        except ValueError:
            return None
        return end - start + 1 if end > start else None
    return None


def bar1_from_nvidia_smi():
    """{"0000:3b:00.0": bytes} from `nvidia-smi -q -d MEMORY`, {} without it."""
    tool = shutil.which("nvidia-smi")
    if not tool:
        return {}
    try:
        out = subprocess.run([tool, "-q", "-d", "MEMORY"], capture_output=True, text=True,
                             timeout=_NVIDIA_SMI_TIMEOUT_S, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_nvidia_smi_bar1(out)


def parse_nvidia_smi_bar1(text):
    sizes, gpu, in_bar1 = {}, None, False
    for line in text.splitlines():
        m = re.match(r"^GPU\s+([0-9a-fA-F]+:[0-9a-fA-F]+:[0-9a-fA-F]+\.[0-7])\s*$", line)
        if m:
            gpu, in_bar1 = normalize_bus_id(m.group(1)), False
            continue
        stripped = line.strip()
        if not line.startswith(" " * 8) and stripped:
            # A section heading ("    BAR1 Memory Usage") is indented less than its fields.
            in_bar1 = stripped.startswith("BAR1 Memory Usage")
            continue
        m = re.match(r"^Total\s*:\s*(\d+)\s*MiB", stripped)
        if in_bar1 and gpu and m:
            sizes[gpu] = int(m.group(1)) << 20
    return sizes


def cuda_devices(library="libcuda.so.1"):
    """{"driver_version": int, "devices": [...]} from the CUDA driver API, or
    {"error": why}. Each device: ordinal, name, pci, compute capability,
    total memory, dma_buf and gpudirect_rdma (CUDA's own verdicts)."""
    try:
        cuda = ctypes.CDLL(library)
    except OSError as e:
        return {"error": f"{library} not loadable ({e})"}
    try:
        return _query_cuda(cuda)
    except (_CudaError, AttributeError) as e:
        return {"error": str(e)}


class _CudaError(Exception):
    pass


def _query_cuda(cuda):
    def call(name, *args):
        rc = getattr(cuda, name)(*args)
        if rc != 0:
            raise _CudaError(f"{name} failed with CUresult {rc}")

    call("cuInit", 0)
    version, count = ctypes.c_int(), ctypes.c_int()
    call("cuDriverGetVersion", ctypes.byref(version))
    call("cuDeviceGetCount", ctypes.byref(count))
    devices = []
    for ordinal in range(count.value):
        dev = ctypes.c_int()
        call("cuDeviceGet", ctypes.byref(dev), ordinal)
        name, bus_id = ctypes.create_string_buffer(256), ctypes.create_string_buffer(64)
        call("cuDeviceGetName", name, len(name), dev)
        call("cuDeviceGetPCIBusId", bus_id, len(bus_id), dev)
        total = ctypes.c_size_t()
        call("cuDeviceTotalMem_v2", ctypes.byref(total), dev)

        def attribute(number):
            value = ctypes.c_int()
            # An old driver answers CUDA_ERROR_INVALID_VALUE for an attribute it predates.
            if cuda.cuDeviceGetAttribute(ctypes.byref(value), number, dev) != 0:
                return None
            return value.value

        major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        devices.append({
            "ordinal": ordinal,
            "name": name.value.decode(errors="replace"),
            "pci": normalize_bus_id(bus_id.value.decode(errors="replace")),
            "compute_capability": f"{major}.{minor}" if major is not None else None,
            "memory_bytes": total.value,
            "dma_buf": _flag(attribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)),
            "gpudirect_rdma": _flag(attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED)),
            # Before Hopper a completed RDMA write may not be visible to
            # kernels yet: the transport adds one flush READ per batch.
            "needs_flush_read": None if major is None else major < HOPPER_MAJOR,
        })
    return {"driver_version": version.value, "devices": devices}


def _flag(value):
    return None if value is None else bool(value)


def gpus(cuda=None, smi_bar1=None):
    """The GPUs, CUDA's view joined with sysfs by PCI address: sysfs gives
    the PCIe path and NUMA node, CUDA the name and capabilities. A GPU that
    sysfs shows but CUDA doesn't (CUDA_VISIBLE_DEVICES, a container) is
    listed with "ordinal": None."""
    cuda = cuda_devices() if cuda is None else cuda
    smi_bar1 = bar1_from_nvidia_smi() if smi_bar1 is None else smi_bar1
    by_pci = {g["pci"]: g for g in pci_gpus()}
    listed = []
    for dev in cuda.get("devices", []):
        entry = {"sys_path": None, "numa_node": None, "bar1_bytes": None,
                 **by_pci.pop(dev["pci"], {}), **dev}
        listed.append(entry)
    listed += [{"ordinal": None, "name": None, **g} for g in by_pci.values()]
    for entry in listed:
        if entry["pci"] in smi_bar1:
            entry["bar1_bytes"] = smi_bar1[entry["pci"]]
            entry["bar1_from"] = "nvidia-smi"
        elif entry.get("bar1_bytes"):
            entry["bar1_from"] = "sysfs resource1"
    return listed


def peermem():
    """Which GPUDirect peer-memory module is loaded ("nvidia_peermem", the
    older "nv_peer_mem"), or None. ibv_reg_mr on GPU memory needs one;
    dma-buf registration does not."""
    loaded = {line.split()[0] for line in fs.lines("/proc/modules") if line.split()}
    for module in ("nvidia_peermem", "nv_peer_mem"):
        if module in loaded or fs.exists(f"/sys/module/{module}"):
            return module
    return None
