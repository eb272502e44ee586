"""The PNGs of `gdrkv bench`: --compare's throughput against object size,
one line per system and one panel per operation, the ceilings dashed; and
--cluster's keys/s and failed keys over time through a kill, a join and a
leave."""

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


def plot_timeline(report, path):
    """Draws --cluster's report (cluster.py) to path; ImportError without
    matplotlib."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    rows = report["timeline"]
    t = [r["t"] for r in rows]
    figure, (top, bottom) = pyplot.subplots(2, 1, figsize=(11, 6), sharex=True,
                                            height_ratios=(3, 1))
    top.plot(t, [r["keys_per_s"] for r in rows], label="keys/s served")
    bottom.plot(t, [r["failed"] for r in rows], color="red", label="failed keys")
    bottom.plot(t, [r["missed"] for r in rows], color="orange", label="missed keys")
    for ax in (top, bottom):
        for at, what in report["events"]:
            ax.axvline(at, linestyle="--", color="grey")
            if ax is top:
                ax.text(at, 0.02, f" {what}", transform=ax.get_xaxis_transform())
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="upper right")
    options = report["options"]
    top.set_title(f"{options['servers']} servers, {options['clients']} clients, "
                  f"replicas={options['replicas']}, lease {options['ttl_ms']} ms")
    top.set_ylabel("keys/s")
    bottom.set_ylabel("keys per 100 ms")
    bottom.set_xlabel("seconds")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
