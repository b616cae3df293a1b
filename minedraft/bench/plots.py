"""PNG plots of benchmark results."""

from pathlib import Path

from minedraft.bench.stats import percentiles


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    fig.clf()
    _pyplot().close(fig)


def plot_throughput_vs_k(rows: list[dict], path: Path) -> None:
    """Output tokens/s against k, one panel per concurrency and one colour per mode; ar (no k) is a
    dashed line, "auto" (k chosen every step) a star right of the largest k."""
    plt = _pyplot()
    concurrencies = sorted({r["concurrency"] for r in rows})
    fig, axes = plt.subplots(1, len(concurrencies), figsize=(5 * len(concurrencies) + 2, 4.2), squeeze=False)
    ks = sorted({r["k"] for r in rows if isinstance(r["k"], int)}) or [1]
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    colours = {mode: plt.get_cmap("tab10")(i % 10) for i, mode in enumerate(modes)}
    for ax, c in zip(axes[0], concurrencies):
        for mode in modes:
            line = [r for r in rows if r["mode"] == mode and r["concurrency"] == c]
            fixed = sorted((r for r in line if isinstance(r["k"], int)), key=lambda r: r["k"])
            if fixed:
                ax.plot([r["k"] for r in fixed], [r["output_tokens_per_s"] for r in fixed], marker="o",
                        color=colours[mode], label=mode)
            for r in line:
                if r["k"] is None:
                    ax.axhline(r["output_tokens_per_s"], linestyle="--", color=colours[mode], label=mode)
                elif r["k"] == "auto":
                    ax.plot([ks[-1] + 1], [r["output_tokens_per_s"]], marker="*", markersize=11, linestyle="",
                            color=colours[mode], label=f"{mode}, auto" if not fixed else None)
        ax.set_xticks(ks + [ks[-1] + 1], [str(k) for k in ks] + ["auto"])
        ax.set(xlabel="num_speculative_tokens k", ylabel="output tokens/s", title=f"{c} requests in flight")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    _save(fig, path)


def plot_latency_cdf(results: dict[tuple, list[dict]], path: Path) -> None:
    """Per-request end-to-end latency CDF of every (mode, k, concurrency), all repeats pooled."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    configs = sorted({(mode, str(k)) for mode, k, _ in results})
    colours = {config: plt.get_cmap("tab20")(i % 20) for i, config in enumerate(configs)}
    styles = {c: ("-", "--", ":", "-.")[i % 4] for i, c in enumerate(sorted({c for _, _, c in results}))}
    for (mode, k, c), runs in sorted(results.items(), key=lambda kv: (kv[0][2], kv[0][0], str(kv[0][1]))):
        e2e = sorted(x for r in runs for x in r["e2e_s"])
        ax.step(e2e, [(i + 1) / len(e2e) for i in range(len(e2e))], where="post", color=colours[(mode, str(k))],
                linestyle=styles[c], label=f"{mode}{'' if k is None else f', k={k}'}, {c} in flight")
    ax.set(xlabel="end-to-end latency per request (s)", ylabel="share of requests",
           title="Latency CDF (colour: mode and k; line style: requests in flight)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    _save(fig, path)


def plot_timeline(trace: list[dict], path: Path, title: str, max_seconds: float = 4.0) -> None:
    """Target (verify) and drafter (draft) activity over `max_seconds` of steady state (from the
    middle of the run), coloured by sub-batch: where the two lanes overlap, drafting was hidden
    behind verification."""
    if not trace:
        return
    plt = _pyplot()
    starts = sorted(e["start"] for e in trace)
    t0 = starts[len(starts) // 2]
    fig, ax = plt.subplots(figsize=(12, 2.6))
    lanes = {"verify": 1, "decode": 1, "prefill": 1, "draft": 0}
    colours = {0: "tab:blue", 1: "tab:orange", -1: "lightgrey"}  # sub-batch 0, 1; -1: prefill / plain decode
    for e in trace:
        if e["end"] < t0 or e["start"] - t0 > max_seconds:
            continue
        ax.broken_barh([(e["start"] - t0, e["end"] - e["start"])], (lanes[e["kind"]] - 0.4, 0.8),
                       facecolors=colours[e["group"]], edgecolor="black", linewidth=0.3)
    ax.set_yticks([0, 1], ["drafter: draft", "target: verify / decode"])
    ax.set_xlabel("seconds from mid-run (colour: sub-batch)")
    ax.set_title(title)
    ax.set_xlim(0, max_seconds)
    _save(fig, path)


def plot_itl(starts: list[float], chunk_times: list[list[float]], path: Path, title: str) -> None:
    """One run's inter-token gaps (ms, log scale) against when the later chunk arrived (s from the run's
    start), with the run's ITL p50 and p99 and a tick at each request's arrival (`starts`): shows whether
    gaps grow as load builds or spike as new requests' prefills land. `chunk_times`: per completed request."""
    plt = _pyplot()
    points = [(b, (b - a) * 1e3) for times in chunk_times for a, b in zip(times, times[1:])]
    p = percentiles([gap for _, gap in points])
    fig, ax = plt.subplots(figsize=(10, 4.2))
    ax.scatter([t for t, _ in points], [gap for _, gap in points], s=5, alpha=0.5, linewidths=0,
               label="gap between chunks")
    for q, style in (("p50", "--"), ("p99", ":")):
        if p[q] is not None:
            ax.axhline(p[q], linestyle=style, color="tab:red", label=f"ITL {q} {p[q]:.1f} ms")
    # short ticks along the bottom edge, in axes height, so they show whatever the y range
    ax.vlines(starts, 0, 0.05, transform=ax.get_xaxis_transform(), color="grey", alpha=0.6, linewidth=0.8,
              label="request arrivals")
    ax.set_yscale("log")
    ax.set(xlabel="seconds from the run's start (arrival of the later chunk)", ylabel="inter-token gap (ms)",
           title=f"ITL over time: {title}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: off the points and ticks
    _save(fig, path)
