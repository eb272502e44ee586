"""Every /sys and /proc read of `gdrkv doctor` and `gdrkv stat --nic` goes
through here, under $GDRKV_SYSFS_ROOT (default "/"), so tests can point it
at a fake tree. Paths are written as on the host ("/sys/class/...").

Reads never raise: a missing or unreadable file is the default. Kernel
attribute files fail in odd ways (EINVAL for an unpopulated GID type,
EACCES, ENODEV for a device going away), and a report shows what it could
read rather than stopping at the first such file.
"""
import os


def root():
    return os.environ.get("GDRKV_SYSFS_ROOT") or "/"


def host_path(path):
    """Where the host path `path` ("/sys/...") is under the root."""
    return os.path.join(root(), path.lstrip("/"))


def read(path, default=None):
    """The file's text, stripped; default when it can't be read."""
    try:
        with open(host_path(path), encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return default


def read_int(path, default=None):
    """The file's integer (decimal, or hex with 0x); default otherwise."""
    text = read(path)
    try:
        return int(text, 0) if text else default
    except ValueError:
        return default


def lines(path):
    text = read(path)
    return text.splitlines() if text else []


def listdir(path):
    """The entries of a directory, sorted; [] when it is missing."""
    try:
        return sorted(os.listdir(host_path(path)))
    except OSError:
        return []


def exists(path):
    return os.path.exists(host_path(path))


def size(path):
    """A file's size (for sysfs resourceN files, the BAR size), or None."""
    try:
        return os.stat(host_path(path)).st_size
    except OSError:
        return None


def resolve(path):
    """The host path that `path` resolves to through symlinks (sysfs class
    and bus entries lead to /sys/devices/...), or None when it does not
    exist or leads outside the root."""
    real_root = os.path.realpath(root())
    target = os.path.realpath(host_path(path))
    if not os.path.exists(target):
        return None
    inside = os.path.relpath(target, real_root)
    if inside == ".." or inside.startswith("../"):
        return None
    return "/" if inside == "." else "/" + inside
