"""Offline benchmark: every mode at the same number of requests in flight, interleaved in one run.

Modes (CPU placement on this 2-core kind of machine):
  ar         no speculation, target on core 0, one thread
  sd         standard SD, drafter in the target's process on core 0
  sd-remote  drafter in its own process on core 1, strictly draft-then-verify
  psd        drafter in its own process on core 1, two sub-batches overlapped
  psd-auto   psd with "overlap": "auto": sub-batches merged while overlapping would be slower
  sd-2t      standard SD with both cores (two threads): the equal-resources baseline
  sd-tetris, psd-tetris  sd and psd with TETRIS ("tetris": true): rows draft k + e tokens and the
             (sub-)batch verifies the k x rows most promising prefixes
  hf         the peer: transformers' assisted generation with the same pair (or its prompt lookup
             for the n-gram method), batch 1 (one request at a time), target on core 0
"""

import argparse
import json
import statistics
import time
from pathlib import Path

from tqdm import tqdm

from minedraft import LLM, SamplingParams
from minedraft.bench.datasets import load_prompts, select
from minedraft.bench.hf import AssistedGeneration
from minedraft.bench.plots import plot_latency_cdf, plot_throughput_vs_k, plot_timeline
from minedraft.bench.stats import request_figures
from minedraft.config import MACHINE_CPUS, EngineConfig
from minedraft.spec_decode.remote import pin
from minedraft.spec_decode.metrics import SpecDecodeMetrics
from minedraft.engine.llm_engine import LLMEngine
from minedraft.engine.sequence import RequestOutput
from minedraft.theory import (acceptance_by_position, expected_tokens_by_position, mean_step_seconds, psd_speedup,
                              psd_speedup_equal_concurrency)

MODES = ("ar", "sd", "sd-remote", "psd", "psd-auto", "sd-2t", "sd-tetris", "psd-tetris", "hf")


def placement(mode: str) -> tuple[list[int], dict | None]:
    """(cores for the engine's process, speculative_config keys of the mode, or None for ar)."""
    if mode.endswith("-tetris"):
        cores, spec = placement(mode.removesuffix("-tetris"))
        return cores, {**spec, "tetris": True}
    cores = MACHINE_CPUS
    target, draft = cores[:1], cores[1:2] or cores[:1]
    return {
        "ar": (target, None),
        "sd": (target, {}),
        "sd-remote": (target, {"draft_device": "cpu", "target_cpus": target, "draft_cpus": draft}),
        "psd": (target, {"parallel": True, "target_cpus": target, "draft_cpus": draft}),
        "psd-auto": (target, {"parallel": True, "overlap": "auto", "target_cpus": target, "draft_cpus": draft}),
        "sd-2t": (cores[:2], {}),
        "hf": (target, {}),
    }[mode]


def closed_loop(llm: LLM, prompts: list[list[int]], concurrency: int, params: SamplingParams) -> dict:
    """Keep `concurrency` requests in flight until every prompt is done; figures for the run."""
    engine = llm.engine
    engine.spec_metrics = SpecDecodeMetrics()
    if engine.trace is not None:
        engine.trace.clear()
    queue, outs, index = list(enumerate(prompts)), [], {}
    start = time.perf_counter()
    while queue or engine.has_unfinished():
        while queue and len(engine.requests) < concurrency:
            i, prompt = queue.pop(0)
            index[engine.add_request(prompt, params)] = i
        outs += [o for o in engine.step() if o.finished]
    makespan = time.perf_counter() - start
    trace = engine.trace or []
    metrics = engine.spec_metrics.as_dict()
    steps = metrics["num_steps"]
    figures = trace_figures(trace, makespan)
    return {
        **outputs_figures(outs, makespan),
        **paper_figures(outs, makespan, figures["prefill_s"]),
        "acceptance_rate": metrics["acceptance_rate"] if metrics["num_drafts"] else None,
        "mean_acceptance_length": metrics["mean_acceptance_length"] if metrics["num_drafts"] else None,
        "mean_draft_length": metrics["num_draft_tokens"] / metrics["num_drafts"] if metrics["num_drafts"] else None,
        "overlapped_share": metrics["num_overlapped_steps"] / steps if steps else 0.0,
        "draft_length": llm.get_metrics().get("draft_length"),  # "auto": what it settled on
        **figures,
        "makespan_s": makespan,
        "outputs": {index[o.request_id]: o.outputs[0].token_ids for o in outs},
        "trace": list(trace),
    }


