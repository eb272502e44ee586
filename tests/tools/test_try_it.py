"""README's "Try it" command, `gdrkv bench --ceiling`, with small sizes and
counts: it must exit 0 and print a row per size and op with the two
ceiling columns filled in, then the ceilings themselves."""
import re

from support.util import run_gdrkv

SIZES = ("4KiB", "64KiB")
OPS = ("put", "get", "exists")


def test_bench_ceiling_runs_and_prints_every_row():
    result = run_gdrkv("bench", "--ceiling", "--count", "8", "--sizes", ",".join(SIZES),
                       "--repeat", "1", "--quiet", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["size", "op", "GB/s", "Mkeys/s", "batch", "p50", "ms",
                                "%", "TCP", "ceiling", "%", "memcpy"], lines[0]
    rows = [line.split() for line in lines[1:] if line.split()[:1] and line.split()[0] in SIZES]
    assert [(r[0], r[1]) for r in rows] == [(s, op) for s in SIZES for op in OPS]
    for size, op, gbs, mkeys, p50, tcp, mem in rows:
        assert float(mkeys) >= 0 and float(p50) > 0, (size, op)
        if op == "exists":                  # no bytes move: no bandwidth, no ceiling
            assert (gbs, tcp, mem) == ("-", "-", "-")
        else:
            # Figures, not "-" (small ones may round to 0 on a loaded machine).
            assert float(gbs) >= 0 and int(tcp) >= 0 and int(mem) >= 0, (size, op)
    ceilings = re.search(r"loopback TCP stream ([\d.]+) GB/s, memcpy ([\d.]+) GB/s",
                         result.stdout)
    assert ceilings and all(float(x) > 0 for x in ceilings.groups()), result.stdout
