"""Result codes of gdrkv (the values of enum gdrkv_error in gdrkv.h) and the
exception raised when a whole call fails.

Batch calls report per-key outcomes as these negative codes in their result
lists; only calls that could not run at all raise GdrkvError.
"""
from ._native import ffi, lib

OK = lib.GDRKV_OK
E_NOT_FOUND = lib.GDRKV_E_NOT_FOUND
E_TOO_SMALL = lib.GDRKV_E_TOO_SMALL
E_NO_SPACE = lib.GDRKV_E_NO_SPACE
E_TIMEOUT = lib.GDRKV_E_TIMEOUT
E_UNAVAILABLE = lib.GDRKV_E_UNAVAILABLE
E_PROTOCOL = lib.GDRKV_E_PROTOCOL
E_INVALID = lib.GDRKV_E_INVALID
E_TOO_LARGE = lib.GDRKV_E_TOO_LARGE
E_BUSY = lib.GDRKV_E_BUSY
E_UNSUPPORTED = lib.GDRKV_E_UNSUPPORTED
E_INTERNAL = lib.GDRKV_E_INTERNAL
E_CLOSED = lib.GDRKV_E_CLOSED
E_DENIED = lib.GDRKV_E_DENIED


def strerror(code):
    """Text for a result code, e.g. strerror(E_NOT_FOUND) == "not found"."""
    return ffi.string(lib.gdrkv_strerror(code)).decode()


class GdrkvError(Exception):
    """A gdrkv call failed as a whole; .code is the negative result code."""

    def __init__(self, code, message=None):
        self.code = code
        super().__init__(message or strerror(code))


def check(code, what=None):
    """Returns code when it is not an error, else raises GdrkvError."""
    if code < 0:
        raise GdrkvError(code, f"{what}: {strerror(code)}" if what else None)
    return code
