"""The hold rules under any sequence of frames (#14 defect 1): a hypothesis
RuleBasedStateMachine drives several raw connections at once to one real
server, over tcp, unix (shm, after HELLO) and rdma (QPs after RDMA_HELLO),
with every opcode, valid and invalid: LEASE then COMMIT, RESERVE then a
PING, RELEASE or COMMIT with nothing held, counts that do not match,
unknown opcodes, oversized headers, garbage, frames cut off by a close.

After every step:
- every connection that was sent a whole frame answered it with a
  well-formed frame (magic, its opcode, its req_id) or was closed;
- the server process is alive;
- what was PUT and answered 0 reads back byte-exact through a fresh
  client, unless the model deleted or cleared it (the pool is large enough
  that nothing is evicted: `evictions` stays 0, so the model is exact);
- once every connection is closed, no pin, lease or reservation is left
  (pinned_objects, reserved_objects: 0).
"""
import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis import event
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import gdrkv
from support import wire
from support.content import batch_put_bytes
from support.servers import ServerSet
from support.softverbs import SOFTVERBS
from support.util import stat, wait_for
from gdrkv import errors

pytestmark = pytest.mark.pool_file

NS = b"sm"
KEYS = [b"k%d" % i for i in range(6)]
TRANSPORTS = ["tcp", "unix"] + (["rdma"] if SOFTVERBS else [])
KNOWN_STATUS = {0, 1} | {getattr(errors, n) for n in dir(errors) if n.startswith("E_")}
OPCODES = range(1, 15)
SERVER = {}


@pytest.fixture(scope="module", autouse=True)
def one_server(tmp_path_factory):
    servers = ServerSet(str(tmp_path_factory.mktemp("machine")))
    SERVER["it"] = servers.start("256MiB")
    yield
    servers.stop_all()


