"""PNG plots of benchmark results."""

from pathlib import Path


def plot_timeline(trace: list[dict], path: Path, title: str, max_seconds: float = 4.0) -> None:
    """Target (verify) and drafter (draft) activity over `max_seconds` of steady state (from the
    middle of the run), coloured by sub-batch: where the two lanes overlap, drafting was hidden
    behind verification."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not trace:
        return
    starts = sorted(e["start"] for e in trace)
    t0 = starts[len(starts) // 2]
    fig, ax = plt.subplots(figsize=(12, 2.6))
    lanes = {"verify": 1, "decode": 1, "draft": 0}
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
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
