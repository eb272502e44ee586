"""The gdrkv command: serve, stat, bench, doctor."""
import argparse
import json
import signal
import sys

from . import config
from .bench import command as bench
from .doctor import nic as stat_nic, report as doctor
from .client import Client
from .errors import GdrkvError
from .server import Server
from .sizes import format_size, parse_size, physical_memory
from .table import format_table

DEFAULT_LISTEN = "127.0.0.1:7480"
DEFAULT_MEMORY_SHARE = 0.25
DEFAULT_MEMORY_CAP = 64 << 30


def main(argv=None):
    parser = argparse.ArgumentParser(prog="gdrkv", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run a store server until SIGTERM/SIGINT")
    serve.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                       help=f"address to serve on (default {DEFAULT_LISTEN}; port 0 picks one)")
    serve.add_argument("--memory", type=_pool_size, default=_default_pool_size(),
                       metavar="SIZE|PCT%",
                       help="pool size, e.g. 16GiB or 25%% of RAM "
                            "(default 25%% of RAM, at most 64GiB)")
    serve.add_argument("--workers", type=int, default=0,
                       help="network threads (default 0: one per CPU, at most 16)")
    serve.add_argument("--busy-poll-us", type=_busy_poll, default="auto", metavar="US|auto",
                       help="after serving a frame, a network thread polls this long before "
                            "it sleeps, so a busy client's next frame finds it awake: less "
                            "latency for some CPU (default auto: 1000 on hosts of 8 CPUs or "
                            "more, else 0, off)")
    serve.add_argument("--hugepages", choices=("auto", "on", "off"), default="auto")
    serve.add_argument("--no-pretouch", dest="pretouch", action="store_false",
                       help="do not fault the pool in at start (faster start, slower first writes)")
    serve.add_argument("--stall-timeout-ms", type=int, default=30000,
                       help="close connections stalled mid-frame this long (default 30000)")
    serve.add_argument("--max-connections", type=int, default=4096,
                       help="tcp connections at a time; local (unix) ones have as many apart "
                            "(default 4096)")
    serve.add_argument("--max-connections-per-peer", type=int, default=512,
                       help="tcp connections from one IP address (default 512)")
    serve.add_argument("--idle-timeout-ms", type=int, default=300000,
                       help="close connections without a frame for this long; clients "
                            "reconnect (default 300000)")
    serve.add_argument("--max-buffered", default="256MiB", metavar="SIZE",
                       help="request bodies buffered over all connections; bigger ones wait "
                            "(default 256MiB)")
    serve.add_argument("--unix-path", metavar="PATH",
                       help="unix socket for local clients (the shm transport); default "
                            "/tmp/gdrkv-<uid>/<port>.sock, or $GDRKV_RUNTIME_DIR/<port>.sock; "
                            "'' turns shm off")
    serve.add_argument("--lease-timeout-ms", type=int, default=5000,
                       help="longest an shm or rdma client may hold the objects it reads "
                            "or the room it writes into (default 5000)")
    serve.add_argument("--shm-staging", default="64MiB", metavar="SIZE",
                       help="staging memfd of each local connection: shm PUT values go there "
                            "and the server copies them into the pool (default 64MiB; "
                            "0 sends them on the socket)")
    serve.add_argument("--single-tenant", action="store_true",
                       help="local clients map the pool writable and copy PUT values straight "
                            "into their reservations: faster writes, but any local client of "
                            "this user can then overwrite any object")
    serve.add_argument("--pool-file", metavar="PATH",
                       help="keep the pool in PATH (on tmpfs such as /dev/shm, or hugetlbfs) "
                            "and, when PATH holds the pool of an earlier server of the same "
                            "--memory, serve its objects again: the cache survives a restart, "
                            "a crash or kill -9 (not a reboot)")
    serve.add_argument("--reset-pool-file", action="store_true",
                       help="start the --pool-file empty whatever it holds (another size, "
                            "another version, damaged)")
    serve.add_argument("--disk", metavar="PATH[,PATH...]",
                       help="a disk tier under the pool: objects the pool evicts go to a file "
                            "in each directory (a local SSD) instead of being dropped, and "
                            "come back when read; the next server finds them again")
    serve.add_argument("--disk-size", type=parse_size, metavar="SIZE",
                       help="size of the disk tier's file in each --disk directory, e.g. "
                            "500GiB")
    serve.add_argument("--reset-disk", action="store_true",
                       help="start the --disk files empty whatever they hold")
    serve.add_argument("--rdma", choices=("auto", "on", "off"), default="auto",
                       help="serve rdma clients: auto when a device is there (default), on "
                            "to require one")
    serve.add_argument("--auth-token-file", metavar="PATH",
                       help="serve only clients holding the secret in PATH (mode 600; clients "
                            "give token_file= or GDRKV_TOKEN_FILE); required to listen on an "
                            "address other hosts can reach")
    serve.add_argument("--insecure-no-auth", action="store_true",
                       help="listen on an address other hosts can reach without a token: "
                            "anyone reaching it can read, overwrite and clear the cache")
    serve.add_argument("--drain-timeout-ms", type=int, default=5000,
                       help="on SIGTERM, let frames in flight finish this long, accepting "
                            "nothing new (default 5000)")
    serve.add_argument("--metrics-listen", metavar="HOST:PORT",
                       help="serve the counters in the Prometheus text format at "
                            "http://HOST:PORT/metrics")
    serve.add_argument("--config", metavar="FILE",
                       help="a TOML file of these settings under their long names "
                            "(listen = \"...\", memory = \"16GiB\", ...); flags win over it")
    serve.add_argument("--print-config", action="store_true",
                       help="print the settings in effect as TOML and exit")
    serve.set_defaults(run=_serve, serve_parser=serve)

    stat = commands.add_parser("stat", help="print every server's counters")
    stat.add_argument("url", nargs="?",
                      help="gdrkv://host:port[,host:port...] (optional with --nic)")
    stat.add_argument("--json", action="store_true", help="print JSON instead of a table")
    stat.add_argument("--nic", action="store_true",
                      help="also show each RDMA port's hardware counters (sysfs)")
    stat.add_argument("--interval", type=float, default=0, metavar="S",
                      help="with --nic: per-second rates from two samples S seconds apart")
    stat.set_defaults(run=_stat)

    bench_cmd = commands.add_parser("bench", help="measure put/get/exists throughput")
    bench.add_arguments(bench_cmd)
    bench_cmd.set_defaults(run=bench.run)

    doctor_cmd = commands.add_parser("doctor", help="report what this machine offers gdrkv")
    doctor.add_arguments(doctor_cmd)
    doctor_cmd.set_defaults(run=doctor.run)

    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            config.apply(args.serve_parser, args, sys.argv[1:] if argv is None else argv)
        return args.run(args)
    except (GdrkvError, ValueError) as e:
        print(f"gdrkv {args.command}: {e}", file=sys.stderr)
        return 1


