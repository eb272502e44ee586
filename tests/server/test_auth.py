"""Authentication (docs/protocol.md, "Authentication"; DESIGN §10): a
server started with --auth-token-file serves only clients that prove they
hold the token, on every transport, before any op, RDMA_HELLO or pool fd;
the proof is mutual, the token never crosses the wire; refusals are
E_DENIED with a message; a listen address other hosts can reach needs a
token or --insecure-no-auth.

The raw-socket tests compute the proofs with Python's hmac (wire.py), an
implementation apart from the C one they check."""
import os
import socket

import pytest

import gdrkv
from support import wire
from support.content import batch_get_bytes, batch_put_bytes, content
from support.softverbs import SOFTVERBS, TRANSPORTS
from support.util import run_gdrkv, stat, unique, wait_for
from gdrkv import errors

TOKEN = b"9f2c4e1d6b8a0f3e5c7d2a4b6e8f0a1c"


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_bytes(TOKEN + b"\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def auth_server(server_factory, token_file):
    return server_factory("64MiB", args=["--auth-token-file", token_file])


def roundtrip(client, n=8, size=65536):
    keys = [unique("auth") for _ in range(n)]
    values = [content(k, size) for k in keys]
    assert batch_put_bytes(client, keys, values) == [0] * n
    results, got = batch_get_bytes(client, keys, [size] * n)
    assert results == [size] * n and got == values


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_clients_with_the_token_use_every_transport(auth_server, token_file, make_client,
                                                    transport):
    client = make_client(auth_server.url, transport=transport, token_file=token_file,
                         namespace=unique("ns"))
    roundtrip(client)
    mine = client.stats()["client"]
    if transport == "shm":
        assert mine["shm_connects"] >= 1 and mine["shm_bytes_copied"] > 0
    if transport == "rdma":
        assert mine["rdma_read_frames"] >= 1 and mine["rdma_write_frames"] >= 1
    assert stat(auth_server.stats(), "auth_ok") >= 1
    assert stat(auth_server.stats(), "auth_denied") == 0


def test_token_file_from_the_environment(auth_server, token_file, make_client, monkeypatch):
    monkeypatch.setenv("GDRKV_TOKEN_FILE", token_file)
    roundtrip(make_client(auth_server.url, namespace=unique("env")))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_clients_without_the_token_are_denied(auth_server, token_file, make_client, transport,
                                              monkeypatch):
    """Every key fails E_DENIED, nothing is stored, nothing is read; the
    server counts the refusals and `gdrkv stat` shows them."""
    monkeypatch.delenv("GDRKV_TOKEN_FILE", raising=False)
    client = make_client(auth_server.url, transport=transport, namespace=unique("deny"),
                         timeout_ms=3000)
    keys = [unique("k") for _ in range(4)]
    assert batch_put_bytes(client, keys, [b"x" * 4096] * 4) == [errors.E_DENIED] * 4
    results, _ = batch_get_bytes(client, keys, [4096] * 4)
    assert results == [errors.E_DENIED] * 4
    assert client.stats()["client"]["errors_denied"] >= 4
    stats = auth_server.stats()
    assert stat(stats, "objects") == 0 and stat(stats, "auth_denied") >= 1
    out = run_gdrkv("stat", f"{auth_server.url}?token_file={token_file}")
    assert out.returncode == 0, out.stderr
    assert "auth_denied" in out.stdout


def test_a_wrong_token_is_denied(auth_server, tmp_path, make_client):
    wrong = tmp_path / "wrong"
    wrong.write_bytes(TOKEN[::-1])
    wrong.chmod(0o600)
    client = make_client(auth_server.url, token_file=str(wrong), transport="tcp",
                         namespace=unique("wrong"))
    key = unique("k")
    assert batch_put_bytes(client, [key], [b"y" * 100]) == [errors.E_DENIED]
    assert client.batch_sizes([key]) == [errors.E_DENIED]


def test_a_server_without_a_token_is_not_trusted(server_factory, token_file, make_client):
    """The handshake is mutual: a client with a token refuses a server that
    cannot prove it holds the same one (here: it has none)."""
    plain = server_factory("64MiB")
    client = make_client(plain.url, token_file=token_file, transport="tcp",
                         namespace=unique("plain"))
    assert batch_put_bytes(client, [unique("k")], [b"z" * 100]) == [errors.E_DENIED]
    assert stat(plain.stats(), "objects") == 0


# ---------------------------------------------------------------- the wire

def frame_is_denied_then_closed(conn, frame):
    conn.send(frame)
    hdr, body, payload = conn.read_frame()
    assert hdr.status == errors.E_DENIED and hdr.count == 0 and not payload, hdr
    assert b"token" in body                         # a message saying what is missing
    assert conn.wait_closed(5)


@pytest.mark.parametrize("frame", [
    wire.request(wire.OP_PING),
    wire.request(wire.OP_STATS),
    wire.request(wire.OP_GET, [(b"k", 100)]),
    wire.request(wire.OP_CLEAR),
    wire.request(wire.OP_PUT, [(b"k", 3)], payload=b"abc"),
    # Limits are not lifted for strangers: a huge declared body is not read.
    wire.Header(opcode=wire.OP_GET, count=1, body_len=wire.MAX_BODY).pack(),
    wire.Header(opcode=wire.OP_RDMA_HELLO, body_len=40).pack() + bytes(40),
], ids=["ping", "stats", "get", "clear", "put", "huge-body", "rdma-hello"])
def test_nothing_is_answered_before_the_handshake(auth_server, frame):
    with wire.connect(auth_server.address) as conn:
        frame_is_denied_then_closed(conn, frame)


def test_no_pool_fd_before_the_handshake(auth_server):
    """HELLO on the unix socket: denied, and no descriptor comes with it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(auth_server.unix_path)
    sock.sendall(wire.request(wire.OP_HELLO))
    data, fds, _, _ = socket.recv_fds(sock, 4096, 4)
    assert not fds
    hdr = wire.Header.unpack(data[:wire.HDR_SIZE])
    assert hdr.status == errors.E_DENIED
    sock.close()


def test_the_handshake_as_documented(auth_server):
    """A client that computes the proofs itself (Python's hmac) is served;
    a second AUTH is refused without harm; the unix socket works alike."""
    with wire.connect(auth_server.address) as conn:
        assert conn.authenticate(TOKEN).status == 0
        hdr, _, _ = conn.call(wire.OP_PING)
        assert hdr.status == 0
        conn.send(wire.auth_request(os.urandom(32)))
        hdr, _, _ = conn.read_frame()
        assert hdr.status == errors.E_INVALID
        hdr, results, _ = conn.call(wire.OP_EXISTS, [(b"k", 0)], ns=b"x")
        assert hdr.status == 0 and results == [(errors.E_NOT_FOUND, 0)]
    with wire.connect_unix(auth_server.unix_path) as conn:
        assert conn.authenticate(TOKEN).status == 0
        assert conn.call(wire.OP_PING)[0].status == 0


def test_a_wrong_proof_ends_the_connection(auth_server):
    with wire.connect(auth_server.address) as conn:
        client_nonce = os.urandom(32)
        conn.send(wire.auth_request(client_nonce))
        hdr, body, _ = conn.read_frame()
        assert hdr.status == 0
        wrong = wire.auth_proof(TOKEN + b"!", "client", client_nonce, body[:32])
        frame_is_denied_then_closed(conn, wire.auth_request(wrong, req_id=2))
    # Replaying a proof on another connection fails too: the nonces differ.
    with wire.connect(auth_server.address) as first, wire.connect(auth_server.address) as second:
        nonce = os.urandom(32)
        first.send(wire.auth_request(nonce))
        second.send(wire.auth_request(nonce))
        server_nonce = first.read_frame()[1][:32]
        second.read_frame()
        proof = wire.auth_proof(TOKEN, "client", nonce, server_nonce)
        frame_is_denied_then_closed(second, wire.auth_request(proof, req_id=2))
        first.send(wire.auth_request(proof, req_id=2))
        assert first.read_frame()[0].status == 0


@pytest.mark.parametrize("body_len", [0, 31, 33, 64])
def test_malformed_auth_frames_are_refused(auth_server, body_len):
    with wire.connect(auth_server.address) as conn:
        conn.send(wire.Header(opcode=wire.OP_AUTH, body_len=body_len).pack() + bytes(body_len))
        hdr, _, _ = conn.read_frame()
        assert hdr.status == errors.E_PROTOCOL
        assert conn.wait_closed(5)


def test_the_token_never_crosses_the_wire(fake_server, token_file, make_client):
    """An impostor that answers the handshake with a made-up proof learns
    nothing it can use: it gets the client's nonce, never the token or a
    proof, and the client sends nothing more."""
    received = []

    def impostor(conn):
        hdr, body, _ = conn.read_frame()
        received.append((hdr.opcode, body))
        reply = wire.Header(opcode=wire.OP_AUTH | wire.OP_RESPONSE, body_len=64,
                            req_id=hdr.req_id).pack()
        conn.send(reply + os.urandom(64))
        received.append(("after", conn.wait_closed(10)))

    fake = fake_server(impostor)
    client = make_client(fake.url, token_file=token_file, transport="tcp", timeout_ms=3000)
    assert batch_put_bytes(client, [b"k"], [TOKEN]) == [errors.E_DENIED]
    client.close()
    wait_for(lambda: len(received) == 2, 15, "the impostor to see the connection end")
    assert received[0][0] == wire.OP_AUTH and len(received[0][1]) == 32
    assert received[1] == ("after", True)               # closed, nothing else sent
    assert TOKEN not in received[0][1]


# ---------------------------------------------------------------- starting

def test_the_token_file_must_be_private(server_factory, token_file):
    os.chmod(token_file, 0o644)
    with pytest.raises(RuntimeError, match="chmod 600"):
        server_factory("16MiB", args=["--auth-token-file", token_file])


def test_a_client_refuses_a_token_file_others_can_read(auth_server, token_file):
    """The same rule as the server's: a secret others can read is none."""
    for mode in (0o644, 0o640, 0o604):
        os.chmod(token_file, mode)
        with pytest.raises(ValueError, match="chmod 600"):
            gdrkv.Client(auth_server.url, token_file=token_file)


def test_a_short_token_is_refused(server_factory, tmp_path):
    path = tmp_path / "short"
    path.write_text("secret\n")
    path.chmod(0o600)
    with pytest.raises(RuntimeError, match="shorter than 16 bytes"):
        server_factory("16MiB", args=["--auth-token-file", str(path)])


def test_other_hosts_need_a_token_or_an_explicit_opt_out(server_factory, token_file):
    """Redis's protected mode: 0.0.0.0 without a token refuses to start,
    naming both ways out; each of them works."""
    with pytest.raises(RuntimeError, match="--auth-token-file.*--insecure-no-auth"):
        server_factory("16MiB", listen="0.0.0.0:0")
    opened = server_factory("16MiB", args=["--insecure-no-auth"], listen="0.0.0.0:0")
    assert opened.alive
    secured = server_factory("16MiB", args=["--auth-token-file", token_file],
                             listen="0.0.0.0:0")
    assert secured.alive
    with pytest.raises(ValueError, match="insecure-no-auth"):
        gdrkv.Server(listen="0.0.0.0:0", memory="16MiB", pretouch=False)


def test_loopback_needs_no_token(server_factory):
    """The zero-setup default stays: 127.0.0.1 and ::1 start without one."""
    assert server_factory("16MiB").alive
    try:
        socket.create_server(("::1", 0)).close()
    except OSError:
        return                                      # no IPv6 loopback on this host
    assert server_factory("16MiB", listen="[::1]:0").alive


def test_token_file_option_is_checked(auth_server, tmp_path):
    with pytest.raises(ValueError, match="No such file"):
        gdrkv.Client(auth_server.url, token_file=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="token_file"):
        gdrkv.Client(auth_server.url, token_file=3)


@pytest.mark.skipif(SOFTVERBS is None, reason="built without softverbs; run.sh requires it")
def test_rdma_regions_only_after_the_handshake(auth_server, token_file, make_client):
    """An authenticated rdma client gets QPs and regions (counted by the
    server); the unauthenticated RDMA_HELLO above got E_DENIED."""
    client = make_client(auth_server.url, transport="rdma", token_file=token_file,
                         namespace=unique("rdma"))
    roundtrip(client, n=4)
    assert stat(auth_server.stats(), "rdma_sessions") >= 1
