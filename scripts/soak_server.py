"""A bounded soak test of `minedraft serve` in psd mode, on loopback.

Starts a server (by default on a tiny random-weight float64 target and drafter that use SmolLM2's
tokenizer, so text, chat templates and stop strings are real and greedy output is exact), then
sends it a mixed load: streamed and not, n > 1, stop strings, seeds, logprobs, chat, clients that
disconnect midway and malformed bodies. It checks that no answer is a 5xx, every valid request
completes, greedy answers equal the same request run alone, `minedraft:num_requests_running`
returns to 0, every KV slot is free in target and drafter, and resident memory (server and
drafter) grows by less than 5% over the second half. Prints a JSON summary; exits 1 on failure.

    .venv/bin/python scripts/soak_server.py [--requests 600] [--min-requests 500] [--concurrency 12]
"""

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import save_tiny_checkpoint  # noqa: E402  (the tests' tiny checkpoint)

from minedraft.spec_decode.remote import free_port  # noqa: E402

MODEL = "soak"
MAX_MODEL_LEN = 64


def tiny_checkpoint(path: Path, seed: int, layers: int, tokenizer_dir: Path) -> Path:
    """A random Llama with SmolLM2's vocabulary and tokenizer, float64, weights peaked enough
    that greedy choices are far from ties (the test suite's tiny checkpoint)."""
    save_tiny_checkpoint(path, "llama", seed=seed, num_hidden_layers=layers, vocab_size=49152,
                         max_position_embeddings=512)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, path / name)
    return path


