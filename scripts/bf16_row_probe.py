"""Time bfloat16 products of SmolLM2-135M's linear shapes, per row count: the small-row kernel
against oneDNN's packed weights (what `Linear.pack` makes), interleaved, medians, one thread.
Decides `small_gemm.MAX_ROWS_BF16_AMX` (docs/BENCHMARKS.md, 2026-12-03).

    .venv/bin/python scripts/bf16_row_probe.py [--rows 1,4,5,8,16,40] [--repeats 15]
"""

import argparse
import statistics
import time

import torch

from minedraft.kernels import small_gemm
from minedraft.models.llama import Linear, pack_linears

SHAPES = {"qkv": (576, 960), "gate_up": (576, 3072), "down": (1536, 576), "lm_head": (576, 49152)}


def timed(fn, x: torch.Tensor, times: list[float]) -> None:
    start = time.perf_counter()
    fn(x)
    times.append(time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,2,4,5,8,16,40,64")
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    torch.set_num_threads(1)
    if not small_gemm.bf16_supported():
        raise SystemExit("the kernel does not multiply bfloat16 on this CPU (AVX512-BF16)")
    print(f"AMX: {small_gemm._has_amx()}")
    print("| shape | rows | kernel ms | oneDNN packed ms | oneDNN / kernel |\n|---|---|---|---|---|")
    for name, (k, n) in SHAPES.items():
        lin = Linear(k, n, bias=False).to(torch.bfloat16)
        torch.nn.init.normal_(lin.weight, std=0.02)
        pack_linears(lin, keep_dense=True)
        kernel = lambda x: small_gemm.linear(x, lin.small)  # noqa: E731
        onednn = lambda x: torch.ops.mkldnn._linear_pointwise(x, lin.packed, None, "none", [], "")  # noqa: E731
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k, dtype=torch.bfloat16)
            a: list[float] = []
            b: list[float] = []
            with torch.no_grad():
                for _ in range(args.repeats):
                    timed(kernel, x, a)
                    timed(onednn, x, b)
            ka, kb = statistics.median(a) * 1e3, statistics.median(b) * 1e3
            print(f"| {name} ({k} x {n}) | {rows} | {ka:.3f} | {kb:.3f} | {kb / ka:.2f} |", flush=True)


if __name__ == "__main__":
    main()
