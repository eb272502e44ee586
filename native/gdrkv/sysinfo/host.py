"""What the host is: its CPU model (for benchmark reports and doctor)."""
from . import fs


def cpu_model():
    for line in fs.lines("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return "unknown"
