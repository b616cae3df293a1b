"""Probe: what the default drafter adds to the target's prefill in the target's process. Prefills
the longest Spec-Bench prompts (chat template) through ar and through sd with the bundled head
("auto", gate not yet measured, so the head prefills each chunk), side by side, and prints every
prompt-chunk step's milliseconds in each.
Usage: .venv/bin/python scripts/drafter_prefill_cost.py [--prompts 6]"""

import argparse
import json

from minedraft import LLM, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="../shared/data/spec_bench_questions.jsonl")
    parser.add_argument("--prompts", type=int, default=6)
    args = parser.parse_args()
    with open(args.dataset) as f:
        questions = [json.loads(line)["turns"][0] for line in f]
    longest = sorted(questions, key=len)[-args.prompts:]
    engines = {"ar": LLM(max_num_seqs=8, trace=True),
               "sd": LLM(max_num_seqs=8, trace=True, speculative_config={"num_speculative_tokens": "auto"})}
    ms: dict[str, list[int]] = {name: [] for name in engines}
    for question in longest:
        for name, llm in engines.items():
            llm.engine.trace.clear()
            llm.chat([[{"role": "user", "content": question}]], SamplingParams(temperature=0, max_tokens=2),
                     use_tqdm=False)
            ms[name] += [round((e["end"] - e["start"]) * 1e3) for e in llm.engine.trace if e.get("prompt_tokens")]
    for name, times in ms.items():
        print(name, times)
    print("sd / ar per step:", [round(s / a, 3) for a, s in zip(ms["ar"], ms["sd"])])


if __name__ == "__main__":
    main()