def outputs_figures(outs: list[RequestOutput], makespan: float) -> dict:
    """Throughput and per-request latency figures of finished requests (times in seconds)."""
    latencies = [o.latencies() for o in outs]
    return request_figures([e2e for _, _, e2e in latencies], [ttft for ttft, _, _ in latencies],
                           [len(o.outputs[0].token_ids) for o in outs], makespan)


def paper_figures(outs: list[RequestOutput], makespan: float, prefill_s: float) -> dict:
    """The paper's figures: generation throughput over the decode phase only (every output token
    but the first of each request, which its prefill makes, over the run less its prefill steps)
    and makespan per request."""
    tokens = sum(len(o.outputs[0].token_ids) - 1 for o in outs)
    return {"generation_tokens_per_s": tokens / (makespan - prefill_s), "seconds_per_request": makespan / len(outs)}


def spans(trace: list[dict], kind: str) -> list[float]:
    """Durations of the trace's events of one kind, in order."""
    return [e["end"] - e["start"] for e in trace if e["kind"] == kind]


def verified_rows(trace: list[dict]) -> list[tuple[int, int]]:
    """(drafted, accepted) of every row the trace's verifications checked."""
    return [row for e in trace if e["kind"] == "verify" for row in zip(e["drafted"], e["accepted"])]


def trace_figures(trace: list[dict], makespan: float) -> dict:
    """Step times (median and mean; the longest draft), rows per step, seconds of prefill, and the
    share of the run each side sat idle."""
    def mean(values: list[float]) -> float | None:
        return statistics.mean(values) if values else None

    verify, draft, decode, prefill = (spans(trace, kind) for kind in ("verify", "draft", "decode", "prefill"))
    step_kind = "verify" if verify else "decode"  # the steps of the decode phase
    return {
        "verify_s_median": statistics.median(verify) if verify else None,
        "draft_s_median": statistics.median(draft) if draft else None,
        "draft_s_max": max(draft) if draft else None,  # catch-up drafts (a late prompt) show here
        "verify_s_mean": mean(verify), "draft_s_mean": mean(draft), "decode_s_mean": mean(decode),
        "rows_per_step": mean([e["size"] for e in trace if e["kind"] == step_kind]),
        "prefill_s": sum(prefill),
        "target_idle_share": max(0.0, 1 - (sum(verify) + sum(decode) + sum(prefill)) / makespan),
        "drafter_idle_share": max(0.0, 1 - sum(draft) / makespan) if draft else None,
    }


def speculative_base(args: argparse.Namespace) -> dict:
    """The speculative_config every speculative mode shares (--speculative-config, --draft-model);
    each mode adds its placement and the k under test (an integer or "auto")."""
    base = json.loads(args.speculative_config) if args.speculative_config else {}
    if not isinstance(base, dict):
        raise ValueError("--speculative-config must be a JSON object")
    placed = sorted(set(base) & {"parallel", "draft_device", "target_cpus", "draft_cpus", "num_speculative_tokens"})
    if placed:
        raise ValueError(f"--speculative-config key {placed[0]!r} is set by the benchmark (--modes, "
                         "--num-speculative-tokens)")
    if args.draft_model is not None:
        base["model"] = args.draft_model
    return base


def run(args: argparse.Namespace) -> dict:
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown mode {unknown[0]!r}; known: {', '.join(MODES)}")
    ks = [k if k == "auto" else int(k) for k in args.num_speculative_tokens.split(",")]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    base = speculative_base(args)
    llms = build_engines(args, modes, base, ks[0], max(concurrencies))
    engine = next(iter(llms.values())).engine
    peer = build_peer(args, base, ks[0]) if "hf" in modes else None
    prompts = benchmark_prompts(args, engine)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.output_len, ignore_eos=args.ignore_eos,
                            seed=args.seed if args.temperature > 0 else None)
    # hf runs one request at a time, so once per k, reported at concurrency 1.
    plan = [(c, k, m) for c in concurrencies for k in ks for m in modes
            if (m != "ar" or k == ks[0]) and (m != "hf" or c == concurrencies[0])]
    warm_up(llms, peer, prompts[: min(2, len(prompts))], ks[0])
    results = measure(llms, peer, plan, prompts, params, args)
    for llm in llms.values():
        llm.close()
    report = summarize(results, args)
    if args.plot_dir:
        plot_throughput_vs_k(report["rows"], Path(args.plot_dir) / "throughput_vs_k.png")
        plot_latency_cdf(results, Path(args.plot_dir) / "latency_cdf.png")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(report, indent=2))
    return report


