"""Byte sizes as people write them: "1GiB", "512MiB", "64M", "1G", "4096".

Every unit is binary (K = KiB = KB = 1024): memory is sized in powers of two
and nobody means 10**9 bytes when sizing a pool.
"""
import os
import re

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|b)?\s*", re.IGNORECASE)


def parse_size(value):
    """Bytes in value (an int, or a string such as "1GiB"); ValueError if
    it is not a size."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative: {value}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"not a size: {value!r}")
    m = _SIZE_RE.fullmatch(value)
    if m is None:
        raise ValueError(f"not a size: {value!r} (examples: 4096, 64KiB, 512MiB, 1G)")
    number, unit = m.group(1), _UNITS[(m.group(2) or "").lower()]
    # Whole numbers stay exact; only fractions ("1.5G") go through float.
    return int(number) * unit if number.isdigit() else int(float(number) * unit)


def format_size(nbytes):
    """The shortest exact-enough spelling: 4096 -> "4KiB", 1.5 GiB -> "1.5GiB"."""
    for suffix, unit in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= unit:
            return f"{round(nbytes / unit, 2):g}{suffix}"
    return f"{nbytes}B"


def physical_memory():
    """Bytes of RAM in this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
