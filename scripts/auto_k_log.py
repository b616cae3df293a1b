"""Probe: what "auto" draft lengths decide step by step. Chats N Spec-Bench prompts at once through
the default drafter with `"num_speculative_tokens": "auto"` and prints, after every verification the
controller learns from: k asked, sequences, seconds, the best k for that many sequences, its acceptance
by position, its verification time per k at that many (ms) and its predicted tokens per second for
k = 0..3 there.
Usage: .venv/bin/python scripts/auto_k_log.py [--prompts 16] [--max-num-seqs 8] [--tokens 64]"""

import argparse
import json

from minedraft import LLM, SamplingParams
from minedraft.spec_decode.draft_length import DraftLengthController


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="../shared/data/spec_bench_questions.jsonl")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    with open(args.dataset) as f:
        questions = [json.loads(line)["turns"][0] for line, _ in zip(f, range(args.prompts))]
    learn = DraftLengthController.observe_verify

    def logged(c: DraftLengthController, seconds: float, k: int, rows: list[tuple[int, int]],
               hindsight: list[tuple[int, int]] = ()) -> None:
        learn(c, seconds, k, rows, hindsight)
        n = len(rows)
        rates = {j: round(c.predicted_rows(j, n) * c.expected_tokens(j) / c.step_time(j, n), 1) for j in range(4)}
        print(k, n, f"{seconds * 1e3:.1f}", c.best_k(n), [round(a, 2) for a in c.acceptance[:3]],
              {j: round(v * 1e3, 1) for j, v in sorted(c.verify_s[n].items())}, rates, flush=True)

    DraftLengthController.observe_verify = logged
    with LLM(speculative_config={"num_speculative_tokens": "auto"}, max_num_seqs=args.max_num_seqs) as llm:
        llm.chat([[{"role": "user", "content": q}] for q in questions],
                 SamplingParams(temperature=0, max_tokens=args.tokens), use_tqdm=False)
        print(llm.get_metrics()["draft_length"])


if __name__ == "__main__":
    main()