def build_engines(args: argparse.Namespace, modes: list[str], base: dict, k: int | str,
                  max_num_seqs: int) -> dict[str, LLM]:
    """One engine per mode, each built on its mode's cores; an ar engine alone when only hf runs,
    since an engine tokenizes the prompts."""
    llms: dict[str, LLM] = {}
    for mode in [m for m in modes if m != "hf"] or ["ar"]:
        cores, spec = placement(mode)
        pin(tuple(cores))
        spec_config = None if spec is None else {**base, "num_speculative_tokens": k, **spec}
        llms[mode] = LLM(args.model, dtype=args.dtype, max_num_seqs=max_num_seqs, max_model_len=args.max_model_len,
                         seed=args.seed, speculative_config=spec_config, trace=True,
                         enforce_eager=args.enforce_eager, max_num_batched_tokens=args.max_num_batched_tokens,
                         max_prompt_tokens_beside_streams=args.max_prompt_tokens_beside_streams,
                         enable_chunked_prefill=args.enable_chunked_prefill,
                         prefill_stall_ratio=args.prefill_stall_ratio, scheduling_policy=args.scheduling_policy)
    return llms


def build_peer(args: argparse.Namespace, base: dict, k: int | str) -> AssistedGeneration:
    """transformers' assisted generation with the pair the speculative modes use."""
    pin(tuple(placement("hf")[0]))
    config = EngineConfig(args.model, dtype=args.dtype, max_model_len=args.max_model_len,
                          speculative_config={**base, "num_speculative_tokens": k})
    config.resolve_checkpoints()  # transformers reads folders; the engine has converted the target already
    return AssistedGeneration(config.model_path, config.speculative, config.torch_dtype)


def benchmark_prompts(args: argparse.Namespace, engine: LLMEngine) -> list[list[int]]:
    """The dataset's prompts as chat-templated token ids, those too long for the output left out."""
    max_len = args.max_model_len
    texts = load_prompts(args.dataset, None, args.seed)
    encoded = [engine.encode(engine.apply_chat_template([{"role": "user", "content": t}])) for t in texts]
    fitting = [p for p in encoded if len(p) + args.output_len < max_len]
    if len(fitting) < len(encoded):
        print(f"skipping {len(encoded) - len(fitting)} of {len(encoded)} prompts longer than "
              f"max_model_len - output_len = {max_len - args.output_len} tokens")
    return select(fitting, args.num_prompts, args.seed)


def warm_up(llms: dict[str, LLM], peer: AssistedGeneration | None, prompts: list[list[int]], k: int | str) -> None:
    """A short run of every mode first: first calls allocate and fill caches."""
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for mode, llm in llms.items():
        pin(tuple(placement(mode)[0]))
        closed_loop(llm, prompts, 2, params)
    if peer is not None:
        pin(tuple(placement("hf")[0]))
        peer.run(prompts, k, params)


def measure(llms: dict[str, LLM], peer: AssistedGeneration | None, plan: list[tuple[int, int | str, str]],
            prompts: list[list[int]], params: SamplingParams, args: argparse.Namespace) -> dict[tuple, list[dict]]:
    """Every (concurrency, k, mode) of `plan`, `args.repeats` times, interleaved; the figures of
    each run by (mode, k or None for ar, concurrency)."""
    results: dict[tuple, list[dict]] = {}
    with tqdm(total=len(plan) * args.repeats, desc="bench offline") as bar:
        for _ in range(args.repeats):
            for c, k, mode in plan:
                cores, spec = placement(mode)
                pin(tuple(cores))
                if mode == "hf":
                    figures, c = peer.run(prompts, k, params), 1
                else:
                    if spec is not None:
                        llms[mode].engine.set_num_speculative_tokens(k)
                    figures = closed_loop(llms[mode], prompts, c, params)
                results.setdefault((mode, k if spec is not None else None, c), []).append(figures)
                if args.plot_dir and (mode.startswith("psd") or mode == "sd-remote"):
                    plot_timeline(figures["trace"], Path(args.plot_dir) / f"timeline_{mode}_k{k}_c{c}.png",
                                  f"{mode}, k={k}, {c} requests in flight")
                bar.update()
    return results


