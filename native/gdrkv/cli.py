"""The gdrkv command: serve, stat, cluster, bench, doctor."""
import argparse
import json
import signal
import sys

from . import config
from .bench import command as bench
from .doctor import nic as stat_nic, report as doctor
from .client import Client
from .cluster import status as cluster_status
from .cluster.etcd import EtcdError
from .errors import GdrkvError
from .server import OPTIONS, Server
from .sizes import format_size, parse_size, physical_memory
from .table import format_table

DEFAULT_MEMORY_SHARE = 0.25
DEFAULT_MEMORY_CAP = 64 << 30


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            config.apply(args.serve_parser, args, sys.argv[1:] if argv is None else argv)
        return args.run(args)
    except (GdrkvError, ValueError, EtcdError) as e:
        print(f"gdrkv {args.command}: {e}", file=sys.stderr)
        return 1


def make_parser():
    """The command line of every subcommand (the docs' snippets are checked
    against it too)."""
    parser = argparse.ArgumentParser(prog="gdrkv", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run a store server until SIGTERM/SIGINT")
    _add_option_flags(serve)
    serve.add_argument("--config", metavar="FILE",
                       help="a TOML file of these settings under their long names "
                            "(listen = \"...\", memory = \"16GiB\", ...); flags win over it")
    serve.add_argument("--print-config", action="store_true",
                       help="print the settings in effect as TOML and exit")
    serve.set_defaults(run=_serve, serve_parser=serve)

    stat = commands.add_parser("stat", help="print every server's counters")
    stat.add_argument("url", nargs="?",
                      help="gdrkv://host:port[,host:port...] or gdrkv+etcd://E1:2379[,...]/NAME "
                           "(optional with --nic)")
    stat.add_argument("--json", action="store_true", help="print JSON instead of a table")
    stat.add_argument("--nic", action="store_true",
                      help="also show each RDMA port's hardware counters (sysfs)")
    stat.add_argument("--interval", type=float, default=0, metavar="S",
                      help="with --nic: per-second rates from two samples S seconds apart")
    stat.set_defaults(run=_stat)

    cluster = commands.add_parser("cluster", help="look at a cluster of servers in etcd")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True,
                                              metavar="COMMAND")
    status = cluster_commands.add_parser("status", help="list the members: address, zone, "
                                         "state, capacity, use, hit ratio, lease")
    status.add_argument("url", help="gdrkv+etcd://H1:2379[,H2:2379...]/NAME[?token_file=PATH]")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.set_defaults(run=_cluster_status)

    bench_cmd = commands.add_parser("bench", help="measure put/get/exists throughput")
    bench.add_arguments(bench_cmd)
    bench_cmd.set_defaults(run=bench.run)

    doctor_cmd = commands.add_parser("doctor", help="report what this machine offers gdrkv")
    doctor.add_arguments(doctor_cmd)
    doctor_cmd.set_defaults(run=doctor.run)
    return parser


def _serve(args):
    if args.print_config:
        print(config.dump(args.serve_parser, args), end="")
        return 0
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    # Blocked before the server's C threads exist, so they inherit the mask
    # and the signals wait for sigwait() below instead of interrupting them.
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals | {signal.SIGHUP})
    with Server(**{name: getattr(args, name) for name in OPTIONS}) as server:
        rdma = ", rdma" if server.stats().get("rdma_enabled") else ""
        shm = f", shm on {server.unix_path}" if server.unix_path else ""
        shm += f", metrics on http://{server.metrics_address}/metrics" \
            if server.metrics_address else ""
        shm += f", in cluster {args.cluster}" if args.cluster else ""
        print(f"gdrkv listening on {server.address} (pool {format_size(args.memory)}{rdma}{shm})",
              flush=True)
        # SIGHUP asks for a reload: every setting so far is fixed for the
        # server's life, and the operator is told so instead of guessing.
        while signal.sigwait(stop_signals | {signal.SIGHUP}) == signal.SIGHUP:
            print("gdrkv serve: SIGHUP: no setting can change while the server runs; "
                  "restart it to apply a new configuration", file=sys.stderr, flush=True)
    return 0