def rss_bytes(pid: int) -> int:
    """Resident memory of a process and its children (the drafter)."""
    total = 0
    pids = [pid] + [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for p in pids:
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except FileNotFoundError:
            pass
    return total


@dataclass
class Case:
    kind: str  # "greedy" | "sampled" | "malformed"
    path: str
    body: dict | bytes
    key: int | None = None  # greedy: which reference answer each choice must equal
    disconnect_after: int | None = None  # stream: events read before leaving; non-stream: a short timeout


@dataclass
class Tally:
    statuses: dict = field(default_factory=dict)
    completed: int = 0
    disconnected: int = 0
    refused: int = 0
    greedy_checked: int = 0
    failures: list = field(default_factory=list)

    def fail(self, message: str) -> None:
        if len(self.failures) < 20:
            self.failures.append(message)


PROMPTS = ["Once upon a time", "The capital of France is", "List three colours:", "def fibonacci(n):",
           "In 1969, astronauts", "The quick brown fox", "Translate to French: good morning", "Why is the sky blue?",
           "A haiku about rain:", "Q: 17 + 25 = ?\nA:", "Dear customer,", "Step 1: preheat the oven"]
MALFORMED = [b"{not json", b"[]", b'{"model": "soak"}', b'{"model": "soak", "prompt": "x", "temperature": NaN}',
             b'{"model": "soak", "prompt": "x", "n": 2, "seed": 18446744073709551615}',
             b'{"model": "soak", "prompt": "x", "max_tokens": 1000000000000}',
             b'{"model": "soak", "prompt": "x", "logprobs": 10000}', b'{"model": "soak", "prompt": [1, true]}',
             b'{"model": "soak", "prompt": "x", "n": 0}', b'{"model": "soak", "prompt": "x", "stop": 5}',
             b'{"model": "soak", "prompt": [99999999]}', b'{"model": "gpt-9", "prompt": "x"}',
             b'{"model": "soak", "messages": [{"role": "robot", "content": "x"}]}',
             b'{"model": "soak", "messages": []}', b'{"model": "soak", "prompt": "x", "top_p": 0}']


def greedy_cases(rng: random.Random) -> list[tuple[str, dict]]:
    """(path, body) of each distinct greedy request; stop strings are added once the free
    answers are known."""
    cases = []
    for prompt in PROMPTS:
        cases.append(("/v1/completions", {"prompt": prompt, "max_tokens": rng.randint(4, 16)}))
        cases.append(("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                               "max_tokens": rng.randint(4, 16)}))
    return cases


def answer_texts(path: str, data: dict) -> list[str]:
    chat = path.endswith("chat/completions")
    return [c["message"]["content"] if chat else c["text"] for c in sorted(data["choices"], key=lambda c: c["index"])]


async def post(http: httpx.AsyncClient, path: str, body: dict) -> dict:
    r = await http.post(path, json={"model": MODEL, "temperature": 0, **body})
    r.raise_for_status()
    return r.json()


async def references(http: httpx.AsyncClient, rng: random.Random) -> list[tuple[str, dict, str]]:
    """Each greedy case, half of them with a stop string taken from its free answer, run alone."""
    refs = []
    for path, body in greedy_cases(rng):
        free = answer_texts(path, await post(http, path, body))[0]
        if rng.random() < 0.5 and len(free) > 6:
            start = rng.randrange(2, len(free) - 3)
            body = {**body, "stop": [free[start : start + rng.randint(1, 3)], "\u2603never"]}
        refs.append((path, body, answer_texts(path, await post(http, path, body))[0]))
    return refs


def make_case(rng: random.Random, refs: list) -> Case:
    stream = rng.random() < 0.5
    extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    leave = (rng.randint(1, 3) if stream else rng.uniform(0.02, 0.3)) if rng.random() < 0.12 else None
    roll = rng.random()
    if roll < 0.1:
        return Case("malformed", rng.choice(["/v1/completions", "/v1/chat/completions"]), rng.choice(MALFORMED))
    if roll < 0.55:
        key = rng.randrange(len(refs))
        path, body, _ = refs[key]
        return Case("greedy", path, {**body, "temperature": 0, "n": rng.choice([1, 1, 2, 3]), **extra}, key, leave)
    path = rng.choice(["/v1/completions", "/v1/chat/completions"])
    prompt = rng.choice(PROMPTS)
    body = {"prompt": prompt} if path == "/v1/completions" else {"messages": [{"role": "user", "content": prompt}]}
    body.update(temperature=rng.choice([0.7, 1.0, 1e-5]), top_p=rng.choice([1.0, 0.9]), n=rng.choice([1, 2, 3]),
                max_tokens=rng.randint(1, 20), **extra)
    if rng.random() < 0.5:
        body["seed"] = rng.randrange(2**63 - 3)
    if rng.random() < 0.3:
        body["stop"] = rng.choice(["e", "the", "\n"])
    if rng.random() < 0.2 and path == "/v1/completions":
        body["logprobs"] = rng.randint(0, 5)
    return Case("sampled", path, body, None, leave)


async def run_case(http: httpx.AsyncClient, case: Case, refs: list, tally: Tally) -> None:
    if case.kind == "malformed":
        r = await http.post(case.path, content=case.body, headers={"Content-Type": "application/json"})
        tally.statuses[r.status_code] = tally.statuses.get(r.status_code, 0) + 1
        tally.refused += 1
        if r.status_code not in (400, 404):
            tally.fail(f"malformed body {case.body[:60]!r} got {r.status_code}")
        return
    body = {"model": MODEL, **case.body}
    n = body.get("n", 1)
    try:
        if body.get("stream"):
            texts, finished, events, done = {}, {}, 0, False
            async with http.stream("POST", case.path, json=body) as r:
                tally.statuses[r.status_code] = tally.statuses.get(r.status_code, 0) + 1
                if r.status_code != 200:
                    tally.fail(f"stream {body} got {r.status_code}: {(await r.aread())[:200]!r}")
                    return
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    events += 1
                    if case.disconnect_after is not None and events >= case.disconnect_after:
                        tally.disconnected += 1
                        return
                    if line == "data: [DONE]":
                        done = True
                        break
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        tally.fail(f"stream {body} got an error event: {chunk}")
                        return
                    for c in chunk["choices"]:
                        delta = (c["delta"].get("content") or "") if "delta" in c else c["text"]
                        texts[c["index"]] = texts.get(c["index"], "") + delta
                        if c["finish_reason"]:
                            finished[c["index"]] = c["finish_reason"]
            if not done or len(finished) != n:
                tally.fail(f"stream {body} ended without [DONE] or a finish_reason per choice: {finished}")
                return
            answers = [texts.get(i, "") for i in range(n)]
            reasons = [finished[i] for i in range(n)]
        else:
            timeout = case.disconnect_after if case.disconnect_after is not None else 120
            r = await http.post(case.path, json=body, timeout=timeout)
            tally.statuses[r.status_code] = tally.statuses.get(r.status_code, 0) + 1
            if r.status_code != 200:
                tally.fail(f"{body} got {r.status_code}: {r.text[:200]}")
                return
            data = r.json()
            answers = answer_texts(case.path, data)
            reasons = [c["finish_reason"] for c in sorted(data["choices"], key=lambda c: c["index"])]
    except httpx.TimeoutException:
        if case.disconnect_after is None:
            tally.fail(f"{body} timed out")
        else:
            tally.disconnected += 1
        return
    if len(answers) != n or any(reason not in ("stop", "length") for reason in reasons):
        tally.fail(f"{body}: {len(answers)} answers, finish reasons {reasons}")
        return
    tally.completed += 1
    if case.kind == "greedy":
        want = refs[case.key][2]
        tally.greedy_checked += 1
        if any(a != want for a in answers):
            tally.fail(f"greedy {body}: {answers} != alone {want!r}")


def metric(text: str, name: str) -> float:
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


async def soak(args: argparse.Namespace, url: str, pid: int, stop_sending: float) -> dict:
    """The load, then the checks; no request is sent after `stop_sending` (time.monotonic())."""
    rng = random.Random(args.seed)
    tally, rss = Tally(), []
    async with httpx.AsyncClient(base_url=url, timeout=120,
                                 limits=httpx.Limits(max_connections=args.concurrency * 2)) as http:
        refs = await references(http, rng)
        cases = [make_case(rng, refs) for _ in range(args.requests)]
        queue = list(reversed(cases))
        start = time.monotonic()

        async def worker():
            while queue and time.monotonic() < stop_sending:
                await run_case(http, queue.pop(), refs, tally)

        async def sample_memory():
            while True:
                rss.append((time.monotonic() - start, rss_bytes(pid)))
                await asyncio.sleep(0.25)

        sampler = asyncio.ensure_future(sample_memory())
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        load_seconds = time.monotonic() - start
        sampler.cancel()
        if len(cases) - len(queue) < args.min_requests:
            tally.fail(f"only {len(cases) - len(queue)} requests sent within the time budget")
        # Disconnected requests are aborted within the server's 0.5 s disconnect poll.
        deadline = time.monotonic() + 30
        while True:
            text = (await http.get("/metrics")).text
            running, waiting = (metric(text, f"minedraft:num_requests_{s}") for s in ("running", "waiting"))
            slots = (await http.get("/debug/kv_slots")).json()
            idle = running == 0 and waiting == 0 and slots["drafter"] is not None
            if idle and slots["target"] == slots["drafter"] == slots["num_slots"] or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)
        failures = metric(text, "minedraft:spec_decode_drafter_failures_total")
        overlapped = metric(text, "minedraft:spec_decode_num_overlapped_steps_total")
    half = [r for t, r in rss if t >= load_seconds / 2]
    mid, end = statistics.median(half[: max(len(half) // 10, 1)]), statistics.median(half[-max(len(half) // 10, 1):])
    growth = end / mid - 1
    if running != 0 or waiting != 0:
        tally.fail(f"num_requests_running {running}, waiting {waiting} after the load")
    if not slots["target"] == slots["drafter"] == slots["num_slots"]:
        tally.fail(f"KV slots not all free: {slots}")
    if growth >= 0.05:
        tally.fail(f"resident memory grew {growth:.1%} over the second half")
    if any(status >= 500 for status in tally.statuses):
        tally.fail(f"5xx answers: {tally.statuses}")
    if failures:
        tally.fail(f"{failures:.0f} drafter failures")
    return {"requests": len(cases) - len(queue), "seconds": round(load_seconds, 1),
            "statuses": dict(sorted(tally.statuses.items())), "completed": tally.completed,
            "disconnected": tally.disconnected, "malformed_refused": tally.refused,
            "greedy_checked_against_alone": tally.greedy_checked, "num_requests_running_after": running,
            "kv_slots_after": slots, "overlapped_steps": overlapped, "drafter_failures": failures,
            "rss_mb_second_half": [round(mid / 2**20, 1), round(end / 2**20, 1)],
            "rss_growth_second_half": round(growth, 4), "failures": tally.failures, "ok": not tally.failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=600, help="requests to send, time allowing")
    parser.add_argument("--min-requests", type=int, default=500, help="fewer sent in time is a failure")
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--max-seconds", type=float, default=290, help="the whole run, start-up and checks included")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="target (default: a tiny random float64 model)")
    parser.add_argument("--draft", default=None, help="drafter (default: another tiny random model)")
    parser.add_argument("--dtype", default="float64")
    args = parser.parse_args()
    began = time.monotonic()
    from minedraft.models.loader import resolve_model

    work = Path(tempfile.mkdtemp(prefix="minedraft-soak-"))
    tokenizer_dir = resolve_model(None)
    model = args.model or tiny_checkpoint(work / "target", 0, 2, tokenizer_dir)
    draft = args.draft or tiny_checkpoint(work / "draft", 1, 1, tokenizer_dir)
    port = free_port()
    spec = {"model": str(draft), "num_speculative_tokens": 3, "parallel": True}
    server = subprocess.Popen([sys.executable, "-m", "minedraft.cli", "serve", "--model", str(model),
                               "--dtype", args.dtype, "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8",
                               "--served-model-name", MODEL, "--port", str(port),
                               "--speculative-config", json.dumps(spec)],
                              stdout=subprocess.DEVNULL, stderr=open(work / "server.log", "w"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"the server did not start; see {work / 'server.log'}")
            time.sleep(0.5)
        # The checks after the load take a few seconds, up to 30 if requests were left running.
        result = asyncio.run(soak(args, url, server.pid, began + args.max_seconds - 40))
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(json.dumps(result, indent=1))
    if not result["ok"]:
        print(f"server log: {work / 'server.log'}", file=sys.stderr)
        sys.exit(1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
