"""The in-process gdrkv.Server and the gdrkv.errors module."""
import re

import pytest

import gdrkv
from gdrkv import errors

MiB = 1 << 20

# Must match enum gdrkv_error in native/include/gdrkv.h: the codes travel on the wire.
CODES = dict(OK=0, E_NOT_FOUND=-1, E_TOO_SMALL=-2, E_NO_SPACE=-3, E_TIMEOUT=-4,
             E_UNAVAILABLE=-5, E_PROTOCOL=-6, E_INVALID=-7, E_TOO_LARGE=-8, E_BUSY=-9,
             E_UNSUPPORTED=-10, E_INTERNAL=-11, E_CLOSED=-12)


def test_error_codes_match_the_c_header():
    for name, code in CODES.items():
        assert getattr(errors, name) == code, name
        assert getattr(gdrkv, name) == code, f"gdrkv.{name} is not re-exported"
    assert gdrkv.GdrkvError is errors.GdrkvError and gdrkv.strerror is errors.strerror


def test_strerror_and_error_class():
    assert errors.strerror(errors.E_NOT_FOUND) == "not found"
    assert errors.strerror(errors.E_TIMEOUT) == "timed out"
    assert errors.strerror(-999) == "unknown error"
    err = errors.GdrkvError(errors.E_BUSY)
    assert isinstance(err, Exception) and err.code == errors.E_BUSY
    assert "busy" in str(err)


@pytest.mark.parametrize("memory, pool_bytes", [
    (48 * MiB, 48 * MiB), ("48MiB", 48 * MiB), ("48M", 48 * MiB), (str(48 * MiB), 48 * MiB),
    ("1GiB", 1 << 30), ("1G", 1 << 30),
    # The pool is whole 1 MiB slab pages: a remainder is left out.
    (48 * MiB + 4096, 48 * MiB), (str(48 * MiB + MiB - 1), 48 * MiB),
])
def test_server_memory_spellings(memory, pool_bytes):
    with gdrkv.Server(memory=memory, pretouch=False) as server:
        assert server.stats()["pool_bytes"] == pool_bytes


@pytest.mark.parametrize("memory", ["banana", "-5MiB", "12XB", 0, -1, ""])
def test_server_bad_memory(memory):
    with pytest.raises(ValueError):
        gdrkv.Server(memory=memory, pretouch=False)


@pytest.mark.parametrize("share", [0.0, -0.25, 1.5])
def test_server_bad_peer_pin_share(share):
    with pytest.raises(ValueError, match="peer_pin_share"):
        gdrkv.Server(memory="16MiB", pretouch=False, peer_pin_share=share)


@pytest.mark.parametrize("low, high", [(0.0, 0.9), (0.95, 0.9), (0.5, 1.5)])
def test_server_bad_watermarks(low, high):
    with pytest.raises(ValueError, match="watermark"):
        gdrkv.Server(memory="16MiB", pretouch=False, low_watermark=low, high_watermark=high)


def test_server_lifecycle():
    server = gdrkv.Server(memory="32MiB", pretouch=False, workers=2)
    assert re.fullmatch(r"127\.0\.0\.1:\d+", server.address) and not server.address.endswith(":0")
    assert server.url == f"gdrkv://{server.address}"
    stats = server.stats()
    assert stats and all(isinstance(v, (int, float)) for v in stats.values())
    with gdrkv.Client(server.url) as client:
        client.put("k", b"v")
        assert server.stats()["objects"] == 1
    server.close()
    server.close()
    with gdrkv.Client(server.url, timeout_ms=500, connect_timeout_ms=200) as client:
        assert client.ping() is False