def median_of(runs: list[dict], key: str):
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


def summarize(results: dict[tuple, list[dict]], args: argparse.Namespace) -> dict:
    rows = []
    for (mode, k, c), runs in results.items():
        row = {"mode": mode, "k": k, "concurrency": c, "repeats": len(runs)}
        for key in runs[0]:
            if key not in ("outputs", "trace", "e2e_s", "draft_length"):
                row[key] = median_of(runs, key)
        row["e2e_s"] = [x for r in runs for x in r["e2e_s"]]  # every request of every repeat
        row["draft_length"] = [r.get("draft_length") for r in runs]  # each repeat's (the hf peer has none)
        rows.append(row)
    by = {(r["mode"], r["k"], r["concurrency"]): r for r in rows}
    ar_outputs = {c: runs[0]["outputs"] for (m, _, c), runs in results.items() if m == "ar"}
    for (mode, k, c), runs in results.items():
        row = by[(mode, k, c)]
        if args.temperature == 0 and c in ar_outputs and mode != "ar":  # greedy: outputs equal to ar's
            ref = ar_outputs[c]
            row["identical_to_ar"] = sum(ref[i] == out for i, out in runs[0]["outputs"].items()) / len(ref)
        base = by.get(("ar", None, c))
        row["speedup_vs_ar"] = row["output_tokens_per_s"] / base["output_tokens_per_s"] if base else None
        if mode == "psd":
            for ref_mode in ("sd", "sd-remote", "sd-2t"):
                ref = by.get((ref_mode, k, c))
                row[f"speedup_vs_{ref_mode}"] = row["output_tokens_per_s"] / ref["output_tokens_per_s"] if ref else None
            V, t = row["verify_s_median"], row["draft_s_median"]
            row["predicted_psd_over_sd_linear"] = psd_speedup(V, t) if V and t else None
            ref = by.get(("sd-remote", k, c))
            if ref and ref["verify_s_median"] and ref["draft_s_median"] and V and t:
                row["predicted_psd_over_sd_remote"] = psd_speedup_equal_concurrency(
                    ref["verify_s_median"], ref["draft_s_median"], V, t)
    rates = predict(results, by)
    print_table(rows)
    print_model_check(rows, rates)
    return {"command": {k: v for k, v in vars(args).items() if k != "func"}, "date": time.strftime("%Y-%m-%d %H:%M"),
            "acceptance_by_position": rates, "rows": rows,
            "traces": {f"{mode} k={k} c={c}": [r.get("trace", []) for r in runs]
                       for (mode, k, c), runs in results.items()}}


def predict(results: dict[tuple, list[dict]], by: dict[tuple, dict]) -> list[float]:
    """minedraft.theory beside the measurements: each speculative row with a fixed k gets the
    decode-phase speedup over ar that the model predicts from its own measured V and t (step by
    step, `mean_step_seconds`), share of overlapped steps, rows per step, and the acceptance by
    draft position pooled over every run without TETRIS (the drafter is the same in every mode),
    against ar's mean decode step and rows. Returns that pooled acceptance."""
    pooled = [row for (mode, k, _), runs in results.items() if k not in (None, "auto") and "tetris" not in mode
              for r in runs for row in verified_rows(r.get("trace", []))]
    rates = acceptance_by_position(pooled)
    for (mode, k, c), runs in results.items():
        row, ar = by[(mode, k, c)], by.get(("ar", None, c))
        if ar is not None and mode != "ar" and row.get("generation_tokens_per_s"):
            row["generation_speedup_vs_ar"] = row["generation_tokens_per_s"] / ar["generation_tokens_per_s"]
        verified = [row for r in runs for row in verified_rows(r.get("trace", []))]
        # Runs that drafted nothing (their drafter failed at once, say) have no steps to model.
        steps = [mean_step_seconds(verify, draft, r["overlapped_share"]) for r in runs
                 if (verify := spans(r.get("trace", []), "verify")) and (draft := spans(r.get("trace", []), "draft"))]
        if k in (None, "auto") or not verified or not steps or ar is None or not ar["decode_s_mean"]:
            continue
        row["tokens_per_row"] = statistics.mean(a + 1 for _, a in verified)
        row["predicted_tokens_per_row"] = statistics.mean(expected_tokens_by_position(rates, d) for d, _ in verified)
        predicted = row["rows_per_step"] * row["predicted_tokens_per_row"] / statistics.median(steps)
        row["predicted_speedup_vs_ar"] = predicted / (ar["rows_per_step"] / ar["decode_s_mean"])
    return rates