def _stat(args):
    if args.interval and not args.nic:
        raise ValueError("--interval needs --nic")
    if args.interval < 0:
        raise ValueError(f"--interval must not be negative, not {args.interval}")
    if args.nic:
        return stat_nic.run(args, _table)
    if not args.url:
        raise ValueError("a server URL is needed (or --nic for the NIC counters alone)")
    with Client(args.url) as client:
        stats = client.stats()
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
    else:
        print(_table(stats["servers"]))
    return 1 if any("error" in counters for counters in stats["servers"].values()) else 0


def _cluster_status(args):
    rows = cluster_status.read(args.url)
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
    else:
        print(cluster_status.table(rows) if rows else "no members")
    return 1 if any("error" in row for row in rows) else 0


def _table(servers):
    """Counters down, servers across."""
    names = dict.fromkeys(name for counters in servers.values() for name in counters)
    rows = [["counter", *servers]]
    rows += [[name, *(_cell(counters.get(name, "")) for counters in servers.values())]
             for name in names]
    return format_table(rows)


def _cell(value):
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _pool_size(text):
    try:
        if text.endswith("%"):
            share = float(text[:-1]) / 100
            if not 0 < share <= 1:
                raise ValueError(f"a share of RAM must be in (0%, 100%], not {text}")
            return int(physical_memory() * share)
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _default_pool_size():
    return min(int(physical_memory() * DEFAULT_MEMORY_SHARE), DEFAULT_MEMORY_CAP)


# Where `gdrkv serve` differs from gdrkv.Server: its pool is a share of RAM.
_SERVE_OVERRIDES = {
    "memory": dict(type=_pool_size, metavar="SIZE|PCT%",
                   help="pool size, e.g. 16GiB or 25% of RAM (default 25% of RAM, at most 64GiB)"),
    "cluster": dict(metavar="etcd://HOST:PORT[,...]/NAME"),
    "advertise": dict(metavar="HOST:PORT"),
    "zone": dict(metavar="ZONE"),
}
_UNITS = {"us": "microseconds", "ms": "milliseconds"}


def _add_option_flags(serve):
    """A flag for every server option (OPTIONS, from the C table): --name
    with dashes, or --no-name for a flag on by default. Each defaults to
    None, which leaves the C default; --print-config shows it."""
    for option in OPTIONS.values():
        flag = "--" + option.name.replace("_", "-")
        shown = option.default is not None and not isinstance(option.default, bool)
        extra = f" (default {option.default})" if shown else ""
        settings = dict(dest=option.name, default=None, help=option.help + extra)
        if option.kind == "flag":
            if option.default:
                flag = "--no-" + flag[2:]
                settings.update(action="store_false",
                                help=f"{option.help}: on by default, this turns it off")
            else:
                settings.update(action="store_true")
        elif option.kind == "mode":
            settings.update(choices=("auto", "on", "off"))
        elif option.kind == "int":
            settings.update(type=int)
        elif option.kind == "ratio":
            settings.update(type=float)
        elif option.kind == "size":
            settings.update(type=_size, metavar="SIZE")
        elif option.kind == "int_or_auto":
            unit = option.name.rpartition("_")[2]
            settings.update(type=_number_or_auto(_UNITS.get(unit, "units")),
                            metavar=unit.upper() + "|auto")
        else:
            settings.update(metavar="HOST:PORT" if option.name.endswith("listen") else "PATH")
        settings.update(_SERVE_OVERRIDES.get(option.name, {}))
        settings["help"] = settings["help"].replace("%", "%%")
        serve.add_argument(flag, **settings)
    serve.set_defaults(memory=_default_pool_size())


def _size(text):
    """A size checked but kept as written: 4096 stays a number, "64MiB" a
    string, so that --print-config shows what was given."""
    try:
        parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return int(text) if text.isdigit() else text


def _number_or_auto(unit):
    def parse(text):
        if text == "auto":
            return text
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number of {unit} or auto, "
                                             f"not {text!r}") from None
    return parse
