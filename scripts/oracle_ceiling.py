"""Probe: the most speculative decoding can give on this machine, whatever the drafter.

An oracle drafter knows the target's greedy replies (from an ar run first) and drafts them at no
cost. With `--acceptance a` each draft position is right with probability a (while the ones before
it were) and the rest of the draft is wrong, so the rows carry k drafts whatever is accepted, as a
real drafter's do: a = 1 is the ceiling, a = 0.7 what issue 16's acceptance target would give with
drafts that cost nothing. Runs `bench offline`'s closed loop (16 Spec-Bench chats, greedy, its
output length and max_model_len) on one core at each concurrency, ar beside every k, repeats
interleaved; prints end-to-end and decode-phase throughput as ratios to ar, medians over the repeats.
Nothing else should run on the machine meanwhile: the other core's work slows the memory.
Usage: .venv/bin/python scripts/oracle_ceiling.py [--concurrency 1,8] [--k 1,2,4] [--acceptance 1,0.7]
       [--repeats 2] [--num-prompts 16] [--output-len 64] [--dtype float32]"""

import argparse
import random
import statistics

import torch

from minedraft import LLM, SamplingParams
from minedraft.bench.offline import benchmark_prompts, closed_loop, placement, warm_up
from minedraft.engine.sequence import Sequence
from minedraft.spec_decode.base import Proposer
from minedraft.spec_decode.remote import pin


class Oracle(Proposer):
    """Drafts the target's known greedy continuation; position j right with probability a."""

    def __init__(self, replies: dict[tuple[int, ...], list[int]], acceptance: float, vocab: int, seed: int = 0):
        self.replies, self.acceptance, self.vocab = replies, acceptance, vocab
        self.rng = random.Random(seed)

    def propose(self, seqs: list[Sequence], num_tokens: list[int], generators: list[torch.Generator | None],
                capacity: int | None = None) -> tuple[list[list[int]], list[None]]:
        drafts = []
        for seq, n in zip(seqs, num_tokens):
            reply = self.replies[tuple(seq.prompt_token_ids)]
            done = len(seq.output_token_ids)
            truth = (reply[done:] + [0] * n)[:n]
            draft, right = [], True
            for token in truth:
                right = right and self.rng.random() < self.acceptance
                draft.append(token if right else (token + 1) % self.vocab)
            drafts.append(draft)
        return drafts, [None] * len(seqs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="../shared/data/spec_bench_questions.jsonl")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--k", default="1,2,4")
    parser.add_argument("--acceptance", default="1,0.7")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-model-len", type=int, default=1024)  # bench offline's
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    ks = [int(k) for k in args.k.split(",")]
    rates = [float(a) for a in args.acceptance.split(",")]
    pin(tuple(placement("ar")[0]))
    common = dict(dtype=args.dtype, max_num_seqs=max(concurrencies), max_model_len=args.max_model_len,
                  seed=args.seed, trace=True)
    ar = LLM(**common)
    # The speculative engine's own drafter (prompt lookup: no model) is swapped for the oracle.
    sd = LLM(**common, speculative_config={"method": "ngram", "num_speculative_tokens": max(ks)})
    prompts = benchmark_prompts(args, ar.engine)
    warm_up({"ar": ar, "sd": sd}, None, prompts[:2], max(ks))
    params = SamplingParams(temperature=0, max_tokens=args.output_len)
    replies = closed_loop(ar, prompts, 1, params)["outputs"]
    oracle = {tuple(prompts[i]): out for i, out in replies.items()}
    vocab = len(ar.engine.tokenizer)
    results: dict[tuple, list[dict]] = {}
    for repeat in range(args.repeats):
        for c in concurrencies:
            results.setdefault(("ar", c), []).append(closed_loop(ar, prompts, c, params))
            for a in rates:
                for k in ks:
                    sd.engine.proposer = Oracle(oracle, a, vocab, seed=repeat)
                    sd.engine.set_num_speculative_tokens(k)
                    figures = closed_loop(sd, prompts, c, params)
                    same = sum(figures["outputs"][i] == out for i, out in replies.items()) / len(replies)
                    results.setdefault((f"a={a} k={k}", c), []).append({**figures, "same": same})
                    print(f"repeat {repeat} c={c} a={a} k={k}: {figures['output_tokens_per_s']:.1f} tok/s, "
                          f"{figures['mean_acceptance_length']:.2f} tokens per verification, same as ar {same:.2f}",
                          flush=True)
    print("\nmedians over repeats; x ar: end to end (decode phase); tokens per verification; verify ms median")
    for c in concurrencies:
        base = results[("ar", c)]
        ar_e2e = statistics.median(r["output_tokens_per_s"] for r in base)
        ar_dec = statistics.median(r["generation_tokens_per_s"] for r in base)
        decode_ms = statistics.median(r["decode_s_mean"] for r in base) * 1e3
        print(f"c={c}: ar {ar_e2e:.1f} tok/s end to end, {ar_dec:.1f} in the decode phase, "
              f"prefill {statistics.median(r['prefill_s'] / r['makespan_s'] for r in base):.2f} of the run, "
              f"plain step {decode_ms:.1f} ms mean")
        for key, runs in results.items():
            if key[1] != c or key[0] == "ar":
                continue
            e2e = statistics.median(r["output_tokens_per_s"] for r in runs) / ar_e2e
            dec = statistics.median(r["generation_tokens_per_s"] for r in runs) / ar_dec
            length = statistics.median(r["mean_acceptance_length"] for r in runs)
            verify = statistics.median(r["verify_s_median"] for r in runs) * 1e3
            same = min(r["same"] for r in runs)
            print(f"  {key[0]}: {e2e:.2f}x ({dec:.2f}x); {length:.2f}; {verify:.1f} ms; same as ar {same:.2f}")


if __name__ == "__main__":
    main()
