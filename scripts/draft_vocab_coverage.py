"""How much of the target's greedy Spec-Bench output a draft vocabulary can propose at all.

A head over a reduced vocabulary can never draft a token outside it, so its share of the target's
own output tokens bounds acceptance. Compares the bundled head's vocabulary with the most frequent
reply tokens of the training shards at several sizes, and reports the share of output tokens that
also occur in the prompt (what prompt lookup can copy), per Spec-Bench task.

    .venv/bin/python scripts/draft_vocab_coverage.py --shards out/eagle3_sb/data --per-task 10
"""

import argparse
import json
from pathlib import Path

import torch

from minedraft import LLM, SamplingParams
from minedraft.bench.datasets import select, spec_bench_by_task
from minedraft.models.loader import DEFAULT_DRAFT, eos_token_ids, load_tokenizer, resolve_model
from minedraft.training.distill import frequent_tokens, split
from minedraft.training.eagle3 import head_vocabulary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", required=True, help="folder of reply shards (train-draft's OUT/data)")
    p.add_argument("--sizes", default="8192,16384,32768", help="vocabulary sizes to compare")
    p.add_argument("--dataset", default="../shared/data/spec_bench_questions.jsonl")
    p.add_argument("--per-task", type=int, default=10)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--output-json", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.num_threads)

    llm = LLM(max_num_seqs=8, max_model_len=2048)
    vocab = llm.engine.config.model_args.vocab_size
    # The vocabularies train-draft would choose from these shards (training replies, EOS kept).
    train_set, _ = split([s for f in sorted(Path(args.shards).glob("shard-*.pt")) for s in torch.load(f)])
    target = resolve_model(None)
    eos = eos_token_ids(target, load_tokenizer(target))
    vocabularies = {"bundled head": head_vocabulary(DEFAULT_DRAFT),
                    **{f"top {n}": frequent_tokens(train_set, vocab, n, eos)[0] for n in map(int, args.sizes.split(","))}}
    masks = {name: torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True) for name, ids in vocabularies.items()}

    result = {}
    for task, prompts in spec_bench_by_task(args.dataset).items():
        outs = llm.chat([[{"role": "user", "content": q}] for q in select(prompts, args.per_task, 0)],
                        SamplingParams(temperature=0, max_tokens=args.output_len), use_tqdm=False)
        tokens = torch.tensor([t for o in outs for t in o.outputs[0].token_ids])
        copied = 0
        for o in outs:
            prompt = set(o.prompt_token_ids)
            copied += sum(t in prompt for t in o.outputs[0].token_ids)
        result[task] = {**{name: float(m[tokens].float().mean()) for name, m in masks.items()},
                        "in prompt": copied / len(tokens), "tokens": len(tokens)}
    llm.close()
    names = [*vocabularies, "in prompt"]
    print("| task | " + " | ".join(names) + " | tokens |\n|---|" + "---|" * (len(names) + 1))
    for task, row in result.items():
        print(f"| {task} | " + " | ".join(f"{row[n]:.3f}" for n in names) + f" | {row['tokens']} |")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
