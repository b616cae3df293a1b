"""Prompt sets for benchmarks: Spec-Bench jsonl, ShareGPT json, plain jsonl / text, or built-in."""

import json
import random
from pathlib import Path

# Written for the project so a benchmark runs on a fresh machine; one per Spec-Bench-like task.
BUILTIN_PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator keeps food cold, in simple terms.",
    "Give me three tips for learning a new programming language.",
    "What are the main differences between a virus and a bacterium?",
    "Translate into French: The library opens at nine and closes at six on weekdays.",
    "Summarize the idea of supply and demand in two sentences.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "A train travels 120 km in 1.5 hours. What is its average speed? Show your steps.",
    "Describe a sunrise over the mountains for a travel brochure.",
    "List five fruits that are rich in vitamin C and say one thing about each.",
    "Why is the sky blue? Answer briefly.",
    "Pretend you are a tour guide in Rome and welcome a group of visitors.",
    "What is the capital of Australia, and why was it chosen?",
    "Write a polite email asking a colleague to review a report by Friday.",
    "Explain recursion to a ten-year-old.",
    "Compare tea and coffee in a short paragraph.",
]


def load_prompts(path: str | None, num_prompts: int | None, seed: int = 0) -> list[str]:
    """User messages (first turns) from `path`, or the built-in set; sampled or cycled to
    `num_prompts` (None: all of them)."""
    if path is None:
        prompts = list(BUILTIN_PROMPTS)
    else:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"dataset {path!r} does not exist")
        prompts = _read(p)
        if not prompts:
            raise ValueError(f"dataset {path!r} holds no prompts")
    return prompts if num_prompts is None else select(prompts, num_prompts, seed)


def select(items: list, n: int, seed: int = 0) -> list:
    """n of the items: a seeded sample, or the items cycled when there are fewer than n."""
    if len(items) >= n:
        return random.Random(seed).sample(items, n)
    return [items[i % len(items)] for i in range(n)]


def _read(path: Path) -> list[str]:
    text = path.read_text()
    if path.suffix == ".json":  # ShareGPT: [{"conversations": [{"from": "human", "value": ...}, ...]}, ...]
        out = []
        for item in json.loads(text):
            turns = item.get("conversations") or []
            if turns and turns[0].get("from") in ("human", "user"):
                out.append(turns[0]["value"])
        return out
    if path.suffix == ".jsonl":  # Spec-Bench {"turns": [...]} or {"prompt": ...}
        out = []
        for line in text.splitlines():
            if line.strip():
                item = json.loads(line)
                out.append(item["turns"][0] if "turns" in item else item["prompt"])
        return out
    return [line for line in text.splitlines() if line.strip()]


# Spec-Bench's own tasks; its remaining questions (MT-bench's writing, roleplay, ...) form one task.
SPEC_BENCH_TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def spec_bench_by_task(path: str) -> dict[str, list[str]]:
    """First turns of a Spec-Bench jsonl, grouped by task."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"dataset {path!r} does not exist")
    groups: dict[str, list[str]] = {}
    for line in p.read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            if "category" not in item or "turns" not in item:
                raise ValueError(f"dataset {path!r} is not Spec-Bench jsonl (needs 'category' and 'turns')")
            task = item["category"] if item["category"] in SPEC_BENCH_TASKS else "mt_bench"
            groups.setdefault(task, []).append(item["turns"][0])
    return groups