def _serve(args):
    if args.print_config:
        print(config.dump(args.serve_parser, args), end="")
        return 0
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    # Blocked before the server's C threads exist, so they inherit the mask
    # and the signals wait for sigwait() below instead of interrupting them.
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals | {signal.SIGHUP})
    with Server(listen=args.listen, memory=args.memory, workers=args.workers,
                busy_poll_us=args.busy_poll_us,
                hugepages=args.hugepages, pretouch=args.pretouch,
                stall_timeout_ms=args.stall_timeout_ms,
                max_connections=args.max_connections,
                max_connections_per_peer=args.max_connections_per_peer,
                idle_timeout_ms=args.idle_timeout_ms, max_buffered=args.max_buffered,
                drain_timeout_ms=args.drain_timeout_ms,
                unix_path=args.unix_path,
                lease_timeout_ms=args.lease_timeout_ms, rdma=args.rdma,
                shm_staging=args.shm_staging, single_tenant=args.single_tenant,
                pool_file=args.pool_file, reset_pool_file=args.reset_pool_file,
                disk=args.disk, disk_size=args.disk_size, reset_disk=args.reset_disk,
                auth_token_file=args.auth_token_file,
                insecure_no_auth=args.insecure_no_auth,
                metrics_listen=args.metrics_listen) as server:
        rdma = ", rdma" if server.stats().get("rdma_enabled") else ""
        shm = f", shm on {server.unix_path}" if server.unix_path else ""
        shm += f", metrics on http://{server.metrics_address}/metrics" \
            if server.metrics_address else ""
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


def _busy_poll(text):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of microseconds or auto, "
                                         f"not {text!r}") from None


def _default_pool_size():
    return min(int(physical_memory() * DEFAULT_MEMORY_SHARE), DEFAULT_MEMORY_CAP)
