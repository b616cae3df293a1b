"""Probe: the small-row GEMM kernel against F.linear, x @ W and oneDNN's packed product, float32
or bfloat16, on SmolLM2-135M's layer shapes. Each timed pass runs through enough copies of the
weight (>= 256 MB) that every product streams it from memory, as in a forward pass. Paths are
interleaved within each repeat; medians.
Usage: taskset -c 1 .venv/bin/python scripts/small_gemm_probe.py [float32|bfloat16] [ROWS,...]"""

import statistics
import sys
import time

import torch
import torch.nn.functional as F

from minedraft.bench.decode import streaming_bandwidth
from minedraft.kernels import small_gemm

SHAPES = {"qkv 576->960": (576, 960), "o 576->576": (576, 576), "gate_up 576->3072": (576, 3072),
          "down 1536->576": (1536, 576), "lm_head 576->49152": (576, 49152)}
ROWS = (1, 2, 4, 5, 8, 16, 24, 32, 40, 64)


def main(dtype: torch.dtype, rows: tuple[int, ...] = ROWS) -> None:
    torch.set_num_threads(1)
    assert small_gemm.build() and (dtype == torch.float32 or small_gemm.bf16_supported())
    bandwidth = streaming_bandwidth(1 << 30) / 1e9
    print(f"read bandwidth {bandwidth:.1f} GB/s")
    print("| shape | rows | F.linear ms | x @ W [in, out] ms | oneDNN packed ms | kernel ms | floor ms "
          "| best other / kernel |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (k, n) in SHAPES.items():
        copies = max(1, (256 << 20) // (k * n * dtype.itemsize))
        dense = [torch.randn(k, n, dtype=dtype) for _ in range(copies)]             # [in, out], the models' layout
        out_in = [w.t().contiguous() for w in dense]                    # F.linear's [out, in]
        onednn = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in out_in]
        packed = [small_gemm.pack(w) for w in dense]
        for m in rows:
            x = torch.randn(m, k, dtype=dtype)
            paths = {
                "F.linear": lambda: [F.linear(x, w) for w in out_in],
                "x @ W": lambda: [x @ w for w in dense],
                "oneDNN": lambda: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for w in onednn],
                "kernel": lambda: [torch.ops.minedraft_kernels.small_gemm(x, p.panels, n, None) for p in packed],
            }
            ref = x.float() @ dense[0].float()
            tolerance = 1e-4 if dtype == torch.float32 else 1e-2
            assert torch.allclose(paths["kernel"]()[0].float(), ref, rtol=tolerance, atol=tolerance * 10)
            times = {p: [] for p in paths}
            for _ in range(7):
                for p, f in paths.items():
                    t = time.perf_counter()
                    f()
                    times[p].append((time.perf_counter() - t) * 1e3 / copies)
            med = {p: statistics.median(v) for p, v in times.items()}
            floor = k * n * dtype.itemsize / bandwidth / 1e6
            best_other = min(med["F.linear"], med["x @ W"], med["oneDNN"])
            print(f"| {name} | {m} | {med['F.linear']:.3f} | {med['x @ W']:.3f} | {med['oneDNN']:.3f} | "
                  f"{med['kernel']:.3f} | {floor:.3f} | {best_other / med['kernel']:.2f}x |", flush=True)


if __name__ == "__main__":
    main(getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "float32"),
         tuple(int(r) for r in sys.argv[2].split(",")) if len(sys.argv) > 2 else ROWS)
