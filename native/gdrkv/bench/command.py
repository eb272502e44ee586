"""The `gdrkv bench` command: its arguments, and the dispatch to a mode.

Plain (plain.py): batched put/get/exists throughput against a server in
another process, side by side with this machine's ceilings (the loopback TCP
stream and memcpy) measured in the same run (harness.py). --compare
(compare.py) adds every transport, the peers (peers.py) and the engines'
own storage (engines.py); --gpu (gpu.py) measures host<->GPU paths; --vllm
(vllm.py) the vLLM connector's save and load of GPU KV; --restart
(restart.py) a server's restart on a full pool file; --cluster N
(cluster.py) a cluster in etcd through a kill, a join and a leave.
"""
import argparse
import contextlib
import os
import sys

from ..client import Client
from ..sizes import parse_size
from ..sysinfo.host import cpu_model
from . import cluster, disk, gpu, plain, restart, scrape, vllm
from .harness import Ceilings, Progress, server, tcp_stream, write_json

OPS = ("put", "get", "exists")
DEFAULT_SIZES = "4KiB,64KiB,1MiB"


def add_arguments(parser):
    parser.add_argument("--url",
                        help="server to measure (default: start one in a separate process)")
    parser.add_argument("--sizes", type=parse_sizes,
                        help="object sizes (default 4KiB,64KiB,1MiB; with --compare "
                             "4KiB,64KiB,1MiB,4MiB)")
    parser.add_argument("--count", type=parse_positive, default=256,
                        help="objects per batch (default 256)")
    parser.add_argument("--repeat", type=parse_positive, default=5,
                        help="rounds per measurement; the median is reported (default 5)")
    parser.add_argument("--ops", type=parse_ops, default=",".join(OPS),
                        help=f"operations to measure (default {','.join(OPS)})")
    parser.add_argument("--conns", type=parse_positive,
                        help="connections per server (default: the client's)")
    parser.add_argument("--transport", default="auto", help="client transport (default auto)")
    parser.add_argument("--ceiling", action="store_true",
                        help="also measure the loopback TCP stream and memcpy, "
                             "between gdrkv's rounds")
    parser.add_argument("--json", metavar="PATH",
                        help="write the machine, the options and every median here")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--compare", action="store_true",
                        help="gdrkv over every transport, Mooncake, Redis and the engines' "
                             "own storage on one workload, with the ceilings (it starts "
                             "every server: no --url, --conns or --transport)")
    parser.add_argument("--single-tenant", action="store_true",
                        help="start the server with --single-tenant: shm clients copy PUT "
                             "values straight into the pool (docs/transports.md)")
    parser.add_argument("--pool-file", metavar="PATH",
                        help="start the server on this pool file, emptied first "
                             "(gdrkv serve --pool-file): the cost of headers in the pool")
    parser.add_argument("--png", metavar="PATH",
                        help="with --compare: plot throughput against object size here; "
                             "with --cluster: keys/s and failures over time")
    gpu.add_arguments(parser)
    vllm.add_arguments(parser)
    restart.add_arguments(parser)
    disk.add_arguments(parser)
    scrape.add_arguments(parser)
    cluster.add_arguments(parser)


def run(args):
    if (args.single_tenant or args.pool_file) and args.url:
        print("gdrkv bench: --single-tenant and --pool-file start the server: no --url",
              file=sys.stderr)
        return 2
    if args.cluster is not None:
        return cluster.run(args)
    if args.gpu:
        return gpu.run(args)
    if args.vllm:
        return vllm.run(args)
    if args.restart:
        args.sizes = args.sizes or parse_sizes("4KiB,64KiB")
        return restart.run(args)
    if args.scrape:
        args.sizes = args.sizes or parse_sizes("4KiB")
        return scrape.run(args)
    if args.disk_tier:
        args.sizes = args.sizes or parse_sizes(disk.DEFAULT_SIZES)
        return disk.run(args)
    if args.compare:
        from . import compare
        args.sizes = args.sizes or parse_sizes(compare.DEFAULT_SIZES)
        return compare.run(args)
    args.sizes = args.sizes or parse_sizes(DEFAULT_SIZES)
    progress = Progress(len(args.sizes) * len(args.ops) * args.repeat,
                        enabled=sys.stderr.isatty() and not args.quiet)
    options = {"transport": args.transport, "namespace": f"gdrkv-bench-{os.getpid()}"}
    if args.conns:
        options["conns"] = args.conns
    try:
        with progress, contextlib.ExitStack() as stack:
            ceilings = Ceilings(stack.enter_context(tcp_stream())) if args.ceiling else None
            flags = ["--pool-file", args.pool_file, "--reset-pool-file"] if args.pool_file else []
            url = stack.enter_context(server(args, flags))
            client = stack.enter_context(Client(url, **options))
            results = [r for size in args.sizes
                       for r in plain.bench_size(client, size, args, ceilings, progress)]
            client.clear()
    except (RuntimeError, OSError) as e:
        print(f"gdrkv bench: {e}", file=sys.stderr)
        return 1
    summary = ceilings.medians() if ceilings else {}
    print(plain.table(results, summary))
    write_json(args.json, report(args, results, summary))
    return 0


def report(args, results, ceilings):
    options = {k: v for k, v in vars(args).items() if k not in ("run", "command")}
    return {"machine": {"cpus": os.cpu_count(), "cpu_model": cpu_model()},
            "options": options, "ceilings": ceilings, "results": results}


# ---------------------------------------------------------------- arguments

def parse_sizes(text):
    try:
        sizes = [parse_size(s) for s in text.split(",")]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if 0 in sizes:
        raise argparse.ArgumentTypeError("sizes must be positive")
    return sizes


def parse_positive(text):
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    return int(text)


def parse_ops(text):
    ops = text.split(",")
    unknown = set(ops) - set(OPS)
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown op {sorted(unknown)[0]!r}; ops: {', '.join(OPS)}")
    return [op for op in OPS if op in ops]