def value_of(key, version, size):
    return (key + b":%d:" % version) * (size // (len(key) + 8) + 1)


class Conn:
    """A raw connection and what it should see next."""

    def __init__(self, transport):
        server = SERVER["it"]
        self.transport = transport
        self.conn = (wire.connect_unix(server.unix_path, timeout=10) if transport == "unix"
                     else wire.connect(server.address, timeout=10))
        self.closed = False
        self.req_id = 100
        if transport == "unix":
            hdr, _, fd = wire.hello(self.conn)
            assert hdr.status == 0 and fd is not None
            os.close(fd)
        elif transport == "rdma":
            hdr, _ = wire.rdma_hello(self.conn, wire.rdma_endpoint(qps=((1, 0), (2, 0))))
            assert hdr.status == 0, hdr

    def exchange(self, frame, opcode):
        """Sends a whole frame; returns (header, body, payload) of the
        answer, or None when the server closed the connection (now, or
        when the frame went out)."""
        self.req_id += 1
        event(f"{self.transport} op {opcode}")
        frame = frame[:32] + self.req_id.to_bytes(8, "little") + frame[40:]
        try:
            self.conn.send(frame)
            hdr, body, payload = self.conn.read_frame()
        except (wire.PeerClosed, ConnectionResetError, BrokenPipeError):
            self.closed = True
            return None
        assert hdr.magic == wire.MAGIC and hdr.version == wire.VERSION, hdr
        assert hdr.opcode == opcode | wire.OP_RESPONSE, (hdr, opcode)
        assert hdr.req_id == self.req_id, (hdr, self.req_id)
        assert hdr.status in KNOWN_STATUS, hdr
        return hdr, body, payload

    def close(self):
        self.conn.close()
        self.closed = True


def keyed(opcode, keys, size, payload=b""):
    return wire.request(opcode, [(k, size) for k in keys], ns=NS, payload=payload)


CONN = st.integers(0, 11)      # which live connection a rule uses (see pick)


class ProtocolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.model = {}                 # key -> bytes PUT and answered 0
        self.open = []
        self.server = SERVER["it"]
        if not self.server.alive:
            # An earlier example crashed it (and failed for that): start it
            # again, so hypothesis can shrink to the smallest such sequence.
            self.server.kill()
            self.server.restart()
        wire.server_stats(self.server.address)          # it is up
        self.reader = gdrkv.Client(self.server.url, namespace=NS.decode(), transport="tcp",
                                   timeout_ms=10000)
        self.reader.clear()
        self.version = 0

    @initialize()
    def first_conns(self):
        """One connection of each transport to start with, and every key
        stored, so reads and leases have hits to hold."""
        for transport in TRANSPORTS:
            self.open.append(Conn(transport))
        self.fill()

    def fill(self):
        """Stores every key (but those another connection is writing
        right now: BUSY, not in the model)."""
        self.version += 1
        values = [value_of(key, self.version, 4096)[:4096] for key in KEYS]
        results = batch_put_bytes(self.reader, [k.decode() for k in KEYS], values)
        for key, value, result in zip(KEYS, values, results):
            assert result in (0, errors.E_BUSY), (key, result)
            if result == 0:
                self.model[key] = value

    @rule(transport=st.sampled_from(TRANSPORTS))
    def another_conn(self, transport):
        if len(self.live()) < 6:
            self.open.append(Conn(transport))

    def live(self):
        return [c for c in self.open if not c.closed]

    def pick(self, i):
        """A live connection of transport i % 3 (number i // 3 of them), a
        new one when the server closed them all: each transport keeps its
        share of the steps however often the invalid rules end connections."""
        transport = TRANSPORTS[i % len(TRANSPORTS)]
        live = [c for c in self.live() if c.transport == transport]
        if not live:
            self.open.append(Conn(transport))
            live = [self.open[-1]]
        return live[(i // len(TRANSPORTS)) % len(live)]

    # ------------------------------------------------------------ valid ops

    @rule(c=CONN, keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True),
          size=st.sampled_from([1, 100, 4096, 70000]))
    def put(self, c, keys, size):
        c = self.pick(c)
        if c.closed:
            return
        self.version += 1
        values = [value_of(k, self.version, size)[:size] for k in keys]
        answer = c.exchange(keyed(wire.OP_PUT, keys, size, b"".join(values)), wire.OP_PUT)
        if answer and answer[0].status == 0:
            for key, value, (status, _) in zip(keys, values, wire.decode_results(answer[1])):
                if status == 0 and key not in self.model:
                    self.model[key] = value     # a PUT of a present key keeps the old bytes

    @rule(c=CONN, keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4),
          op=st.sampled_from([wire.OP_GET, wire.OP_EXISTS, wire.OP_LEASE]))
    def read(self, c, keys, op):
        c = self.pick(c)
        if c.closed:
            return
        answer = c.exchange(keyed(op, keys, 1 << 20), op)
        c.leased = bool(answer and op == wire.OP_LEASE and answer[0].status == 0 and
                        any(s == 0 for s, _ in wire.decode_results(answer[1][:16 * len(keys)])))
        if c.leased:
            event(f"{c.transport}: a lease with hits")
        if answer and answer[0].status == 0 and op != wire.OP_LEASE:
            for key, (status, size) in zip(keys, wire.decode_results(answer[1][:16 * len(keys)])):
                known = self.model.get(key)
                assert (status == 0) == (known is not None), (key, status)
                if known is not None:
                    assert size == len(known)

    @rule(c=CONN, keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True),
          size=st.sampled_from([100, 4096]))
    def reserve(self, c, keys, size):
        c = self.pick(c)
        if not c.closed:
            c.exchange(keyed(wire.OP_RESERVE, keys, size), wire.OP_RESERVE)

    @rule(c=CONN, count=st.sampled_from([0, 1, 2, 3, 64, 8192]))
    def commit(self, c, count):
        """COMMIT with any count: of a RESERVE, after a LEASE, of nothing.
        Committed keys are not in the model: their bytes were never written
        (nothing stands behind the paper QPs)."""
        c = self.pick(c)
        if c.closed:
            return
        body = bytes(i % 2 for i in range(count))
        if getattr(c, "leased", False):
            event(f"{c.transport}: COMMIT of {count} while a lease is held")
        frame = wire.Header(opcode=wire.OP_COMMIT, count=len(body), body_len=len(body)).pack()
        answer = c.exchange(frame + body, wire.OP_COMMIT)
        if answer and answer[0].status == 0:
            self.forget_committed = True

    @rule(c=CONN, hold=st.sampled_from([wire.OP_LEASE, wire.OP_RESERVE]),
          then=st.sampled_from([wire.OP_RELEASE, wire.OP_COMMIT]) | st.sampled_from(OPCODES),
          count=st.sampled_from([0, 1, 2, 3, 64, 8192]))
    def hold_then(self, c, hold, then, count):
        """A frame that leaves a hold (LEASE's pins, RESERVE's room), then
        any frame: the one the hold belongs to (RELEASE, COMMIT) with any
        count, or another that must end it."""
        c = self.pick(c)
        if c.closed:
            return
        c.exchange(keyed(hold, KEYS[:3], 4096), hold)
        if c.closed:
            return
        if then == wire.OP_COMMIT:
            body = bytes(i % 2 for i in range(count))
            frame = wire.Header(opcode=then, count=count, body_len=count).pack() + body
            event(f"{c.transport}: COMMIT of {count} after {hold}")
        elif then in (wire.OP_EXISTS, wire.OP_GET, wire.OP_DELETE, wire.OP_LEASE,
                      wire.OP_RESERVE):
            keys = [KEYS[i % len(KEYS)] for i in range(max(1, min(count, 64)))]
            frame = keyed(then, keys, 4096)
        else:
            frame = wire.request(then)
        answer = c.exchange(frame, then)
        if then == wire.OP_COMMIT and answer and answer[0].status == 0:
            self.forget_committed = True
        if then == wire.OP_DELETE and answer and answer[0].status == 0:
            self.forget_committed = True        # which keys went is the server's to say

    @rule(c=CONN, op=st.sampled_from([wire.OP_RELEASE, wire.OP_PING, wire.OP_STATS,
                                       wire.OP_HELLO]))
    def unkeyed(self, c, op):
        c = self.pick(c)
        if not c.closed:
            c.exchange(wire.request(op), op)

    @rule(c=CONN, keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=2, unique=True))
    def delete(self, c, keys):
        c = self.pick(c)
        if c.closed:
            return
        answer = c.exchange(keyed(wire.OP_DELETE, keys, 0), wire.OP_DELETE)
        if answer and answer[0].status == 0:
            for key, (status, _) in zip(keys, wire.decode_results(answer[1])):
                if status == 0:
                    self.model.pop(key, None)
                else:
                    assert status == errors.E_NOT_FOUND and key not in self.model

    @rule(c=CONN)
    def clear(self, c):
        c = self.pick(c)
        if c.closed:
            return
        answer = c.exchange(wire.request(wire.OP_CLEAR, ns=NS), wire.OP_CLEAR)
        if answer and answer[0].status == 0:
            self.model.clear()

    # ------------------------------------------------------------ invalid ops

    @rule(c=CONN, opcode=st.sampled_from([0, wire.OP_PINS + 1, 99, 127]),
          body=st.binary(max_size=64))
    def unknown_opcode(self, c, opcode, body):
        c = self.pick(c)
        if c.closed:
            return
        frame = wire.Header(opcode=opcode, body_len=len(body)).pack() + body
        answer = c.exchange(frame, opcode)
        if answer:
            assert answer[0].status == errors.E_UNSUPPORTED

    @rule(c=CONN, opcode=st.sampled_from(OPCODES),
          limit=st.sampled_from([("count", wire.MAX_KEYS + 1), ("body_len", wire.MAX_BODY + 1),
                                 ("payload_len", wire.MAX_PAYLOAD + 1)]))
    def over_a_limit(self, c, opcode, limit):
        c = self.pick(c)
        if c.closed:
            return
        field, value = limit
        hdr = wire.Header(opcode=opcode)
        setattr(hdr, field, value)
        answer = c.exchange(hdr.pack(), opcode)
        if answer:
            assert answer[0].status in (errors.E_TOO_LARGE, errors.E_PROTOCOL)
        assert c.conn.wait_closed(10), "a frame over a limit left the connection open"
        c.closed = True

    @rule(c=CONN, opcode=st.sampled_from(OPCODES), count=st.integers(0, 3),
          body=st.binary(max_size=40))
    def malformed_body(self, c, opcode, count, body):
        """A header whose body does not parse (or does not fit its op)."""
        c = self.pick(c)
        if c.closed:
            return
        c.exchange(wire.Header(opcode=opcode, count=count, body_len=len(body)).pack() + body,
                   opcode)

    @rule(c=CONN)
    def bad_magic(self, c):
        """Not our protocol: closed without an answer."""
        c = self.pick(c)
        if c.closed:
            return
        assert c.exchange(b"GET / HTTP/1.1\r\n" + b"\0" * 24, wire.OP_GET) is None

    @rule(c=CONN, cut=st.integers(0, 120))
    def close_mid_frame(self, c, cut):
        """Half a frame (or none), then gone."""
        c = self.pick(c)
        if not c.closed:
            frame = keyed(wire.OP_PUT, [KEYS[0]], 100, b"x" * 100)
            try:
                c.conn.send(frame[:cut])
            except OSError:
                pass
        c.close()
        self.open.remove(c)

    # ------------------------------------------------------------ invariants

    @invariant()
    def server_alive(self):
        assert self.server.alive, "the server died"

    @invariant()
    def model_matches(self):
        if getattr(self, "forget_committed", False):
            # A COMMIT published keys whose bytes nobody wrote: their
            # contents are unknown, and so is any key of the model it hit.
            self.reader.clear()
            self.model.clear()
            self.forget_committed = False
            self.fill()
            return
        keys = list(self.model)
        got = [self.reader.get(k.decode()) for k in keys]
        assert got == [self.model[k] for k in keys]
        assert stat(self.server.stats(), "evictions") == 0

    def teardown(self):
        for c in self.open:
            c.close()
        self.reader.close()
        wait_for(lambda: holds(self.server) == (0, 0), 20,
                 "pins, leases and reservations to go with their connections")


def holds(server):
    stats = server.stats()
    return stat(stats, "pinned_objects"), stat(stats, "reserved_objects")


ProtocolMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("GDRKV_STATEFUL_EXAMPLES", 150)), stateful_step_count=40,
    deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestProtocolMachine = ProtocolMachine.TestCase
