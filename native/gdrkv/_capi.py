"""Conventions of the C API seen from Python: option structs filled with
checked integers, start-up errors written into a message buffer, and
counters reported as "name value\\n" text (the same format for server,
client and remote-server stats)."""
from ._native import ffi
from .errors import E_INVALID, GdrkvError, check, strerror

_ADDRESS_LEN = 320                     # "host:port", host up to 255 bytes
_FIRST_BUFFER = 64 << 10
_LAST_BUFFER = 16 << 20


def set_int_field(struct, field, value, option, minimum=0):
    """struct.field = value, or ValueError naming the option when value is not
    an integer in [minimum, the field's maximum]; minimum None leaves the
    bounds to the field's C type (and the C side's check)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{option} must be an integer, not {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{option} must be at least {minimum}, not {value}")
    try:
        setattr(struct, field, value)
    except OverflowError:
        how = "too large" if value > 0 else "out of range"
        raise ValueError(f"{option} is {how}: {value}") from None


def start_error(code, err):
    """The exception for an open/start call that failed with code and wrote
    why into the char buffer err: a bad argument is a ValueError."""
    message = ffi.string(err).decode(errors="replace") or strerror(code)
    return ValueError(message) if code == E_INVALID else GdrkvError(code, message)


def read_address(c_function, *args):
    """The "host:port" that c_function(*args, buf, len) writes."""
    buf = ffi.new("char[]", _ADDRESS_LEN)
    check(c_function(*args, buf, _ADDRESS_LEN), "address")
    return ffi.string(buf).decode(errors="replace")


def read_text(c_function, *args):
    """The text c_function(*args, buf, len) writes. It is cut at the
    buffer's end, so a full buffer is read again into a bigger one."""
    size = _FIRST_BUFFER
    while True:
        buf = ffi.new("char[]", size)
        n = check(c_function(*args, buf, size), "stats")
        if n < size - 1 or size >= _LAST_BUFFER:
            return ffi.string(buf, n).decode(errors="replace")
        size *= 4


def read_counters(c_function, *args):
    """read_text parsed into a dict of int/float."""
    return parse_counters(read_text(c_function, *args))


def parse_counters(text):
    """{"name": int or float} from the text; lines that are not a name and a
    number are skipped (a remote server's text is not trusted)."""
    counters = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        try:
            counters[name] = _number(value)
        except ValueError:
            continue
    return counters


def _number(text):
    try:
        return int(text)
    except ValueError:
        return float(text)
