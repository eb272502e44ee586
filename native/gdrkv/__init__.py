"""gdrkv: a KV-cache store for LLM serving engines.

    with gdrkv.Server(memory="1GiB") as server, gdrkv.Client(server.url) as client:
        client.put("key", b"value")
        assert client.get("key") == b"value"

Batched zero-copy transfers: Client.register(), batch_put(), batch_get().
"""
from . import errors
from .client import Client, place
from .errors import (
    E_BUSY, E_CLOSED, E_INTERNAL, E_INVALID, E_NO_SPACE, E_NOT_FOUND, E_PROTOCOL, E_TIMEOUT,
    E_TOO_LARGE, E_TOO_SMALL, E_UNAVAILABLE, E_UNSUPPORTED, OK, GdrkvError, strerror,
)
from .server import Server

__all__ = [
    "Client", "Server", "place", "GdrkvError", "errors", "strerror",
    "OK", "E_NOT_FOUND", "E_TOO_SMALL", "E_NO_SPACE", "E_TIMEOUT", "E_UNAVAILABLE", "E_PROTOCOL",
    "E_INVALID", "E_TOO_LARGE", "E_BUSY", "E_UNSUPPORTED", "E_INTERNAL", "E_CLOSED",
]
