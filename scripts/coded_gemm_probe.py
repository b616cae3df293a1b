"""Probe: a pass over all of the bundled model's products (121: 30 layers' qkv, o, gate_up, down and
the LM head) through the small-row kernel from its block codes (Q4_1 / Q8_0, `coded_gemm`) against
the same kernel from float32 panels, for 1 to 16 rows, interleaved, medians of 7. Decides
`small_gemm.CODED_MAX_ROWS`: decoding costs work, the float32 panels cost bytes.
Usage: taskset -c 1 .venv/bin/python scripts/coded_gemm_probe.py [ROWS,...]"""

import statistics
import sys
import time

import torch

from minedraft.bench.decode import streaming_bandwidth
from minedraft.kernels import small_gemm
from minedraft.models.llama import Linear
from minedraft.models.loader import load_model, resolve_model

ROWS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)


def main(rows: tuple[int, ...] = ROWS) -> None:
    torch.set_num_threads(1)
    model = load_model(resolve_model(None), torch.float32, torch.device("cpu"))
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    coded = [m.small for m in linears]
    assert all(p is not None and p.codes is not None for p in coded), "the bundled weights were not found as codes"
    panels = [small_gemm._panels(p.dense, None) for p in coded]
    print(f"read bandwidth {streaming_bandwidth(torch.device('cpu'), 1 << 30) / 1e9:.1f} GB/s; "
          f"codes {sum(p.nbytes for p in coded) / 1e6:.0f} MB, float32 panels {sum(p.nbytes for p in panels) / 1e6:.0f} MB")
    print("| rows | codes ms | float32 panels ms | codes / panels |")
    print("|---|---|---|---|")
    for m in rows:
        xs = {k: torch.randn(m, k) for k in {p.dense.shape[0] for p in coded}}
        paths = {name: (lambda packs=packs: [small_gemm.linear(xs[p.dense.shape[0]], p) for p in packs])
                 for name, packs in (("codes", coded), ("panels", panels))}
        times = {p: [] for p in paths}
        for _ in range(7):
            for p, f in paths.items():
                t = time.perf_counter()
                f()
                times[p].append((time.perf_counter() - t) * 1e3)
        med = {p: statistics.median(v) for p, v in times.items()}
        print(f"| {m} | {med['codes']:.2f} | {med['panels']:.2f} | {med['codes'] / med['panels']:.2f} |", flush=True)


if __name__ == "__main__":
    main(tuple(int(r) for r in sys.argv[1].split(",")) if len(sys.argv) > 1 else ROWS)
