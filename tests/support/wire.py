"""A small pure-Python codec of the gdrkv wire format (native/common/protocol.h).

Only the raw-socket tests use it: to send frames the real client never
sends (malformed, truncated, read slowly) and to play fake servers. It is
deliberately independent of the C codec so the two check each other.
"""
import hashlib
import hmac
import os
import socket
import struct
import time
from dataclasses import astuple, dataclass

MAGIC = 0x564B4447  # b"GDKV" little-endian
VERSION = 1
HDR_SIZE = 40
ENTRY_HDR_SIZE = 12
RESULT_SIZE = 16

MAX_KEY_LEN = 4096
MAX_NS_LEN = 255
MAX_KEYS = 8192
MAX_BODY = 8 << 20
MAX_OBJECT = 1 << 30
MAX_PAYLOAD = 64 << 30

OP_PING = 1
OP_EXISTS = 2
OP_GET = 3
OP_PUT = 4
OP_DELETE = 5
OP_STATS = 6
OP_CLEAR = 7
OP_HELLO = 8        # shm transport: unix connections only
OP_LEASE = 9
OP_RELEASE = 10
OP_RDMA_HELLO = 11  # rdma transport: QPs for the connection
OP_RESERVE = 12
OP_COMMIT = 13
OP_AUTH = 14        # before anything else, on a server with a token
OP_PUT_STAGED = 15  # shm: values in the connection's staging memfd
OP_PINS = 16        # shm: what the client process pins of the pool (a report)
HELLO_WRITABLE = 1  # HELLO answer flag: single-tenant server
HELLO_LEASE_WORD = 2  # HELLO answer flag: staging ends in the lease word
HELLO_STAGED_WORD = 4  # HELLO answer flag: ... whose room holds the staged word
LEASE_WORD_BYTES = 64
STAGED_WORD_OFFSET = 8  # the staged word's place in the lease word's room
PUT_STAGED_FOLLOW = 1  # PUT_STAGED flag: follow the staged word; answer: send it again
RELEASE_UNANSWERED = 1  # RELEASE request flag: no answer
OP_RESPONSE = 0x80
AUTH_NONCE_SIZE = 32
LEASE_OBJ_SIZE = 8
LEASE_CHUNK_SIZE = 16

_HDR = struct.Struct("<IBBHiIIIQQ")
_ENTRY = struct.Struct("<IQ")
_RESULT = struct.Struct("<iIQ")
assert _HDR.size == HDR_SIZE and _ENTRY.size == ENTRY_HDR_SIZE and _RESULT.size == RESULT_SIZE


@dataclass
class Header:
    magic: int = MAGIC
    version: int = VERSION
    opcode: int = OP_PING
    flags: int = 0
    status: int = 0
    count: int = 0
    body_len: int = 0
    reserved: int = 0
    payload_len: int = 0
    req_id: int = 1

    def pack(self):
        return _HDR.pack(*astuple(self))

    @classmethod
    def unpack(cls, data):
        return cls(*_HDR.unpack(data))


def encode_body(entries, ns=b""):
    """Keyed request body: u8 ns_len | ns | (u32 key_len | u64 size | key)*."""
    parts = [bytes([len(ns)]), ns]
    for key, size in entries:
        parts += [_ENTRY.pack(len(key), size), key]
    return b"".join(parts)


def decode_body(body, count):
    """Inverse of encode_body, for fake servers; raises ValueError when malformed."""
    if not body or body[0] + 1 > len(body):
        raise ValueError("bad namespace")
    ns, pos, entries = body[1:1 + body[0]], 1 + body[0], []
    for _ in range(count):
        if pos + ENTRY_HDR_SIZE > len(body):
            raise ValueError("entry header past the body")
        key_len, size = _ENTRY.unpack_from(body, pos)
        pos += ENTRY_HDR_SIZE
        if pos + key_len > len(body):
            raise ValueError("key past the body")
        entries.append((body[pos:pos + key_len], size))
        pos += key_len
    return ns, entries


def request(opcode, entries=(), ns=b"", payload=b"", req_id=1, flags=0):
    """A well-formed request frame. entries: (key bytes, size) pairs; keyed
    opcodes always get a body (CLEAR's has no entries)."""
    entries = list(entries)
    keyed = opcode in (OP_EXISTS, OP_GET, OP_PUT, OP_DELETE, OP_CLEAR, OP_LEASE, OP_RESERVE,
                       OP_PUT_STAGED)
    body = encode_body(entries, ns) if keyed else b""
    hdr = Header(opcode=opcode, flags=flags, count=len(entries), body_len=len(body),
                 payload_len=len(payload), req_id=req_id)
    return hdr.pack() + body + payload


