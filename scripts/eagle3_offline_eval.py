"""An EAGLE-3 head's greedy acceptance on the target's own greedy replies to Spec-Bench prompts,
teacher-forced (Trainer.evaluate), per task: what the head scores on that content with the engine's
scheduling taken out. `bench draft` measures the same prompts through the engine; the gap between
the two is the engine's share (which positions rounds start at), the rest is the head.

    .venv/bin/python scripts/eagle3_offline_eval.py HEAD_DIR [HEAD_DIR ...] [--per-task 10] [--output-len 64]

The replies and the target's features are cached in --cache (default /tmp/eagle3_offline_eval), so a
second head costs only its own pass. Spec-Bench is used here for measurement only.
"""

import argparse
from pathlib import Path

import torch

from minedraft.bench.datasets import select, spec_bench_by_task
from minedraft.engine.model_runner import ModelRunner
from minedraft.llm import LLM
from minedraft.models.loader import load_model, resolve_model
from minedraft.sampling import SamplingParams
from minedraft.training.eagle3 import Eagle3TrainConfig, Trainer, extract_features, head_aux_layers, head_vocabulary


def replies(path: Path, dataset: str, per_task: int, output_len: int) -> list[dict]:
    """The target's greedy replies (float32, chat template), as training samples."""
    if path.exists():
        return torch.load(path)
    samples = []
    with LLM(max_num_seqs=8) as llm:
        for task, prompts in spec_bench_by_task(dataset).items():
            outs = llm.chat([[{"role": "user", "content": p}] for p in select(prompts, per_task, 0)],
                            SamplingParams(temperature=0.0, max_tokens=output_len), use_tqdm=False)
            samples += [{"category": task, "greedy": True, "prompt": torch.tensor(o.prompt_token_ids),
                         "reply": torch.tensor(o.outputs[0].token_ids)} for o in outs]
    torch.save(samples, path)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("heads", nargs="+")
    parser.add_argument("--dataset", default="../shared/data/spec_bench_questions.jsonl")
    parser.add_argument("--per-task", type=int, default=10)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--cache", default="/tmp/eagle3_offline_eval")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    base = replies(cache / f"replies_{args.per_task}_{args.output_len}.pt", args.dataset, args.per_task,
                   args.output_len)
    target = load_model(resolve_model(None), torch.float32, torch.device("cpu"))
    print(f"first draft position / positions 2-{args.k} / mean acceptance length at k = {args.k}, teacher-forced")
    for head in map(Path, args.heads):
        aux = head_aux_layers(head, target.args.num_layers)
        features = cache / f"features_{args.per_task}_{args.output_len}_{'-'.join(map(str, aux))}.pt"
        if features.exists():
            samples = torch.load(features)
        else:
            samples = [dict(s) for s in base]
            extract_features(ModelRunner(target, 16, 2048, torch.float32, torch.device("cpu")), aux, samples)
            torch.save(samples, features)
        trainer = Trainer(target, cache / "unused", Eagle3TrainConfig(batch_tokens=2048), aux, head_vocabulary(head),
                          head)
        print(f"\n{head}\n| task | first | 2-{args.k} | length | positions |\n|---|---|---|---|---|")
        tasks = list(dict.fromkeys(s["category"] for s in samples))
        for task in [*tasks, "overall"]:
            r = trainer.evaluate([s for s in samples if task in ("overall", s["category"])], args.k)
            first, *rest = r["acceptance_by_position"]
            print(f"| {task} | {first:.3f} | {', '.join(f'{x:.2f}' for x in rest)} | "
                  f"{r['mean_acceptance_length']:.3f} | {r['positions']} |")


if __name__ == "__main__":
    main()
