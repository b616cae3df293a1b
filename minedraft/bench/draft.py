"""`minedraft bench draft`: how good a drafter is for its target — acceptance rate (vLLM's
definition) per Spec-Bench task, greedy and sampled; whether its confidence predicts acceptance
(what TETRIS ranks drafts by); and the cost ratio c = draft forward time / target forward time at
several batch sizes, measured side by side on the same threads."""

import argparse
import json
import statistics

import torch
from tqdm import tqdm

from minedraft import LLM, SamplingParams
from minedraft.bench.datasets import select, spec_bench_by_task
from minedraft.bench.decode import decode_step_times
from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.spec_decode.ngram import LookupFirst

CONFIDENCE_BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def acceptance(llm: LLM, prompts: list[str], temperature: float, output_len: int, seed: int) -> dict:
    """Draft and accepted token counts for replies to `prompts` (chat template, first turn)."""
    before = llm.get_metrics()
    params = [SamplingParams(temperature=temperature, max_tokens=output_len, seed=seed + i)
              for i in range(len(prompts))]
    llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    after = llm.get_metrics()
    drafted = after["num_draft_tokens"] - before["num_draft_tokens"]
    accepted = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    rounds = after["num_drafts"] - before["num_drafts"]
    first = after["accepted_per_position"][0] - (before["accepted_per_position"] or [0])[0] \
        if after["accepted_per_position"] else 0
    return {"draft_tokens": drafted, "accepted_tokens": accepted, "drafts": rounds, "first_accepted": first}


def rate(counts: dict) -> float:
    return counts["accepted_tokens"] / counts["draft_tokens"] if counts["draft_tokens"] else 0.0


def first_rate(counts: dict) -> float:
    """Acceptance of the first draft position: the share of rounds that kept their first draft."""
    return counts["first_accepted"] / counts["drafts"] if counts["drafts"] else 0.0


def acceptance_length(counts: dict) -> float:
    """Mean tokens per verification, the bonus or recovered token included."""
    return 1 + counts["accepted_tokens"] / counts["drafts"] if counts["drafts"] else 1.0


def calibration(llm: LLM, prompts: list, output_len: int) -> list[dict]:
    """First-draft acceptance by the drafter's confidence (the temperature-1 probability of its most
    likely token, which TETRIS ranks prefixes by), greedy. The target answers each prompt; the
    drafter then reads prompt and answer in one pass: at every answer position its most likely
    token is the draft it would propose there, accepted when the answer continues with it.
    `prompts` as `LLM.generate` takes them."""
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=output_len), use_tqdm=False)
    runner = draft_runner(llm)
    tried = [0] * (len(CONFIDENCE_BINS) - 1)
    taken = [0] * len(tried)
    for out in outs:
        answer = out.outputs[0].token_ids
        tokens = out.prompt_token_ids + answer
        slot = runner.cache.allocate()
        try:
            logits = runner.forward([Row(slot, tokens, num_logits=len(answer) + 1)])[:-1]
        finally:
            runner.cache.free(slot)
        confidence, best = torch.softmax(logits.float(), dim=-1).max(dim=-1)
        if runner.model.draft_vocab is not None:  # a reduced head scores its own tokens
            best = runner.model.draft_vocab[best]
        bins = torch.bucketize(confidence, torch.tensor(CONFIDENCE_BINS[1:-1]), right=True)
        for b, hit in zip(bins.tolist(), (best == torch.tensor(answer)).tolist()):
            tried[b] += 1
            taken[b] += hit
    return [{"low": lo, "high": hi, "drafts": n, "accepted": a}
            for lo, hi, n, a in zip(CONFIDENCE_BINS, CONFIDENCE_BINS[1:], tried, taken)]


def draft_runner(llm: LLM) -> ModelRunner:
    """The draft model's runner (behind prompt lookup, if that goes first)."""
    proposer = llm.engine.proposer
    return (proposer.model if isinstance(proposer, LookupFirst) else proposer).runner


