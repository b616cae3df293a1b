"""Would drafting from the target's own earlier replies pay? (issue 16, a probe; not shipped)

Prompt lookup drafts what followed the sequence's last n tokens earlier in *its own* context. This
probe asks the same of a corpus: the target's greedy replies to the project's training prompts (no
Spec-Bench prompt), and, online, its replies to the Spec-Bench prompts already answered, as a server
that remembers what it wrote would. A corpus draft follows the longest matching suffix (max_n down
to min_n tokens) and extends it token by token with the continuation most of the matches share,
stopping where fewer than `--min-count` matches (or under `--min-share` of them) agree.

It replays greedy rounds at k = 4 over the target's greedy replies to Spec-Bench prompts: prompt
lookup first (as the engine's `prompt_lookup_first`), the corpus where prompt lookup has nothing.
Per task: share of rounds with a draft / tokens accepted per drafted round / tokens per round
(rounds without a draft count one token; the head would draft those), then the corpus's share of
rounds and the tokens accepted in them.

    .venv/bin/python scripts/corpus_lookup_probe.py /tmp/corpus_probe     # replies cached there
"""

import argparse
import collections
from pathlib import Path

import torch

from eagle3_offline_eval import replies  # scripts/, beside this one
from minedraft import LLM, SamplingParams
from minedraft.spec_decode.ngram import lookup
from minedraft.training.prompts import build_prompts

K = 4


def corpus_replies(path: Path, num_prompts: int) -> list[list[int]]:
    """The target's greedy float32 replies (chat template, at most 192 tokens) to the first
    `num_prompts` training prompts, cached at `path`."""
    if path.exists():
        return torch.load(path)
    prompts = build_prompts(num_prompts, seed=7, mix="spec_bench")
    with LLM(max_num_seqs=16, max_model_len=1536) as llm:
        outs = llm.chat([[{"role": "user", "content": text}] for _, text in prompts],
                        SamplingParams(temperature=0.0, max_tokens=192))
    written = [list(o.outputs[0].token_ids) for o in outs]
    torch.save(written, path)
    return written


class Corpus:
    """Token sequences, -1 between them, and for each n in min_n..max_n where every n-gram ends."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n, self.tokens = min_n, max_n, []
        self.follows = {n: collections.defaultdict(list) for n in range(min_n, max_n + 1)}

    def add(self, seq: list[int]) -> None:
        base = len(self.tokens)
        self.tokens += seq + [-1]
        for i in range(len(seq)):
            for n in range(self.min_n, min(self.max_n, i + 1) + 1):
                self.follows[n][tuple(seq[i + 1 - n : i + 1])].append(base + i + 1)

    def draft(self, context: list[int], k: int, min_count: int, min_share: float) -> list[int]:
        for n in range(self.max_n, self.min_n - 1, -1):
            places = self.follows[n].get(tuple(context[-n:])) if len(context) >= n else None
            if not places:
                continue
            out = []
            for j in range(k):
                votes = collections.Counter(self.tokens[p + j] for p in places)
                token, count = votes.most_common(1)[0]
                if token == -1 or count < min_count or count / len(places) < min_share:
                    break
                out.append(token)
                places = [p for p in places if self.tokens[p + j] == token]
            return out
        return []


def replay(samples: list[dict], corpus: Corpus | None, online: bool, min_count: int, min_share: float) -> dict:
    """Per task: [rounds, drafted rounds, accepted in drafted rounds, tokens, corpus rounds, accepted in them]."""
    stats = collections.defaultdict(lambda: [0] * 6)
    for s in samples:
        prompt, reply = s["prompt"].tolist(), s["reply"].tolist()
        t = 1  # the first reply token comes from the prefill
        while t < len(reply):
            context = prompt + reply[:t]
            draft, from_corpus = lookup(context, 2, 4, K), False  # the engine's n in front of a head
            if not draft and corpus is not None:
                draft = corpus.draft(context, K, min_count, min_share)
                from_corpus = bool(draft)
            kept = 0
            while kept < len(draft) and t + kept < len(reply) and draft[kept] == reply[t + kept]:
                kept += 1
            row = stats[s["category"]]
            for i, v in enumerate((1, bool(draft), kept, kept + 1, from_corpus, kept if from_corpus else 0)):
                row[i] += v
            t += kept + 1
        if online and corpus is not None:
            corpus.add(reply)
    stats["overall"] = [sum(row[i] for row in list(stats.values())) for i in range(6)]
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache", type=Path, help="folder for the target's replies")
    parser.add_argument("--dataset", default="../shared/data/spec_bench_questions.jsonl")
    parser.add_argument("--corpus-prompts", type=int, default=600)
    parser.add_argument("--per-task", type=int, default=20)
    parser.add_argument("--output-len", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.cache.mkdir(parents=True, exist_ok=True)
    bench = replies(args.cache / f"replies_{args.per_task}_{args.output_len}.pt", args.dataset, args.per_task,
                    args.output_len)
    written = corpus_replies(args.cache / f"corpus_{args.corpus_prompts}.pt", args.corpus_prompts)
    arms = [("prompt lookup only", None, False), ("+ corpus", written, False), ("+ corpus, online", written, True),
            ("+ online only", [], True)]
    for (min_n, max_n), (min_count, min_share) in [((2, 6), (1, 0.0)), ((3, 8), (2, 0.5))]:
        for name, seed_replies, online in arms:
            corpus = None
            if seed_replies is not None:
                corpus = Corpus(min_n, max_n)
                for reply in seed_replies:
                    corpus.add(reply)
            stats = replay(bench, corpus, online, min_count, min_share)
            cells = "  ".join(f"{task} {r[1] / r[0]:.2f}/{r[2] / max(r[1], 1):.2f}/{r[3] / r[0]:.2f} "
                              f"c {r[4] / r[0]:.2f}/{r[5] / max(r[4], 1):.2f}" for task, r in stats.items())
            print(f"n {min_n}-{max_n}, count >= {min_count}, share >= {min_share}, {name}: {cells}")


if __name__ == "__main__":
    main()