def k_order(k: int | str | None) -> int:
    """Sort key of a k column: none (ar) first, then 1, 2, ..., then "auto"."""
    return -1 if k is None else 99 if k == "auto" else k


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict]) -> None:
    print("\n| mode | k | conc | tok/s | x ar | mean lat s | p90 lat s | TTFT s | TPOT ms | accept | "
          "mean acc len | overlap | target idle | drafter idle | V ms | t ms | psd/sd | psd/sd-remote (pred) | "
          "same as ar |")
    print("|" + "---|" * 19)
    for r in sorted(rows, key=lambda r: (r["concurrency"], k_order(r["k"]), MODES.index(r["mode"]))):
        pred = r.get("predicted_psd_over_sd_remote")
        print(f"| {r['mode']} | {'-' if r['k'] is None else r['k']} | {r['concurrency']} | {r['output_tokens_per_s']:.1f} | "
              f"{fmt(r['speedup_vs_ar'], '.2f')} | {r['latency_mean_s']:.2f} | {r['latency_p90_s']:.2f} | "
              f"{r['ttft_mean_s']:.2f} | {r['tpot_mean_s'] * 1e3:.0f} | {fmt(r['acceptance_rate'], '.2f')} | "
              f"{fmt(r['mean_acceptance_length'], '.2f')} | {fmt(r['overlapped_share'], '.2f')} | "
              f"{fmt(r['target_idle_share'], '.2f')} | {fmt(r['drafter_idle_share'], '.2f')} | "
              f"{fmt(r['verify_s_median'] and r['verify_s_median'] * 1e3, '.0f')} | "
              f"{fmt(r['draft_s_median'] and r['draft_s_median'] * 1e3, '.0f')} | "
              f"{fmt(r.get('speedup_vs_sd'), '.2f')} | {fmt(r.get('speedup_vs_sd-remote'), '.2f')} "
              f"({fmt(pred, '.2f')}) | {fmt(r.get('identical_to_ar'), '.2f')} |")


def print_model_check(rows: list[dict], rates: list[float]) -> None:
    """Predicted against measured decode-phase speedup over ar, and the best k of each mode by both."""
    print("\nacceptance by draft position (pooled): " + ", ".join(f"{r:.3f}" for r in rates))
    print("\n| mode | k | conc | gen tok/s | s / request | tokens per row | predicted | x ar (decode phase) | "
          "predicted | predicted / measured |")
    print("|" + "---|" * 10)
    checked = sorted((r for r in rows if "predicted_speedup_vs_ar" in r),
                     key=lambda r: (r["concurrency"], MODES.index(r["mode"]), k_order(r["k"])))
    for r in checked:
        measured, predicted = r["generation_speedup_vs_ar"], r["predicted_speedup_vs_ar"]
        print(f"| {r['mode']} | {r['k']} | {r['concurrency']} | {r['generation_tokens_per_s']:.1f} | "
              f"{r['seconds_per_request']:.2f} | {r['tokens_per_row']:.2f} | {r['predicted_tokens_per_row']:.2f} | "
              f"{measured:.2f} | {predicted:.2f} | {predicted / measured:.2f} |")
    for mode, c in dict.fromkeys((r["mode"], r["concurrency"]) for r in checked):
        group = [r for r in checked if (r["mode"], r["concurrency"]) == (mode, c)]
        best = max(group, key=lambda r: r["generation_speedup_vs_ar"])["k"]
        best_predicted = max(group, key=lambda r: r["predicted_speedup_vs_ar"])["k"]
        print(f"best k, {mode} at {c} in flight: measured {best}, predicted {best_predicted}")
