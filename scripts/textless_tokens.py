"""Which generated tokens add no text to a stream, on the prompts `bench serve` sends.

A served stream sends a chunk only when a token adds text, so a textless token merges two token gaps
into one inter-chunk gap (ITL). This generates what `scripts/serve_sweep.sh` asks for (greedy,
--output-len tokens with ignore_eos, the chat template) and counts the tokens the server's
detokenizer turns into no text, by token.

    taskset -c 0 .venv/bin/python scripts/textless_tokens.py [--num-prompts 16] [--output-len 64]
"""

import argparse
import collections

from minedraft import LLM, SamplingParams
from minedraft.bench.datasets import load_prompts
from minedraft.engine.detokenizer import Detokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="../shared/data/spec_bench_questions.jsonl")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    llm = LLM(max_num_seqs=args.num_prompts, num_threads=1)
    prompts = load_prompts(args.dataset, args.num_prompts, args.seed)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    detokenizer, textless, total = Detokenizer(llm.tokenizer), collections.Counter(), 0
    for out in outputs:
        ids = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
        state = detokenizer.start(len(out.prompt_token_ids))
        for end in range(len(out.prompt_token_ids) + 1, len(ids) + 1):
            total += 1
            if not detokenizer.step(state, ids[state.prefix_offset:end]):
                textless[llm.tokenizer.decode([ids[end - 1]])] += 1
    print(f"{sum(textless.values())} of {total} generated tokens add no text: "
          + ", ".join(f"{token!r} x {n}" for token, n in textless.most_common()))


if __name__ == "__main__":
    main()
