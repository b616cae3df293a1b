"""Decode and verification steps of the bundled model with the attention kernel on and off, in one
process, interleaved (4 rounds x 5 timed steps each), medians; compiled graphs for 1, 4 and 8
tokens. Usage: taskset -c 0 .venv/bin/python scripts/attention_probe.py [float32|bfloat16]"""

import os
import statistics
import sys

import torch

from minedraft import LLM
from minedraft.bench.decode import decode_step_times

torch.set_num_threads(1)
dtype = sys.argv[1] if len(sys.argv) > 1 else "float32"
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
          f"PyTorch {off:.1f} ms, {off / on:.2f}x")
