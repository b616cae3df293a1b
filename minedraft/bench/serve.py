"""`minedraft bench serve`: drive any OpenAI-compatible server (ours, vLLM's, ...) with streamed
chat completions — Poisson arrivals at a request rate, or a closed loop at a fixed concurrency —
and report throughput, TTFT, TPOT, inter-token latency and end-to-end latency percentiles, goodput
under an SLO (vLLM's `--goodput`) and, optionally, a plot of inter-token latency over the run."""

import argparse
import asyncio
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from minedraft.bench.datasets import load_prompts
from minedraft.bench.plots import plot_itl
from minedraft.bench.stats import percentiles
from minedraft.engine.sequence import time_per_output_token


@dataclass
class Record:
    """One request, times in seconds from its start. chunk_times: arrival of every chunk with text.
    token_times: arrival of every chunk whose usage counted new tokens, text or not (a token that is
    half a character has no text yet); empty unless the server reports usage in every chunk."""

    ok: bool
    start: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    end: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str | None = None


SLO_KEYS = ("ttft", "tpot", "e2el")  # vLLM's --goodput keys


def parse_goodput(specs: list[str]) -> dict[str, float]:
    """vLLM's `--goodput KEY:VALUE ...` (KEY ttft, tpot or e2el; VALUE milliseconds) as {KEY: milliseconds}."""
    slo = {}
    for spec in specs:
        key, sep, value = spec.partition(":")
        if not sep:
            raise ValueError(f"--goodput: {spec!r} is not KEY:VALUE, e.g. ttft:2000")
        if key not in SLO_KEYS:
            raise ValueError(f"--goodput: unknown key {key!r} in {spec!r}; keys: {', '.join(SLO_KEYS)}")
        if key in slo:
            raise ValueError(f"--goodput: {key!r} given twice")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--goodput: {value!r} in {spec!r} is not a number of milliseconds") from None
        if not (math.isfinite(ms) and ms > 0):
            raise ValueError(f"--goodput: {value!r} in {spec!r} must be a finite number of milliseconds > 0")
        slo[key] = ms
    return slo


def completed(records: list[Record]) -> list[Record]:
    """The requests that succeeded with content: those the latency figures describe."""
    return [r for r in records if r.ok and r.chunk_times]


def request_metrics(record: Record) -> dict[str, float | None]:
    """A completed request's TTFT, TPOT (None with a single token) and end-to-end latency in seconds,
    keyed as --goodput's SLO."""
    ttft = record.chunk_times[0] - record.start
    e2el = record.end - record.start
    return {"ttft": ttft, "tpot": time_per_output_token(e2el, ttft, record.output_tokens), "e2el": e2el}


def meets_slo(metrics: dict[str, float | None], slo_ms: dict[str, float]) -> bool:
    """Every bound met; without a TPOT (one token) that bound holds, as vLLM counts such a TPOT as 0."""
    return all(metrics[key] is None or metrics[key] <= ms / 1e3 for key, ms in slo_ms.items())


def _ms(p: dict, key: str) -> float | None:
    return None if p[key] is None else p[key] * 1e3


def serve_figures(records: list[Record], duration: float, slo_ms: dict[str, float] | None = None) -> dict:
    """vllm-bench-serve-style figures. TTFT: start to first chunk; TPOT: (E2E - TTFT) / (tokens - 1);
    ITL: gaps between consecutive chunks (a chunk may carry several tokens under speculation);
    token gaps: between consecutive arrivals of tokens, whether or not they made text yet.
    With an SLO: goodput, the completed requests meeting every bound per second, and their share of all."""
    done = completed(records)
    metrics = [request_metrics(r) for r in done]
    ttft = percentiles([m["ttft"] for m in metrics])
    itl = percentiles([b - a for r in done for a, b in zip(r.chunk_times, r.chunk_times[1:])])
    token_gap = percentiles([b - a for r in done for a, b in zip(r.token_times, r.token_times[1:])])
    out_tokens = sum(r.output_tokens for r in done)
    figures = {
        "completed": len(done), "failed": len(records) - len(done), "duration_s": duration,
        "requests_per_s": len(done) / duration, "output_tokens_per_s": out_tokens / duration,
        "total_tokens_per_s": (out_tokens + sum(r.prompt_tokens for r in done)) / duration,
        # the headline latencies, flat and in ms as vLLM reports them; the full set is below in seconds
        "ttft_p50_ms": _ms(ttft, "p50"), "ttft_p99_ms": _ms(ttft, "p99"),
        "itl_p50_ms": _ms(itl, "p50"), "itl_p99_ms": _ms(itl, "p99"), "itl_max_ms": _ms(itl, "max"),
        "token_gap_p50_ms": _ms(token_gap, "p50"), "token_gap_p99_ms": _ms(token_gap, "p99"),
        "token_gap_max_ms": _ms(token_gap, "max"),
        "ttft_s": ttft, "tpot_s": percentiles([m["tpot"] for m in metrics if m["tpot"] is not None]),
        "itl_s": itl, "token_gap_s": token_gap, "e2e_s": percentiles([m["e2el"] for m in metrics]),
    }
    if slo_ms:
        good = sum(meets_slo(m, slo_ms) for m in metrics)
        figures |= {"goodput_slo_ms": dict(slo_ms), "goodput_requests_per_s": good / duration,
                    "goodput_share": good / len(records) if records else None}
    return figures


