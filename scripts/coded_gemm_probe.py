"""Probe: a pass over all of the bundled model's products (121: 30 layers' qkv, o, gate_up, down and
the LM head) through the small-row kernel from its block codes (Q4_1 / Q8_0, `coded_gemm`) against
the same kernel from the model's float32 panels, for 1 to 16 rows, interleaved, medians of 7. Decides
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
    panel_bytes = sum(p.panels.numel() * p.panels.element_size() for p in coded)
    print(f"read bandwidth {streaming_bandwidth(torch.device('cpu'), 1 << 30) / 1e9:.1f} GB/s; "
          f"codes {sum(p.codes.nbytes for p in coded) / 1e6:.0f} MB, float32 panels {panel_bytes / 1e6:.0f} MB")
    print("| rows | codes ms | float32 panels ms | codes / panels |")
    print("|---|---|---|---|")
    for m in rows:
        xs = {k: torch.randn(m, k) for k in {p.dense.shape[0] for p in coded}}
        # The ops themselves: `small_gemm.linear` would take the panels past CODED_MAX_ROWS.
        ops = torch.ops.minedraft_kernels
        paths = {"codes": lambda p, x: ops.coded_gemm(x, *p.codes, p.dense.shape[1], None),
                 "panels": lambda p, x: ops.small_gemm(x, p.panels, p.dense.shape[1], None)}
        times = {name: [] for name in paths}
        for _ in range(7):
            for name, product in paths.items():
                t = time.perf_counter()
                for p in coded:
                    product(p, xs[p.dense.shape[0]])
                times[name].append((time.perf_counter() - t) * 1e3)
        med = {name: statistics.median(v) for name, v in times.items()}
        print(f"| {m} | {med['codes']:.2f} | {med['panels']:.2f} | {med['codes'] / med['panels']:.2f} |", flush=True)


if __name__ == "__main__":
    main(tuple(int(r) for r in sys.argv[1].split(",")) if len(sys.argv) > 1 else ROWS)