def cost_ratio(llm: LLM, batch_sizes: list[int], context: int, steps: int, repeats: int) -> list[dict]:
    """Median decode-step times of target and drafter, interleaved, at each batch size."""
    target, draft = llm.engine.runner, draft_runner(llm)
    vocab = llm.engine.config.model_args.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(100, vocab, (max(batch_sizes), context), generator=gen).tolist()
    times: dict = {}
    for _ in range(repeats):
        for b in batch_sizes:
            for name, runner in (("target", target), ("draft", draft)):
                times.setdefault((name, b), []).extend(decode_step_times(runner, prompts[:b], steps))
    rows = []
    for b in batch_sizes:
        t, d = statistics.median(times[("target", b)]), statistics.median(times[("draft", b)])
        rows.append({"batch": b, "target_step_s": t, "draft_step_s": d, "c": d / t})
    return rows


def run(args: argparse.Namespace) -> dict:
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    temperatures = [float(t) for t in args.temperatures.split(",")]
    spec = {"num_speculative_tokens": args.k, **({} if args.method is None else {"method": args.method}),
            **({} if args.draft_model is None else {"model": args.draft_model}),
            **(args.speculative_config or {})}
    llm = LLM(args.model, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len, speculative_config=spec)
    method = llm.engine.config.speculative.method
    result: dict = {"method": method, "prompt_lookup_first": llm.engine.config.speculative.prompt_lookup_first,
                    "k": args.k, "output_len": args.output_len,
                    "threads": torch.get_num_threads()}
    # Only a draft model runs on its own tokens alone (prompt lookup has no model; an EAGLE-3
    # head needs the target's states): the cost and calibration passes are for it.
    has_model = method == "draft_model"
    result["cost"] = cost_ratio(llm, batch_sizes, args.context, args.steps, args.repeats) if has_model else []
    by_task = spec_bench_by_task(args.dataset)
    tasks = {task: select(prompts, args.per_task, args.seed) for task, prompts in by_task.items()}
    result["acceptance"] = {}
    with tqdm(total=len(tasks) * len(temperatures), desc="bench draft") as bar:
        for temperature in temperatures:
            per_task = {}
            for task, prompts in tasks.items():
                per_task[task] = acceptance(llm, prompts, temperature, args.output_len, args.seed)
                bar.update()
            keys = ("draft_tokens", "accepted_tokens", "drafts", "first_accepted")
            total = {key: sum(c[key] for c in per_task.values()) for key in keys}
            result["acceptance"][str(temperature)] = {"tasks": per_task, "overall": total}
    if has_model:
        chats = [llm.engine.apply_chat_template([{"role": "user", "content": p}]) for ps in tasks.values() for p in ps]
        result["calibration"] = calibration(llm, chats, args.output_len)
    llm.close()

    if result["cost"]:
        print(f"\ncost ratio c = draft step / target step ({result['threads']} thread(s), context {args.context}):")
        print("| batch | target step ms | draft step ms | c |\n|---|---|---|---|")
    for r in result["cost"]:
        print(f"| {r['batch']} | {r['target_step_s'] * 1e3:.1f} | {r['draft_step_s'] * 1e3:.1f} | {r['c']:.3f} |")
    print(f"\nacceptance at k = {args.k} ({args.per_task} prompts per task, {args.output_len} output tokens): "
          "rate (vLLM's) / first draft position / mean acceptance length")
    print("| task | " + " | ".join(f"T={t}" for t in temperatures) + " |\n|---|" + "---|" * len(temperatures))
    for task in [*tasks, "overall"]:
        cells = []
        for t in temperatures:
            block = result["acceptance"][str(t)]
            counts = block["overall"] if task == "overall" else block["tasks"][task]
            cells.append(f"{rate(counts):.3f} / {first_rate(counts):.3f} / {acceptance_length(counts):.2f}")
        print(f"| {task} | " + " | ".join(cells) + " |")
    if has_model:
        print("\nfirst-draft acceptance by the drafter's confidence (greedy; what TETRIS ranks drafts by):")
        print("| confidence | share of drafts | acceptance |\n|---|---|---|")
        total = sum(b["drafts"] for b in result["calibration"]) or 1
        for b in result["calibration"]:
            accepted = f"{b['accepted'] / b['drafts']:.3f}" if b["drafts"] else "-"
            print(f"| {b['low']:.1f}-{b['high']:.1f} | {b['drafts'] / total:.3f} | {accepted} |")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)
    return result
