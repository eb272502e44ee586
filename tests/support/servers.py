"""Real `gdrkv serve` processes for the tests (ServerProcess, ServerSet,
which the conftest fixtures wrap) and the misbehaving fake servers of the
fail-soft tests (FakeServer)."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from support import wire
from support.util import unique, wait_for

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
LISTEN_LINE = re.compile(rb"^gdrkv listening on (\S+)", re.M)
SHM_LINE = re.compile(rb"^gdrkv listening on .*shm on ([^,\s)]+)", re.M)
PR_SET_PDEATHSIG = 1

# Started in front of a server's command: the kernel SIGKILLs the server when
# pytest dies, so none outlives an aborted run (the setting survives exec).
# Not a preexec_fn: Python code between fork and exec can deadlock in a
# process with threads (the suite has many, ASan more), and Popen then waits
# for that child forever.
# util-linux's setpriv sets it and execs the server; where it is missing, a
# Python child does the same at the cost of one more interpreter start per
# server (hundreds in a pass).
SETPRIV = shutil.which("setpriv")
DIE_WITH_PARENT = ([SETPRIV, "--pdeathsig", "KILL", "--"] if SETPRIV else
                   [sys.executable, "-c",
                    "import ctypes, os, sys; "
                    f"ctypes.CDLL(None).prctl({PR_SET_PDEATHSIG}, {int(signal.SIGKILL)}); "
                    "os.execv(sys.argv[1], sys.argv[1:])"])


class ServerProcess:
    """One `gdrkv serve` child. stdout and stderr go to files, never pipes,
    so a chatty server can never block on a full pipe."""

    def __init__(self, workdir, memory, args):
        self.workdir, self.memory, self.args = workdir, memory, list(args)
        self.name = unique("server")
        # GDRKV_TEST_POOL_FILE=1 runs every server on a pool file (tmpfs),
        # so that a suite proves the transports over a file-backed pool.
        self.pool_file = None
        if os.environ.get("GDRKV_TEST_POOL_FILE") == "1" and "--pool-file" not in self.args:
            self.pool_file = f"/dev/shm/gdrkv-test-{os.getpid()}-{self.name}.pool"
            self.args += ["--pool-file", self.pool_file]
        self.proc = None
        self.address = None
        self.must_exit_cleanly = False

    @property
    def url(self):
        return f"gdrkv://{self.address}"

    @property
    def unix_path(self):
        """The shm socket it announced, or None."""
        match = SHM_LINE.search(self.stdout())
        return match.group(1).decode() if match else None

    @property
    def port(self):
        return int(self.address.rsplit(":", 1)[1])

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self, listen="127.0.0.1:0"):
        cmd = [sys.executable, "-m", "gdrkv", "serve", "--listen", listen,
               "--memory", str(self.memory), "--no-pretouch", *self.args]
        with open(self.out_path, "wb") as out, open(self.log_path, "ab") as err:
            self.proc = subprocess.Popen(DIE_WITH_PARENT + cmd, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=err)
        self.must_exit_cleanly = True
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            match = LISTEN_LINE.search(self.stdout())
            if match:
                self.address = match.group(1).decode()
                return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{' '.join(cmd)} did not start:\n{self.log_tail()}")
            time.sleep(0.02)

    @property
    def out_path(self):
        return os.path.join(self.workdir, self.name + ".out")

    def stdout(self):
        with open(self.out_path, "rb") as f:
            return f.read()

    @property
    def log_path(self):
        return os.path.join(self.workdir, self.name + ".log")

    def log_tail(self, nbytes=4000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-nbytes:].decode(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def token(self):
        """The bytes of its --auth-token-file, or None."""
        args = list(self.args)
        if "--auth-token-file" not in args:
            return None
        with open(args[args.index("--auth-token-file") + 1], "rb") as f:
            return f.read().rstrip()

    def stats(self):
        return wire.server_stats(self.address, token=self.token)

    def kill(self):
        """SIGKILL, as a crash would; teardown then expects it dead."""
        self.must_exit_cleanly = False
        if self.alive:
            self.proc.kill()
        if self.proc:
            self.proc.wait(STOP_TIMEOUT_S)

    def restart(self):
        """Starts again on the same address (after kill() or stop())."""
        if self.alive:
            self.stop()
        return self.start(self.address)

    def stop(self, sig=signal.SIGTERM):
        """Sends sig and waits; returns the exit code, or None when it had
        to be SIGKILLed. Teardown then expects it stopped."""
        self.must_exit_cleanly = False
        if not self.alive:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGCONT)   # in case a test left it stopped
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def shutdown_problem(self):
        """Stops the server; what went wrong, or None."""
        if not self.must_exit_cleanly:      # the test killed or stopped it
            self.stop()
            return None
        if not self.alive:
            return f"{self.address} died during the test (exit {self.proc.returncode}):\n" \
                   f"{self.log_tail()}"
        rc = self.stop()
        if rc != 0:
            return f"{self.address} exited {rc} on SIGTERM:\n{self.log_tail()}"
        return None


def remove_stale_socket(path):
    """A killed server leaves its socket file behind; a live one (its port
    may have gone to another server since) is left alone."""
    if not path:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)
        except OSError:
            pass                        # already gone


def freeze(proc):
    """SIGSTOP, waiting until every thread has stopped: kill() returns before
    they do, and a worker still running would answer the next request."""
    proc.send_signal(signal.SIGSTOP)
    tasks = f"/proc/{proc.pid}/task"

    def state(tid):
        with open(f"{tasks}/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    wait_for(lambda: all(state(tid) in "Tt" for tid in os.listdir(tasks)), 5,
             "the server's threads to stop")


class ServerSet:
    def __init__(self, workdir):
        self.workdir = workdir
        self.servers = []

    def start(self, memory="64MiB", args=(), listen="127.0.0.1:0"):
        server = ServerProcess(self.workdir, memory, args)
        self.servers.append(server)
        return server.start(listen)

    def stop_all(self):
        problems = [p for p in (s.shutdown_problem() for s in self.servers) if p]
        for server in self.servers:
            remove_stale_socket(server.unix_path)
            if server.pool_file and os.path.exists(server.pool_file):
                os.unlink(server.pool_file)
        assert not problems, "\n\n".join(problems)


class FakeServer:
    """A listening socket whose connections are each handed to behaviour(conn)
    in a thread: the misbehaving servers of the fail-soft tests. The client
    going away ends a behaviour quietly; anything else it raises (a request
    it could not parse, a broken fake) fails the test at teardown."""

    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.url = "gdrkv://" + self.address
        self.conns = []
        self.errors = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return                      # listener closed
            conn = wire.Conn(sock, timeout=30)
            self.conns.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, conn):
        try:
            self.behaviour(conn)
        except (OSError, wire.PeerClosed):
            pass                            # the client went away
        except BaseException as e:          # re-raised by close()
            self.errors.append(e)

    def close(self):
        # shutdown() wakes the accept() blocked in the other thread; close() alone does not.
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for conn in self.conns:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        for thread in self.threads:
            thread.join(5)
        if self.errors:
            raise self.errors[0]


def drain(conn):
    """Reads and discards until the peer closes."""
    while conn.sock.recv(1 << 16):
        pass
