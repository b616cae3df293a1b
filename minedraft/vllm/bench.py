"""vLLM without speculation, with the plugin's sequential SD and with its PSD, on the same chats.

    .venv-vllm/bin/python -m minedraft.vllm.bench --model TARGET --dataset ../shared/data/spec_bench_questions.jsonl

Each repeat builds a fresh engine per mode (the order rotates between repeats), warms it up with
one request, then times one `LLM.chat` over every prompt (greedy). Reports output tokens/s per run
and the median per mode, vLLM's speculative counters, the plugin's overlap totals, and whether each
mode's tokens equal vLLM's own.
"""

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from minedraft.bench.datasets import load_prompts
from minedraft.vllm import DEFAULT_DRAFT_MODEL, engine_args

MODES = ("plain", "sequential", "psd")


def spec_counters(llm) -> dict:
    """vLLM's speculative-decoding counters of `llm` (vllm:spec_decode_num_*), by short name."""
    return {m.name.removeprefix("vllm:spec_decode_"): m.value for m in llm.get_metrics()
            if m.name.startswith("vllm:spec_decode_num_") and hasattr(m, "value")}


def shutdown(llm) -> None:
    """Stop `llm`'s engine core now (it runs PSDScheduler.shutdown, which stops the drafter)."""
    llm.llm_engine.engine_core.shutdown()
    gc.collect()


def run_mode(mode: str, args: argparse.Namespace, prompts: list[str]) -> dict:
    import vllm

    trace = Path(tempfile.mkdtemp()) / "trace.jsonl"
    kwargs = dict(model=args.model, dtype="float32", enforce_eager=True, enable_prefix_caching=False,
                  max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs, disable_log_stats=False, seed=0)
    if mode != "plain":
        kwargs.update(engine_args(draft_model=args.draft_model, num_speculative_tokens=args.k,
                                  draft_cpus=args.draft_cpus, parallel=mode == "psd", trace=trace))
    llm = vllm.LLM(**kwargs)
    try:
        params = vllm.SamplingParams(temperature=0, max_tokens=args.max_tokens)
        chats = [[{"role": "user", "content": p}] for p in prompts]
        llm.chat(chats[:1], vllm.SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)  # warm-up
        start = time.perf_counter()
        outputs = llm.chat(chats, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        metrics = spec_counters(llm)
    finally:
        shutdown(llm)
    ids = [list(o.outputs[0].token_ids) for o in outputs]
    rows = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
    totals = next((r["totals"] for r in reversed(rows) if r["kind"] == "idle"), None)
    return {"mode": mode, "seconds": elapsed, "output_tokens": sum(map(len, ids)),
            "output_tokens_per_s": sum(map(len, ids)) / elapsed, "spec_decode": metrics, "plugin": totals,
            "token_ids": ids}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="target folder (the main venv's resolve_model(None))")
    parser.add_argument("--draft-model", default=str(DEFAULT_DRAFT_MODEL))
    parser.add_argument("--dataset", default=None, help="Spec-Bench jsonl or another prompt file (default: built-in)")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--draft-cpus", type=lambda v: [int(c) for c in v.split(",")], default=None)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output", default=None, help="write every run as JSON here")
    args = parser.parse_args(argv)
    if args.draft_cpus is None:  # vLLM's worker binds the first core (VLLM_CPU_OMP_THREADS_BIND)
        args.draft_cpus = [sorted(os.sched_getaffinity(0))[-1]]
    prompts = load_prompts(args.dataset, args.num_prompts)
    runs = []
    for r in range(args.repeats):
        for mode in MODES[r % 3:] + MODES[: r % 3]:
            runs.append(run_mode(mode, args, prompts))
            print(f"repeat {r} {mode}: {runs[-1]['output_tokens_per_s']:.1f} tokens/s", flush=True)
    plain = next(x["token_ids"] for x in runs if x["mode"] == "plain")
    summary = {}
    for mode in MODES:
        mine = [x for x in runs if x["mode"] == mode]
        summary[mode] = {"median_output_tokens_per_s": statistics.median(x["output_tokens_per_s"] for x in mine),
                         "equal_to_plain": all(x["token_ids"] == plain for x in mine),
                         "spec_decode": mine[-1]["spec_decode"], "plugin": mine[-1]["plugin"]}
    base = summary["plain"]["median_output_tokens_per_s"]
    for mode, s in summary.items():
        s["speedup_vs_plain"] = s["median_output_tokens_per_s"] / base
        print(f"{mode:>10}: {s['median_output_tokens_per_s']:.1f} tokens/s, {s['speedup_vs_plain']:.2f}x plain, "
              f"equal to plain: {s['equal_to_plain']}, {s['spec_decode'] or ''} {s['plugin'] or ''}")
    if args.output:
        Path(args.output).write_text(json.dumps({"args": vars(args), "summary": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