def auth_request(body, req_id=1):
    """An AUTH frame: the client's nonce, or its proof (32 bytes each)."""
    return Header(opcode=OP_AUTH, body_len=len(body), req_id=req_id).pack() + body


def auth_proof(token, role, client_nonce, server_nonce):
    """docs/protocol.md's proof, HMAC-SHA256 over a label and both nonces,
    computed here with Python's hmac: an implementation apart from the C one."""
    label = b"gdrkv-auth-1 " + role.encode()
    return hmac.new(token, label + client_nonce + server_nonce, hashlib.sha256).digest()


_PINS = struct.Struct("<QQQ")


def pins_request(mapping, seq, nbytes, req_id=1):
    """A PINS report: the process pins nbytes of the pool through its
    mapping `mapping`, report number seq of that mapping."""
    body = _PINS.pack(mapping, seq, nbytes)
    return Header(opcode=OP_PINS, body_len=len(body), req_id=req_id).pack() + body


def encode_results(results):
    return b"".join(_RESULT.pack(status, 0, size) for status, size in results)


def decode_results(body):
    return [(status, size) for status, _, size in _RESULT.iter_unpack(body)]


def response(opcode, results=(), payload=b"", req_id=1, status=0):
    """A response frame, as a fake server sends it."""
    results = list(results)
    body = encode_results(results)
    hdr = Header(opcode=opcode | OP_RESPONSE, status=status, count=len(results),
                 body_len=len(body), payload_len=len(payload), req_id=req_id)
    return hdr.pack() + body + payload


class PeerClosed(Exception):
    pass


class Conn:
    """A blocking socket with a deadline on every read, so a test never hangs
    on a peer that stopped talking. Wraps connected and accepted sockets."""

    def __init__(self, sock, timeout=5.0):
        self.sock = sock
        self.timeout = timeout
        sock.settimeout(timeout)

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data):
        self.sock.sendall(data)

    def recv_exact(self, n, chunk=1 << 20, pause=0.0):
        """Reads exactly n bytes, chunk bytes per recv with pause seconds
        between recvs (a slow reader); raises PeerClosed on EOF."""
        buf = bytearray()
        deadline = time.monotonic() + self.timeout
        while len(buf) < n:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(min(chunk, n - len(buf)))
            if not data:
                raise PeerClosed(f"peer closed after {len(buf)} of {n} bytes")
            buf += data
            if pause:
                time.sleep(pause)
                deadline = time.monotonic() + self.timeout
        return bytes(buf)

    def read_header(self):
        return Header.unpack(self.recv_exact(HDR_SIZE))

    def read_frame(self):
        """(header, body, payload) of the next frame."""
        hdr = self.read_header()
        body = self.recv_exact(hdr.body_len)
        payload = self.recv_exact(hdr.payload_len)
        return hdr, body, payload

    def read_request(self):
        """(header, namespace, entries, payload) of the next request, for
        fake servers; raises PeerClosed or ValueError."""
        hdr, body, payload = self.read_frame()
        ns, entries = decode_body(body, hdr.count) if hdr.body_len else (b"", [])
        return hdr, ns, entries, payload

    def call(self, opcode, entries=(), ns=b"", payload=b"", req_id=1, flags=0):
        """Sends a request and returns (header, results or body, payload)."""
        self.send(request(opcode, entries, ns, payload, req_id, flags))
        hdr, body, payload = self.read_frame()
        results = body if opcode == OP_STATS or hdr.status else decode_results(body)
        return hdr, results, payload

    def authenticate(self, token):
        """The handshake with the token's bytes; returns the final answer's
        header (status 0 when the server accepted the proof). Raises
        AssertionError when the server's own proof is wrong."""
        client_nonce = os.urandom(AUTH_NONCE_SIZE)
        self.send(auth_request(client_nonce, req_id=1))
        hdr, body, _ = self.read_frame()
        assert hdr.status == 0 and len(body) == 2 * AUTH_NONCE_SIZE, (hdr, body)
        server_nonce, server_proof = body[:AUTH_NONCE_SIZE], body[AUTH_NONCE_SIZE:]
        assert server_proof == auth_proof(token, "server", client_nonce, server_nonce)
        self.send(auth_request(auth_proof(token, "client", client_nonce, server_nonce), req_id=2))
        hdr, _, _ = self.read_frame()
        return hdr

    def wait_closed(self, timeout):
        """True when the peer closes the connection within timeout seconds
        (whatever it sends before is discarded), False if it stays open."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                if not self.sock.recv(1 << 16):
                    return True
            except ConnectionResetError:
                return True
            except socket.timeout:
                return False


def connect(address, timeout=5.0, rcvbuf=None):
    """A Conn to "host:port"."""
    host, port = address.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        # Set before connect so the window is small from the handshake on:
        # the peer then really has to wait for us to read.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.connect((host, int(port)))
    return Conn(sock, timeout)


def connect_unix(path, timeout=5.0):
    """A Conn to a server's unix socket (the shm transport)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(path)
    return Conn(sock, timeout)


