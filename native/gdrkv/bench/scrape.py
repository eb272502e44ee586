"""gdrkv bench --scrape: what a Prometheus scrape costs the data path
(#39): GETs with and without a scraper at --scrape-rate scrapes a second.

A server in this process (--scrape-memory, /metrics on loopback) holds
--scrape-namespaces hostile namespaces, each a 255-byte name whose every
character needs escaping in a label, each with one object; a client
(--transport) GETs --count objects of each size (--sizes, default 4KiB)
one at a time for --scrape-seconds. A scraper in a process of its own
fetches /metrics --scrape-rate times a second during the "scraping" runs.
"none" and "scraping" runs alternate, --repeat of each; each reports its
GET rate and p99 latency, and the table shows the best of them (the
highest rate, the lowest p99) and the ratio of scraping to none.
"""
import statistics
import subprocess
import sys
import time

from ..client import Client
from ..server import Server
from ..sizes import format_size, parse_size
from ..table import format_table
from . import harness

# The scraper: a process of its own, as Prometheus is; it says "ready"
# after its first scrape (the timed run starts then, not during Python's
# start-up) and prints how many scrapes it made and their median duration
# when told to stop (stdin closes).
SCRAPER = r"""
import statistics, sys, threading, time, urllib.request
url, rate = sys.argv[1], float(sys.argv[2])
stop, took = threading.Event(), []
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
next_at = time.monotonic()
while not stop.is_set():
    start = time.monotonic()
    with urllib.request.urlopen(url, timeout=10) as answer:
        answer.read()
    took.append(time.monotonic() - start)
    if len(took) == 1:
        print("ready", flush=True)
    next_at += 1 / rate
    stop.wait(max(0.0, next_at - time.monotonic()))
print(len(took) - 1, statistics.median(took) if took else 0.0)
"""


def add_arguments(parser):
    parser.add_argument("--scrape", action="store_true",
                        help="GET rate and p99 with a /metrics scraper against none, with "
                             "--scrape-namespaces hostile namespaces (sizes: --sizes, "
                             "default 4KiB)")
    parser.add_argument("--scrape-rate", type=float, default=10.0, metavar="N",
                        help="scrapes a second (default 10)")
    parser.add_argument("--scrape-namespaces", type=int, default=1000, metavar="N",
                        help="namespaces with 255-byte names to escape (default 1000)")
    parser.add_argument("--scrape-seconds", type=float, default=5.0, metavar="S",
                        help="length of each run (default 5)")
    parser.add_argument("--scrape-memory", type=parse_size, default=parse_size("256MiB"),
                        metavar="SIZE", help="the server's pool (default 256MiB)")


def hostile_namespace(i):
    """255 bytes, each character of which a label must escape."""
    head = f"{i:04d}"
    return head + "\u00e9" * ((255 - len(head)) // 2) + '"' * ((255 - len(head)) % 2)


def run(args):
    rows = []
    with Server(memory=args.scrape_memory, pretouch=False, rdma="off",
                metrics_listen="127.0.0.1:0") as server:
        for i in range(args.scrape_namespaces):
            with Client(server.url, namespace=hostile_namespace(i), transport="tcp") as c:
                c.put("k", b"x" * (1 + i))
        url = f"http://{server.metrics_address}/metrics"
        for size in args.sizes:
            rows.append(_measure(server, url, size, args))
            print(_table(rows[-1:]), flush=True)
    harness.write_json(args.json, {"options": {k: v for k, v in vars(args).items()
                                               if k not in ("run", "command")},
                                   "results": rows})
    return 0


def _measure(server, url, size, args):
    with Client(server.url, namespace="bench-scrape", transport=args.transport) as client:
        keys = [f"{size}/{i}" for i in range(args.count)]
        value = bytes(harness.pattern(size))
        for key in keys:
            client.put(key, value)
        runs = {"none": [], "scraping": []}
        scrapes = []
        for _ in range(args.repeat):
            runs["none"].append(_gets(client, keys, args.scrape_seconds))
            scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, url, str(args.scrape_rate)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            try:
                if scraper.stdout.readline().strip() != "ready":
                    raise RuntimeError("the scraper did not start")
                runs["scraping"].append(_gets(client, keys, args.scrape_seconds))
            finally:
                out, _ = scraper.communicate("", timeout=60)
            count, took = out.split()
            scrapes.append((int(count), float(took)))
        client.clear()
    best = {name: {"gets_per_s": max(r["gets_per_s"] for r in rs),
                   "p99_us": min(r["p99_us"] for r in rs)} for name, rs in runs.items()}
    return {"size": size, "namespaces": args.scrape_namespaces, "rate": args.scrape_rate,
            "runs": runs, "best": best,
            "scrapes_per_s": statistics.median(n for n, _ in scrapes) / args.scrape_seconds,
            "scrape_ms": statistics.median(t for _, t in scrapes) * 1e3}


def _gets(client, keys, seconds):
    latencies, n = [], 0
    end = time.perf_counter() + seconds
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        if t0 >= end:
            break
        if client.get(keys[n % len(keys)]) is None:
            raise RuntimeError(f"{keys[n % len(keys)]} is missing")
        latencies.append(time.perf_counter() - t0)
        n += 1
    elapsed = time.perf_counter() - start
    latencies.sort()
    return {"gets_per_s": n / elapsed, "p99_us": latencies[int(0.99 * (len(latencies) - 1))] * 1e6}


def _table(rows):
    out = [["size", "namespaces", "scrapes/s", "scrape ms", "GET/s none", "GET/s scraping",
            "ratio", "p99 us none", "p99 us scraping", "ratio"]]
    for r in rows:
        none, scraping = r["best"]["none"], r["best"]["scraping"]
        out.append([format_size(r["size"]), str(r["namespaces"]), f"{r['scrapes_per_s']:.1f}",
                    f"{r['scrape_ms']:.1f}", f"{none['gets_per_s']:.0f}",
                    f"{scraping['gets_per_s']:.0f}",
                    f"{scraping['gets_per_s'] / none['gets_per_s']:.3f}",
                    f"{none['p99_us']:.0f}", f"{scraping['p99_us']:.0f}",
                    f"{scraping['p99_us'] / none['p99_us']:.3f}"])
    return format_table(out)
