"""The PNG of `gdrkv bench --compare`: throughput against object size, one
line per system and one panel per operation, the ceilings dashed."""

PANELS = (("put", "gb_per_s", "put GB/s"), ("get", "gb_per_s", "get GB/s"),
          ("exists", "mkeys_per_s", "exists Mkeys/s"))
CEILINGS = (("tcp_gb_per_s", "loopback TCP stream"), ("memcpy_gb_per_s", "memcpy"))


def plot(report, path):
    """Draws report (compare.py's JSON) to path; ImportError without
    matplotlib."""
    import matplotlib
    matplotlib.use("Agg")       # no display: files only
    from matplotlib import pyplot

    from ..sizes import format_size

    results = report["results"]
    sizes = sorted({r["size"] for r in results})
    systems = list(dict.fromkeys(r["system"] for r in results))
    figure, axes = pyplot.subplots(1, len(PANELS), figsize=(15, 4.6))
    for ax, (op, metric, title) in zip(axes, PANELS):
        for system in systems:
            rows = sorted((r for r in results if r["system"] == system and r["op"] == op),
                          key=lambda r: r["size"])
            ax.plot([r["size"] for r in rows], [r[metric] for r in rows], marker="o",
                    label=system)
        if metric == "gb_per_s":
            for (key, label), color in zip(CEILINGS, ("black", "grey")):
                if key in report["ceilings"]:
                    ax.axhline(report["ceilings"][key], linestyle="--", color=color,
                               label=f"{label} (ceiling)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [format_size(s) for s in sizes])
        ax.minorticks_off()
        ax.set_xlabel(f"object size, batches of {results[0]['count']}")
        ax.set_title(title)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].legend(fontsize="small")
    machine = report["machine"]
    figure.suptitle(f"gdrkv bench --compare, {report['date']}, {machine['cpus']} CPUs "
                    f"({machine['cpu_model']})", fontsize="medium")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    pyplot.close(figure)
