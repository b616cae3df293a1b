"""Where a decode step's time goes: `torch.profiler` over greedy generations of one chat request.

Generates --tokens tokens (ignore_eos) --repeats times with the bundled model on one thread and
prints the median wall time per token, then profiles one more generation and prints the ops with
the most self time, per generated token.

    taskset -c 0 .venv/bin/python scripts/step_profile.py [--dtype bfloat16] \
        [--speculative-config '{"num_speculative_tokens": 3}'] \
        [--inductor-options '{"cpp.enable_kernel_profile": true}']

`--inductor-options` adds to the options the graphs compile with (`compiled_forward.INDUCTOR_OPTIONS`);
`cpp.enable_kernel_profile` lists each of a graph's own C++ kernels instead of one "CompiledFxGraph".
"""

import argparse
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from minedraft import LLM, SamplingParams
from minedraft.engine import compiled_forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--speculative-config", type=json.loads, default=None)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--inductor-options", type=json.loads, default={})
    args = parser.parse_args()
    compiled_forward.INDUCTOR_OPTIONS.update(args.inductor_options)
    torch.set_num_threads(1)
    with LLM(max_num_seqs=1, dtype=args.dtype, speculative_config=args.speculative_config) as llm:
        chat = [[{"role": "user", "content": "Write a long story about a dragon."}]]
        params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
        llm.chat(chat, params, use_tqdm=False)  # warm: graphs built, caches touched
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            llm.chat(chat, params, use_tqdm=False)
            times.append(time.perf_counter() - start)
        print(f"median {statistics.median(times) / args.tokens * 1e3:.2f} ms a token over {args.repeats} generations")
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            llm.chat(chat, params, use_tqdm=False)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    print("| op | self ms a token | calls a token |")
    print("|---|---|---|")
    for e in events[: args.top]:
        print(f"| {e.key[:60]} | {e.self_cpu_time_total / 1e3 / args.tokens:.3f} | {e.count / args.tokens:.1f} |")


if __name__ == "__main__":
    main()
