"""Probe: the read bandwidth `bench decode` divides the weights by (a sum over 512 MB) against the
MKL matrix-vector product it used before, interleaved in one process, one thread, 5 rounds of best-of-5.
Usage: taskset -c 1 .venv/bin/python scripts/bandwidth_probe.py"""

import statistics
import time

import torch

from minedraft.bench.decode import streaming_bandwidth


def matvec_bandwidth(num_bytes: int = 512 * 2**20, repeats: int = 5) -> float:
    w = torch.randn(num_bytes // 4 // 4096, 4096)
    x = torch.randn(1, w.shape[0])
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        x @ w
        best = min(best, time.perf_counter() - t)
    return w.numel() * 4 / best


def main() -> None:
    torch.set_num_threads(1)
    rounds = [(matvec_bandwidth() / 1e9, streaming_bandwidth() / 1e9) for _ in range(5)]
    for name, values in (("matrix-vector product", [m for m, _ in rounds]), ("sum", [s for _, s in rounds])):
        print(f"{name}: {', '.join(f'{v:.1f}' for v in values)} GB/s, median {statistics.median(values):.1f}")


if __name__ == "__main__":
    main()