def hello_fds(conn):
    """HELLO on a unix Conn: (header, results, [the pool's fd, the
    connection's staging fd when the server gives one])."""
    conn.send(Header(opcode=OP_HELLO).pack())
    data, fds, _, _ = socket.recv_fds(conn.sock, HDR_SIZE, 2)
    data += conn.recv_exact(HDR_SIZE - len(data)) if len(data) < HDR_SIZE else b""
    hdr = Header.unpack(data)
    body = conn.recv_exact(hdr.body_len)
    return hdr, (body if hdr.status else decode_results(body)), fds


def hello(conn):
    """HELLO on a unix Conn: (header, results, the pool's fd or None); a
    staging fd is closed."""
    hdr, results, fds = hello_fds(conn)
    for fd in fds[1:]:
        os.close(fd)
    return hdr, results, (fds[0] if fds else None)


def decode_lease(body, count):
    """A LEASE answer's body: [(status, size, [(off, len), ...])]."""
    results = decode_results(body[:count * RESULT_SIZE])
    pos, out = count * RESULT_SIZE, []
    for status, size in results:
        chunks = []
        if status == 0:
            (nchunks,) = struct.unpack_from("<I", body, pos)
            pos += LEASE_OBJ_SIZE
            for _ in range(nchunks):
                chunks.append(struct.unpack_from("<QQ", body, pos))
                pos += LEASE_CHUNK_SIZE
        out.append((status, size, chunks))
    assert pos == len(body), "trailing bytes after the chunk lists"
    return out


def parse_stats(text):
    """'name value\\n' lines into a dict of int/float."""
    out = {}
    for line in text.decode().splitlines():
        if not line.strip():
            continue
        name, value = line.split()
        try:
            out[name] = int(value)
        except ValueError:
            out[name] = float(value)
    return out


def server_stats(address, timeout=5.0, token=None):
    """A server's counters over its own STATS request, without gdrkv.Client
    (after the handshake when the server has a token)."""
    with connect(address, timeout) as conn:
        if token is not None:
            assert conn.authenticate(token).status == 0
        hdr, body, _ = conn.call(OP_STATS)
        if hdr.status:
            raise RuntimeError(f"STATS answered status {hdr.status}: {body!r}")
        return parse_stats(body)


# ---------------------------------------------------------------- rdma endpoints

_ENDPOINT = struct.Struct("<BBH16sIIIII")


def rdma_endpoint(eth=0, mtu=5, lid=1, gid=b"\0" * 16, rd_atomic=1, sq_depth=64, max_sge=1,
                  qps=((1, 0),)):
    """An RDMA_HELLO body (docs/protocol.md): the QP endpoint of a peer that
    exists only on paper. A server connects its QPs to it all the same, so
    RESERVE and COMMIT can be driven over a raw socket; nothing is ever
    written through those QPs."""
    head = _ENDPOINT.pack(eth, mtu, lid, gid, rd_atomic, sq_depth, max_sge, len(qps), 0)
    return head + b"".join(struct.pack("<II", qpn, psn) for qpn, psn in qps)


def rdma_hello(conn, body):
    """Sends RDMA_HELLO with body: (header, answer body)."""
    conn.send(Header(opcode=OP_RDMA_HELLO, body_len=len(body)).pack() + body)
    hdr, answer, _ = conn.read_frame()
    return hdr, answer
