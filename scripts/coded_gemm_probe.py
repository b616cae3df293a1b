"""Probe: a pass over all of the bundled model's products (121: 30 layers' qkv, o, gate_up, down and
the LM head) through the small-row kernel from its block codes (`coded_gemm`) against the same
kernel from the model's panels, for 1 to 16 rows, interleaved, medians of 7. Decides
`small_gemm.CODED_MAX_ROWS`: decoding costs work, panels cost bytes. float32: Q4_1 / Q8_0 codes
against float32 panels. bfloat16: the Q4_1 codes in pairs (the Q8_0 LM head has none for bfloat16
rows and reads its panels on both sides) against bfloat16 panels, and float32's codes beside them.
Usage: taskset -c 1 .venv/bin/python scripts/coded_gemm_probe.py [--dtype bfloat16] [ROWS,...]"""

import argparse
import statistics
import time

import torch

from minedraft.bench.decode import streaming_bandwidth
from minedraft.kernels import small_gemm
from minedraft.models.llama import Linear
from minedraft.models.loader import load_model, resolve_model

ROWS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)


def main(rows: tuple[int, ...], dtype: torch.dtype) -> None:
    torch.set_num_threads(1)
    model = load_model(resolve_model(None), torch.float32, torch.device("cpu"))
    f32 = [m.small for m in model.modules() if isinstance(m, Linear)]
    assert all(p is not None and p.codes is not None for p in f32), "the bundled weights were not found as codes"
    packs = f32 if dtype == torch.float32 else [small_gemm.pack(p.dense.to(dtype), source=p.dense) for p in f32]
    code_bytes = sum(p.codes.nbytes if p.codes is not None else p.panels.nbytes for p in packs)
    print(f"read bandwidth {streaming_bandwidth(torch.device('cpu'), 1 << 30) / 1e9:.1f} GB/s; "
          f"{dtype}: {sum(p.codes is not None for p in packs)} of {len(packs)} products coded, "
          f"codes {code_bytes / 1e6:.0f} MB, panels {sum(p.panels.nbytes for p in packs) / 1e6:.0f} MB")
    ops = torch.ops.minedraft_kernels

    def coded(p, x):
        if p.codes is None:
            return ops.small_gemm(x, p.panels, p.dense.shape[1], None)
        return ops.coded_gemm(x, *p.codes, p.dense.shape[1], None)

    def panels(p, x):
        return ops.small_gemm(x, p.panels, p.dense.shape[1], None)

    paths = {"codes": (packs, coded), "panels": (packs, panels)}
    if dtype != torch.float32:
        paths["float32 codes"] = (f32, coded)
    print("| rows | " + " | ".join(f"{name} ms" for name in paths) + " | codes / panels |")
    print("|---" * (len(paths) + 2) + "|")
    for m in rows:
        # The ops themselves: `small_gemm.linear` would take the panels past CODED_MAX_ROWS.
        xs = {k: torch.randn(m, k) for k in {p.dense.shape[0] for p in f32}}
        times = {name: [] for name in paths}
        for _ in range(7):
            for name, (weights, product) in paths.items():
                inputs = {k: x.to(weights[0].dense.dtype) for k, x in xs.items()}
                t = time.perf_counter()
                for p in weights:
                    product(p, inputs[p.dense.shape[0]])
                times[name].append((time.perf_counter() - t) * 1e3)
        med = {name: statistics.median(v) for name, v in times.items()}
        print(f"| {m} | " + " | ".join(f"{v:.2f}" for v in med.values()) + f" | {med['codes'] / med['panels']:.2f} |",
              flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("rows", nargs="?", default=",".join(map(str, ROWS)))
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    main(tuple(int(r) for r in args.rows.split(",")), getattr(torch, args.dtype))
