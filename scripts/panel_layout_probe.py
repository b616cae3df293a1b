"""Probe: a forward pass's one-row products over the bundled model's own panels, laid out three
ways in one process and timed interleaved (medians): one buffer in call order with huge pages
advised (what `small_gemm.pack_in_order` gives a model), one buffer with plain pages, and a
separate allocation per weight (as before 2026-12-03).
Usage: taskset -c 1 .venv/bin/python scripts/panel_layout_probe.py [--repeats 15]"""

import argparse
import statistics
import time

import torch

from minedraft import LLM
from minedraft.kernels import small_gemm
from minedraft.models.llama import Linear


def one_buffer(packs: list[small_gemm.Packed]) -> list[small_gemm.Packed]:
    """The same panels in one plain buffer, in order (no huge-page advice)."""
    buffer = torch.empty(sum(p.panels.numel() for p in packs)).fill_(0)
    out, start = [], 0
    for p in packs:
        view = buffer[start : start + p.panels.numel()].view(p.panels.shape).copy_(p.panels)
        out.append(small_gemm.Packed(view, p.dense))
        start += p.panels.numel()
    return out


def separate(packs: list[small_gemm.Packed]) -> list[small_gemm.Packed]:
    """The same panels, each its own allocation with another weight-sized one between them, as
    packing weight by weight left them (oneDNN's reordered copy came between two panels)."""
    out, spacers = [], []
    for p in packs:
        out.append(small_gemm.Packed(p.panels.clone(), p.dense))
        spacers.append(torch.zeros_like(p.dense))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    torch.set_num_threads(1)
    model = LLM(num_threads=1, max_num_seqs=1, enforce_eager=True).engine.runner.model
    laid = [m.small for m in model.modules() if isinstance(m, Linear) and m.small is not None]
    layouts = {"one buffer, huge pages": laid, "one buffer, plain pages": one_buffer(laid),
               "separate allocations": separate(laid)}
    xs = {k: torch.randn(1, k) for k in {p.panels.shape[1] for p in laid}}
    times = {name: [] for name in layouts}
    for _ in range(args.repeats):
        for name, packs in layouts.items():
            start = time.perf_counter()
            for pk in packs:
                torch.ops.minedraft_kernels.small_gemm(xs[pk.panels.shape[1]], pk.panels, pk.dense.shape[1], None)
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["separate allocations"])
    for name, t in times.items():
        print(f"{name}: {statistics.median(t) * 1e3:.2f} ms ({statistics.median(t) / base:.3f}x separate)")


if __name__ == "__main__":
    main()
