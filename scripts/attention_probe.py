"""The attention kernel against PyTorch's attention: first per call (one SmolLM2 layer: 9 query
heads, 3 KV heads, head size 64; medians of 200 calls), then decode and verification steps of the
bundled model with the kernel on and off in one process, interleaved (4 rounds x 5 timed steps
each), medians, compiled graphs for 1, 4 and 8 tokens. One thread.
Usage: taskset -c 0 .venv/bin/python scripts/attention_probe.py [float32|bfloat16]"""

import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from minedraft import LLM
from minedraft.bench.decode import decode_step_times
from minedraft.kernels import attention as attention_kernel


def per_call(dtype: torch.dtype) -> None:
    slots, kv_heads, max_len, head_dim, heads = 8, 3, 1024, 64, 9
    assert attention_kernel.applies(dtype, head_dim, torch.device("cpu"))
    k_cache, v_cache = (torch.randn(slots, kv_heads, max_len, head_dim, dtype=dtype) for _ in range(2))
    for batch, tokens, context in [(1, 1, 128), (8, 1, 128), (1, 5, 128), (8, 1, 600)]:
        q = torch.randn(batch * tokens, heads, head_dim, dtype=dtype)
        k, v = (torch.randn(batch * tokens, kv_heads, head_dim, dtype=dtype) for _ in range(2))
        rows = torch.tensor([[b, context, tokens] for b in range(batch)])

        def kernel() -> None:
            attention_kernel.cached_attention(q, k, v, k_cache, v_cache, rows)

        def pytorch() -> None:  # what models.attention does for evenly spaced slots, writes aside
            F.scaled_dot_product_attention(q.view(batch, tokens, heads, head_dim).transpose(1, 2),
                                           k_cache[:batch, :, : context + tokens],
                                           v_cache[:batch, :, : context + tokens], enable_gqa=True)

        def median_us(fn) -> float:
            fn()
            times = []
            for _ in range(200):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return statistics.median(times) * 1e6

        ours, theirs = median_us(kernel), median_us(pytorch)
        print(f"{dtype} per call, {batch} rows x {tokens} tokens over {context + tokens} keys: kernel {ours:.1f} us, "
              f"PyTorch {theirs:.1f} us, {ours / theirs:.2f}x", flush=True)


def whole_model(dtype: str) -> None:
    runner = LLM(None, dtype=dtype, max_num_seqs=8, max_model_len=1024, compile_sizes=(1, 4, 8)).engine.runner
    cases = [(1, 1, 128), (1, 4, 128), (1, 5, 128), (8, 1, 128), (8, 5, 128), (1, 1, 600), (8, 1, 600)]
    times: dict[tuple, list[float]] = {}
    for _ in range(4):
        for on in ("1", "0"):
            os.environ["MINEDRAFT_ATTENTION_KERNEL"] = on
            for batch, tokens, context in cases:
                steps = decode_step_times(runner, [list(range(100, 100 + context))] * batch, 6, tokens)
                times.setdefault((on, batch, tokens, context), []).extend(steps[1:])
    for batch, tokens, context in cases:
        on, off = (statistics.median(times[(s, batch, tokens, context)]) * 1e3 for s in ("1", "0"))
        print(f"{dtype} batch {batch} x {tokens} tokens, {context} cached: kernel {on:.1f} ms, "
              f"PyTorch {off:.1f} ms, {off / on:.2f}x", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    name = sys.argv[1] if len(sys.argv) > 1 else "float32"
    per_call(getattr(torch, name))
    whole_model(name)
