"""`gdrkv cluster status gdrkv+etcd://E1,E2/NAME[?token_file=...]`: every
member etcd lists, with what its entry says (zone, state, capacity), what
the server says (pool use, hit ratio) and its lease (age, seconds left)."""
import time
from urllib.parse import parse_qsl

from ..errors import GdrkvError
from ..sizes import format_size
from ..table import format_table
from .etcd import Etcd
from .members import CLIENT_SCHEME, parse_cluster, parse_entry, prefix

# Options of a cluster URL that say how to reach each server.
_SERVER_OPTIONS = ("token_file", "timeout_ms", "connect_timeout_ms")


def read(url):
    """[{addr, zone, state, capacity, lease_age_s, lease_ttl_s, used, hit_ratio
    or error}] of the cluster at url, sorted by address."""
    from ..client import Client
    endpoints, name, query = parse_cluster(url, CLIENT_SCHEME)
    options = {k: v for k, v in parse_qsl(query) if k in _SERVER_OPTIONS}
    etcd = Etcd(endpoints)
    rows = []
    for key, value, lease in etcd.range_prefix(prefix(name))[1]:
        member = parse_entry(name, key, value)
        if member is None:
            continue
        row = {"addr": member.addr, "zone": member.zone, "state": member.state,
               "capacity": member.capacity,
               "lease_age_s": round(max(0.0, time.time() - member.registered), 1),
               "lease_ttl_s": etcd.time_to_live(lease) if lease else None}
        try:
            with Client(f"gdrkv://{member.addr}", transport="tcp", **options) as client:
                stats = client.stats()["servers"][member.addr]
        except (GdrkvError, ValueError) as e:
            stats = {"error": str(e)}
        if "error" in stats:
            row["error"] = stats["error"]
        else:
            lookups = stats["hits"] + stats["misses"]
            row["used"] = stats["pool_used_bytes"] / max(1, stats["pool_bytes"])
            row["hit_ratio"] = stats["hits"] / lookups if lookups else None
        rows.append(row)
    return sorted(rows, key=lambda row: row["addr"])


def table(rows):
    lines = [["address", "zone", "state", "capacity", "used", "hit ratio", "lease age",
              "ttl left"]]
    for row in rows:
        hit = row.get("hit_ratio")
        lines.append([row["addr"], row["zone"], row["state"], format_size(row["capacity"]),
                      f"{row['used']:.1%}" if "used" in row else row["error"],
                      "-" if hit is None else f"{hit:.1%}", f"{row['lease_age_s']:.0f} s",
                      "-" if row["lease_ttl_s"] is None else f"{row['lease_ttl_s']} s"])
    return format_table(lines)
