"""PINS: local client processes tell the server what they pin of its pool
(registered with CUDA for GPU copies), and `gdrkv stat` and /metrics show
the totals. Real server and client processes; the reports are sent raw,
the way a hostile or broken client could send them too. (The real
client's reports, sent as its GPU slices register, are tested in
tests/native/test_client.c with CUDA stubbed, and on a GPU host in
tests/gpu.)"""
import json
import pathlib
import re
import subprocess
import sys
import textwrap
import urllib.request

from gdrkv import errors
from support import wire
from support.util import run_gdrkv, stat, wait_for

MiB = 1 << 20
POOL = 64 * MiB

# A client process: one unix connection per line "open", reports by
# "report CONN MAPPING SEQ BYTES" (answering the status and message), and
# "close CONN". Stops at end of input.
REPORTER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    from support import wire
    conns = []
    for line in sys.stdin:
        word, *args = line.split()
        if word == "open":
            conns.append(wire.connect_unix(sys.argv[1]))
            print("opened", flush=True)
        elif word == "report":
            conn, mapping, seq, nbytes = (int(a) for a in args)
            conns[conn].send(wire.pins_request(mapping, seq, nbytes))
            hdr, body, _ = conns[conn].read_frame()
            print(hdr.status, body.decode() or "-", flush=True)
        elif word == "close":
            conns[int(args[0])].close()
            print("closed", flush=True)
""")


class Reporter:
    """A client process of its own (its own pid, as the server sees it)."""

    def __init__(self, server):
        support_dir = str(pathlib.Path(__file__).resolve().parents[1])
        self.proc = subprocess.Popen([sys.executable, "-c", REPORTER, server.unix_path,
                                      support_dir], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def say(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        assert answer, f"the reporter process died on {line!r}"
        return answer

    def open(self):
        assert self.say("open") == "opened"

    def report(self, mapping, seq, nbytes, conn=0):
        status, message = self.say(f"report {conn} {mapping} {seq} {nbytes}").split(" ", 1)
        return int(status), message

    def close(self, conn=0):
        assert self.say(f"close {conn}") == "closed"

    def exit(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=10) == 0


def totals(server):
    s = server.stats()
    return (stat(s, "client_pinned_bytes"), stat(s, "client_pinned_max_process_bytes"),
            stat(s, "client_pinning_processes"))


def test_reports_of_several_processes_add_up_until_each_goes(server_factory):
    server = server_factory(memory="64MiB")
    a, b = Reporter(server), Reporter(server)
    a.open()
    b.open()
    assert a.report(1, 1, 16 * MiB) == (0, "-")
    assert a.report(2, 1, 8 * MiB) == (0, "-")        # a second mapping (client) of a
    assert b.report(1, 1, 4 * MiB) == (0, "-")
    assert totals(server) == (28 * MiB, 24 * MiB, 2)
    # A later report replaces the mapping's; an older one, overtaken on
    # another connection, changes nothing.
    a.open()
    assert a.report(1, 3, 32 * MiB, conn=1) == (0, "-")
    assert a.report(1, 2, 1 * MiB, conn=0) == (0, "-")
    assert totals(server) == (44 * MiB, 40 * MiB, 2)
    # 0 ends a mapping's report.
    assert a.report(2, 2, 0) == (0, "-")
    assert totals(server) == (36 * MiB, 32 * MiB, 2)
    # The process's reports stay while it has a connection, and go with
    # its last one.
    a.close(0)
    assert totals(server) == (36 * MiB, 32 * MiB, 2)
    a.close(1)
    wait_for(lambda: totals(server) == (4 * MiB, 4 * MiB, 1), 5,
             "a's reports to go with its last connection")
    b.exit()
    wait_for(lambda: totals(server) == (0, 0, 0), 5, "b's report to go when it exits")
    a.exit()
    # What gdrkv stat prints.
    out = run_gdrkv("stat", "--json", server.url)
    counters = next(iter(json.loads(out.stdout)["servers"].values()))
    assert counters["client_pinning_processes"] == 0
    assert "client_pinned_bytes" in counters


def test_bad_reports_are_refused_clearly_and_change_nothing(server_factory):
    server = server_factory(memory="64MiB")
    r = Reporter(server)
    r.open()
    assert r.report(1, 1, 2 * MiB) == (0, "-")
    status, message = r.report(1, 2, 1 << 50)
    assert status == errors.E_INVALID and "more bytes than the pool" in message
    status, message = r.report(0, 1, MiB)
    assert status == errors.E_PROTOCOL and "malformed" in message
    status, message = r.report(1, 0, MiB)
    assert status == errors.E_PROTOCOL and "malformed" in message
    # A process keeps a bounded number of mappings: mapping 1 and 7 more.
    for mapping in range(2, 9):
        assert r.report(mapping, 1, MiB) == (0, "-")
    status, message = r.report(9, 1, MiB)
    assert status == errors.E_TOO_LARGE and "more mappings" in message
    assert totals(server) == (9 * MiB, 9 * MiB, 1)
    # The connection goes on serving after each refusal.
    assert r.report(1, 3, 3 * MiB) == (0, "-")
    assert totals(server) == (10 * MiB, 10 * MiB, 1)
    r.exit()
    wait_for(lambda: totals(server) == (0, 0, 0), 5, "the reports to go with the process")


def test_pins_frames_of_the_wrong_shape_or_transport_are_refused(server_factory):
    server = server_factory(memory="64MiB")
    with wire.connect_unix(server.unix_path) as conn:
        body = wire.pins_request(1, 1, MiB)[wire.HDR_SIZE:]
        hdr = wire.Header(opcode=wire.OP_PINS, body_len=len(body) - 1, req_id=5)
        conn.send(hdr.pack() + body[:-1])
        answer, message, _ = conn.read_frame()
        assert answer.status == errors.E_PROTOCOL, (answer, message)
    # Over tcp no process maps the pool: PINS is a unix connection's.
    with wire.connect(server.address) as conn:
        conn.send(wire.pins_request(1, 1, MiB))
        answer, _, _ = conn.read_frame()
        assert answer.status == errors.E_UNSUPPORTED
    assert totals(server) == (0, 0, 0)


def test_metrics_show_the_totals(server_factory):
    server = server_factory(memory="64MiB", args=["--metrics-listen", "127.0.0.1:0"])
    address = re.search(rb"metrics on http://(\S+?)/metrics", server.stdout()).group(1).decode()
    r = Reporter(server)
    r.open()
    assert r.report(1, 1, 6 * MiB) == (0, "-")
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert lines["gdrkv_client_pinned_bytes"] == str(6 * MiB)
    assert lines["gdrkv_client_pinned_max_process_bytes"] == str(6 * MiB)
    assert lines["gdrkv_client_pinning_processes"] == "1"
    r.exit()
