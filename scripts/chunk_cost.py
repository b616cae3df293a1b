"""What a prompt chunk adds to a served step: one decode row plus a chunk of N prompt tokens.

A served step beside running streams is one decode row per stream plus, maybe, a chunk of a prompt;
every stream's next token waits on it. This times that step for a few chunk sizes, eagerly and with
the compiled forward (graphs up to 64 tokens, so chunks run compiled too), on one thread. The
compiled runner compiles its graphs first (minutes on a fresh cache).

    taskset -c 0 .venv/bin/python scripts/chunk_cost.py [--dtype bfloat16] [--context 300]
"""

import argparse
import statistics

import torch

from minedraft import LLM
from minedraft.bench.decode import decode_step_times

CHUNKS = (0, 8, 16, 24, 32, 48, 60)
COMPILE_SIZES = (1, 2, 4, 8, 16, 32, 64)


def step_ms(llm: LLM, context: int, chunk: int, repeats: int) -> float:
    """Median milliseconds of a step: a decode row after `context` tokens, and a `chunk`-token prompt start."""
    times = decode_step_times(llm.engine.runner, [[5] * context], repeats + 2, chunk=chunk)
    return statistics.median(times[2:]) * 1000  # the first two warm up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    common = dict(dtype=args.dtype, max_num_seqs=2, max_model_len=args.context + 128)
    llms = {"eager": LLM(enforce_eager=True, **common), "compiled": LLM(compile_sizes=COMPILE_SIZES, **common)}
    print("| chunk tokens | " + " | ".join(f"{name} ms" for name in llms) + " |")
    print("|---" * (len(llms) + 1) + "|")
    for chunk in CHUNKS:
        cells = [f"{step_ms(llm, args.context, chunk, args.repeats):.1f}" for llm in llms.values()]
        print(f"| {chunk} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
