"""`minedraft bench serve`: drive any OpenAI-compatible server (ours, vLLM's, ...) with streamed
chat completions — Poisson arrivals at a request rate, or a closed loop at a fixed concurrency —
and report throughput, TTFT, TPOT, inter-token latency and end-to-end latency percentiles."""

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field

from tqdm import tqdm

from minedraft.bench.datasets import load_prompts
from minedraft.bench.stats import percentiles
from minedraft.engine.sequence import time_per_output_token


@dataclass
class Record:
    """One request, times in seconds from its start; chunk_times: arrival of every content chunk."""

    ok: bool
    start: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    end: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str | None = None


def serve_figures(records: list[Record], duration: float) -> dict:
    """vllm-bench-serve-style figures. TTFT: start to first chunk; TPOT: (E2E - TTFT) / (tokens - 1);
    ITL: gaps between consecutive chunks (a chunk may carry several tokens under speculation)."""
    done = [r for r in records if r.ok and r.chunk_times]
    ttft = [r.chunk_times[0] - r.start for r in done]
    e2e = [r.end - r.start for r in done]
    tpot = [t for r in done
            if (t := time_per_output_token(r.end - r.start, r.chunk_times[0] - r.start, r.output_tokens)) is not None]
    itl = [b - a for r in done for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    out_tokens = sum(r.output_tokens for r in done)
    return {
        "completed": len(done), "failed": len(records) - len(done), "duration_s": duration,
        "requests_per_s": len(done) / duration, "output_tokens_per_s": out_tokens / duration,
        "total_tokens_per_s": (out_tokens + sum(r.prompt_tokens for r in done)) / duration,
        "ttft_s": percentiles(ttft), "tpot_s": percentiles(tpot), "itl_s": percentiles(itl), "e2e_s": percentiles(e2e),
    }


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
                    "stream_options": {"include_usage": True}, "max_tokens": args.output_len,
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


def run(args: argparse.Namespace) -> dict:
    if args.request_rate <= 0:
        raise ValueError(f"--request-rate must be > 0 (inf: all at once), got {args.request_rate}")
    prompts = load_prompts(args.dataset, args.num_prompts, args.seed)
    records, duration = asyncio.run(drive(args, prompts))
    figures = serve_figures(records, duration)
    errors = [r.error for r in records if r.error]
    print(f"\ncompleted {figures['completed']} of {len(records)} requests in {duration:.1f} s "
          f"(rate {args.request_rate}/s, max concurrency {args.max_concurrency or 'unbounded'})")
    if errors:
        print(f"first error: {errors[0]}")
    print(f"request throughput {figures['requests_per_s']:.2f} req/s; "
          f"output {figures['output_tokens_per_s']:.1f} tok/s; total {figures['total_tokens_per_s']:.1f} tok/s")
    print("| metric | mean ms | p50 ms | p90 ms | p99 ms |\n|---|---|---|---|---|")
    for name in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        p = figures[name]
        cells = ["-" if p[k] is None else f"{p[k] * 1e3:.1f}" for k in ("mean", "p50", "p90", "p99")]
        print(f"| {name[:-2].upper()} | " + " | ".join(cells) + " |")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"figures": figures, "args": {k: v for k, v in vars(args).items() if k != "func"},
                       "records": [asdict(r) for r in records]}, f, indent=2)
    return figures
