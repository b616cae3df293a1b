"""Print scripts/serve_sweep.sh's cells as one Markdown table: `python scripts/serve_table.py OUT_DIR`."""

import json
import sys
from pathlib import Path


def cells(folder: Path) -> list[tuple[str, str, float, dict]]:
    """(mode, variant, rate, bench serve's figures) per MODE_VARIANT_RATE.json, in that order."""
    found = []
    for path in folder.glob("*.json"):
        mode, variant, rate = path.stem.split("_")
        found.append((mode, variant, float(rate), json.loads(path.read_text())["figures"]))
    return sorted(found, key=lambda cell: cell[:3])


def main(folder: Path) -> None:
    print("| mode | variant | rate | req/s | out tok/s | TTFT p50 / p99 ms | TPOT p50 ms | ITL p50 / p99 / max ms "
          "| ITL p99/p50 | token gap p50 / p99 / max ms | token gap p99/p50 | goodput share |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")
    for mode, variant, rate, f in cells(folder):
        share = "-" if f.get("goodput_share") is None else f"{f['goodput_share']:.2f}"
        print(f"| {mode} | {variant} | {rate:g} | {f['requests_per_s']:.2f} | {f['output_tokens_per_s']:.1f} "
              f"| {f['ttft_p50_ms']:.0f} / {f['ttft_p99_ms']:.0f} | {f['tpot_s']['p50'] * 1e3:.0f} "
              f"| {f['itl_p50_ms']:.0f} / {f['itl_p99_ms']:.0f} / {f['itl_max_ms']:.0f} "
              f"| {f['itl_p99_ms'] / f['itl_p50_ms']:.1f} | {token_gaps(f)} | {share} |")


def token_gaps(f: dict) -> str:
    """The token-arrival gaps and their p99/p50, '- | -' from a run or server without them."""
    if f.get("token_gap_p50_ms") is None:
        return "- | -"
    return (f"{f['token_gap_p50_ms']:.0f} / {f['token_gap_p99_ms']:.0f} / {f['token_gap_max_ms']:.0f} "
            f"| {f['token_gap_p99_ms'] / f['token_gap_p50_ms']:.1f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
