"""What a cluster is made of in etcd: its URL, where its members' entries
live and what an entry holds.

A cluster NAME on etcd endpoints E1,E2 keeps one key per server,
/gdrkv/NAME/members/HOST:PORT, whose value is a JSON object:
    {"addr": "HOST:PORT", "capacity": pool bytes, "zone": failure domain,
     "state": "serving" | "leaving", "registered": unix seconds it was put
     on its lease}
on the server's etcd lease. Nothing secret goes there. Anything read back
is checked (parse_entry): an entry that is not this shape is logged and
left out, never trusted.
"""
import json
import logging
import re
from typing import NamedTuple

from .etcd import parse_endpoints

log = logging.getLogger("gdrkv.cluster")

SERVER_SCHEME = "etcd://"
CLIENT_SCHEME = "gdrkv+etcd://"
STATES = ("serving", "leaving")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
_ADDR = re.compile(r"([A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):[0-9]{1,5}\Z")
_MAX_ZONE = 255
_MAX_ENTRY = 4096


class Member(NamedTuple):
    addr: str
    capacity: int
    zone: str
    state: str
    registered: float

    @property
    def leaving(self):
        return self.state == "leaving"


def parse_cluster(text, scheme=SERVER_SCHEME):
    """(etcd endpoints, cluster name, query) from scheme + E1,E2/NAME[?query]."""
    if not text.startswith(scheme):
        raise ValueError(f"not a cluster URL: {text!r} (expected {scheme}H1:2379[,H2...]/NAME)")
    rest, _, query = text[len(scheme):].partition("?")
    hosts, slash, name = rest.partition("/")
    if not slash or not _NAME.match(name):
        raise ValueError(f"cluster URL {text!r} needs a name of 1 to 64 letters, digits, "
                         "'.', '_' or '-' after the endpoints")
    return parse_endpoints(hosts), name, query


def prefix(name):
    return f"/gdrkv/{name}/members/".encode()


def entry_key(name, addr):
    return prefix(name) + addr.encode()


def make_entry(addr, capacity, zone, state, registered):
    return json.dumps({"addr": addr, "capacity": capacity, "zone": zone, "state": state,
                       "registered": registered}, sort_keys=True).encode()


def valid_addr(addr):
    if not isinstance(addr, str) or not _ADDR.match(addr):
        return False
    return 0 < int(addr.rsplit(":", 1)[1]) < 65536


def parse_entry(name, key, value):
    """The Member an entry holds, or None (logged) when it is not one."""
    try:
        if len(value) > _MAX_ENTRY:
            raise ValueError(f"{len(value)} bytes")
        entry = json.loads(value)
        if not isinstance(entry, dict):
            raise ValueError("not an object")
        addr, capacity, zone = entry.get("addr"), entry.get("capacity"), entry.get("zone")
        state, registered = entry.get("state"), entry.get("registered", 0)
        if not valid_addr(addr) or key != entry_key(name, addr):
            raise ValueError(f"addr {addr!r} is no host:port of its key")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0 \
                or capacity >= 1 << 63:
            raise ValueError(f"capacity {capacity!r}")
        if not isinstance(zone, str) or not 0 < len(zone.encode()) <= _MAX_ZONE \
                or "\0" in zone:
            raise ValueError(f"zone {zone!r}")
        if state not in STATES:
            raise ValueError(f"state {state!r}")
        if isinstance(registered, bool) or not isinstance(registered, (int, float)):
            raise ValueError(f"registered {registered!r}")
    except (ValueError, UnicodeDecodeError) as e:
        log.warning("gdrkv cluster %s: ignoring the bad entry %r: %s", name, key[:300], e)
        return None
    return Member(addr, capacity, zone, state, float(registered))