async def one_request(client, url: str, body: dict, origin: float) -> Record:
    record = Record(ok=False, start=time.perf_counter() - origin)
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}: {(await response.aread()).decode()[:200]}"
                return record
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                if chunk.get("usage"):
                    if chunk["choices"] and chunk["usage"]["completion_tokens"] > record.output_tokens:
                        record.token_times.append(time.perf_counter() - origin)
                    record.output_tokens = chunk["usage"]["completion_tokens"]
                    record.prompt_tokens = chunk["usage"]["prompt_tokens"]
                if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                    record.chunk_times.append(time.perf_counter() - origin)
        record.ok = True
    except Exception as e:  # a failed request is counted, not fatal to the run
        record.error = f"{type(e).__name__}: {e}"
    record.end = time.perf_counter() - origin
    return record


async def drive(args: argparse.Namespace, prompts: list[str]) -> tuple[list[Record], float]:
    import httpx

    base = args.base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(None)) as client:
        model = args.served_model
        if model is None:
            model = (await client.get(f"{base}/v1/models")).json()["data"][0]["id"]
        rng = random.Random(args.seed)
        limit = asyncio.Semaphore(args.max_concurrency or len(prompts))
        bar = tqdm(total=len(prompts), desc="bench serve", unit="req")
        origin = time.perf_counter()

        async def run_one(prompt: str) -> Record:
            body = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                    "max_tokens": args.output_len,
                    "temperature": args.temperature, "ignore_eos": args.ignore_eos}
            async with limit:
                record = await one_request(client, f"{base}/v1/chat/completions", body, origin)
            bar.update()
            return record

        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(run_one(prompt)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))  # Poisson arrivals
        records = await asyncio.gather(*tasks)
        bar.close()
        return records, time.perf_counter() - origin


def run_label(args: argparse.Namespace) -> str:
    """--label, else the load: the request rate and any concurrency cap."""
    if args.label:
        return args.label
    cap = f", max concurrency {args.max_concurrency}" if args.max_concurrency else ""
    return f"request rate {args.request_rate:g}/s{cap}"


def print_figures(figures: dict, records: list[Record], args: argparse.Namespace) -> None:
    errors = [r.error for r in records if r.error]
    print(f"\ncompleted {figures['completed']} of {len(records)} requests in {figures['duration_s']:.1f} s "
          f"(rate {args.request_rate}/s, max concurrency {args.max_concurrency or 'unbounded'})")
    if errors:
        print(f"first error: {errors[0]}")
    print(f"request throughput {figures['requests_per_s']:.2f} req/s; "
          f"output {figures['output_tokens_per_s']:.1f} tok/s; total {figures['total_tokens_per_s']:.1f} tok/s")
    ms = {k: "-" if figures[k] is None else f"{figures[k]:.1f}"
          for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "itl_max_ms",
                    "token_gap_p50_ms", "token_gap_p99_ms", "token_gap_max_ms")}
    print(f"TTFT p50 {ms['ttft_p50_ms']} ms, p99 {ms['ttft_p99_ms']} ms; "
          f"ITL p50 {ms['itl_p50_ms']} ms, p99 {ms['itl_p99_ms']} ms, max {ms['itl_max_ms']} ms; "
          f"token gap p50 {ms['token_gap_p50_ms']} ms, p99 {ms['token_gap_p99_ms']} ms, "
          f"max {ms['token_gap_max_ms']} ms")
    if "goodput_slo_ms" in figures:
        bounds = ", ".join(f"{k} <= {v:g} ms" for k, v in figures["goodput_slo_ms"].items())
        share = "-" if figures["goodput_share"] is None else f"{figures['goodput_share']:.1%}"
        print(f"goodput {figures['goodput_requests_per_s']:.2f} req/s ({share} of requests met {bounds})")
    print("| metric | mean ms | p50 ms | p90 ms | p99 ms |\n|---|---|---|---|---|")
    for name in ("ttft_s", "tpot_s", "itl_s", "token_gap_s", "e2e_s"):
        p = figures[name]
        cells = ["-" if p[k] is None else f"{p[k] * 1e3:.1f}" for k in ("mean", "p50", "p90", "p99")]
        print(f"| {name[:-2].upper().replace('_', ' ')} | " + " | ".join(cells) + " |")


def run(args: argparse.Namespace) -> dict:
    if args.request_rate <= 0:
        raise ValueError(f"--request-rate must be > 0 (inf: all at once), got {args.request_rate}")
    slo_ms = parse_goodput(args.goodput or [])  # before the run: a typo should not cost one
    prompts = load_prompts(args.dataset, args.num_prompts, args.seed)
    records, duration = asyncio.run(drive(args, prompts))
    figures = serve_figures(records, duration, slo_ms)
    print_figures(figures, records, args)
    if args.plot_itl:
        plot_itl([r.start for r in records], [r.chunk_times for r in completed(records)], Path(args.plot_itl),
                 run_label(args))
        print(f"wrote {args.plot_itl}")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"label": run_label(args), "figures": figures,
                       "args": {k: v for k, v in vars(args).items() if k != "func"},
                       "records": [asdict(r) for r in records]}, f, indent=2)
    return figures
