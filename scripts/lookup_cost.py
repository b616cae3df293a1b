"""What prompt lookup costs per row and round: `lookup` timed at the end of every Spec-Bench chat
prompt, and at the 64 positions before it (as a reply copying its prompt would reach them).

    .venv/bin/python scripts/lookup_cost.py [--min-n 2] [--max-n 4] [--k 4]
"""

import argparse
import json
import statistics
import time
from pathlib import Path

from minedraft.models.loader import load_tokenizer, resolve_model
from minedraft.spec_decode.ngram import lookup


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="../shared/data/spec_bench_questions.jsonl")
    p.add_argument("--min-n", type=int, default=2)
    p.add_argument("--max-n", type=int, default=4)
    p.add_argument("--k", type=int, default=4)
    args = p.parse_args()
    tokenizer = load_tokenizer(resolve_model(None))
    lines = [json.loads(line) for line in Path(args.dataset).read_text().splitlines() if line.strip()]
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": item["turns"][0]}], add_generation_prompt=True,
                                           tokenize=False) for item in lines]
    seqs = [tokenizer.encode(chat, add_special_tokens=False) for chat in chats]
    times, lengths = [], []
    for tokens in seqs:
        for end in range(max(2, len(tokens) - 64), len(tokens) + 1):
            context = tokens[:end]
            start = time.perf_counter()
            lookup(context, args.min_n, args.max_n, args.k)
            times.append(time.perf_counter() - start)
            lengths.append(end)
    times.sort()
    print(f"{len(times)} lookups over {len(seqs)} prompts, context {statistics.median(lengths)} tokens median "
          f"({max(lengths)} at most): median {statistics.median(times) * 1e6:.0f} us, "
          f"p99 {times[int(0.99 * len(times))] * 1e6:.0f} us, mean {statistics.fmean(times) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
