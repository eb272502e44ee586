"""gdrkv://local, the embedded default: the first client on a machine
starts a store server daemon (`gdrkv serve` in a session of its own, so it
outlives the process that started it) and every later client, in any
process, reuses it, over shm through its unix socket.

gdrkv://local means 127.0.0.1:7480; gdrkv://local:PORT picks the port. The
daemon's pool is GDRKV_LOCAL_MEMORY bytes (default: what `gdrkv serve`
picks), its log and pid file sit next to its socket, and it runs until
someone stops it (SIGTERM: `kill $(cat <dir>/<port>.pid)`).
"""
import fcntl
import os
import socket
import subprocess
import sys
import time

from .errors import E_UNAVAILABLE, GdrkvError

DEFAULT_PORT = 7480
START_TIMEOUT_S = 60
_POLL_S = 0.05
# Daemons this process started: held so Python never warns that a child it
# forgot about is still running (it is meant to be).
_started = []


def runtime_dir():
    """Where the daemon's socket, log and pid file live: the rule the C
    side follows for default socket paths (gk_unix_default_path)."""
    return os.environ.get("GDRKV_RUNTIME_DIR") or f"/tmp/gdrkv-{os.geteuid()}"


def ensure_server(port=DEFAULT_PORT):
    """The "host:port" of the local daemon on port, started now when none
    answers on its unix socket."""
    directory = runtime_dir()
    sock_path = os.path.join(directory, f"{port}.sock")
    if not _answers(sock_path):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        # One starter at a time; the others find the daemon it started.
        with open(os.path.join(directory, f"{port}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _answers(sock_path):
                _start(directory, port, sock_path)
    return f"127.0.0.1:{port}"


def _answers(sock_path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(sock_path)
            return True
        except OSError:
            return False


def _start(directory, port, sock_path):
    log_path = os.path.join(directory, f"{port}.log")
    command = [sys.executable, "-m", "gdrkv", "serve", "--listen", f"127.0.0.1:{port}",
               "--no-pretouch"]
    if os.environ.get("GDRKV_LOCAL_MEMORY"):
        command += ["--memory", os.environ["GDRKV_LOCAL_MEMORY"]]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)
    _started.append(proc)
    with open(os.path.join(directory, f"{port}.pid"), "w") as f:
        f.write(f"{proc.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(sock_path):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise GdrkvError(E_UNAVAILABLE, f"the local gdrkv server did not start on port {port} "
                                            f"(see {log_path})")
        time.sleep(_POLL_S)
