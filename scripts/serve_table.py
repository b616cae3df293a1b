"""Print scripts/serve_sweep.sh's cells as one Markdown table: `python scripts/serve_table.py OUT_DIR`."""

import json
import sys
from pathlib import Path


def main(folder: Path) -> None:
    print("| mode | variant | rate | req/s | out tok/s | TTFT p50 / p99 ms | ITL p50 / p99 / max ms | ITL p99/p50 "
          "| goodput share |\n|---|---|---|---|---|---|---|---|---|")
    for path in sorted(folder.glob("*.json"), key=lambda p: (p.stem.split("_")[0], p.stem.split("_")[1],
                                                             float(p.stem.split("_")[2]))):
        mode, variant, rate = path.stem.split("_")
        f = json.loads(path.read_text())["figures"]
        share = "-" if f.get("goodput_share") is None else f"{f['goodput_share']:.2f}"
        print(f"| {mode} | {variant} | {rate} | {f['requests_per_s']:.2f} | {f['output_tokens_per_s']:.1f} "
              f"| {f['ttft_p50_ms']:.0f} / {f['ttft_p99_ms']:.0f} "
              f"| {f['itl_p50_ms']:.0f} / {f['itl_p99_ms']:.0f} / {f['itl_max_ms']:.0f} "
              f"| {f['itl_p99_ms'] / f['itl_p50_ms']:.1f} | {share} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
