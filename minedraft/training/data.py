"""Distillation data: the target's own replies to the training prompts, with its top-k
log-probabilities at every reply position (recorded while generating, so the teacher costs nothing
extra). Written in shards, so an interrupted run resumes at the first missing shard."""

import logging
import random
from pathlib import Path

import torch
from tqdm import tqdm

from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.engine.sequence import RequestOutput
from minedraft.llm import LLM
from minedraft.sampling import SamplingParams
from minedraft.training.distill import save_atomically
from minedraft.training.prompts import build_prompts, doc_passages, document_requests, is_repetitive, sentences

log = logging.getLogger("minedraft")


def reply_sample(category: str, greedy: bool, out: RequestOutput, top_k: int) -> dict:
    """A training sample from a finished request that asked for `logprobs=top_k`."""
    completion = out.outputs[0]
    # Each position's top_k most likely tokens (dicts list them first, then the chosen token).
    top = [list(d.items())[:top_k] for d in completion.logprobs]
    return {
        "category": category,
        "greedy": greedy,
        "prompt": torch.tensor(out.prompt_token_ids, dtype=torch.int32),
        "reply": torch.tensor(completion.token_ids, dtype=torch.int32),
        "top_ids": torch.tensor([[t for t, _ in row] for row in top], dtype=torch.int32),
        "top_logprobs": torch.tensor([[v for _, v in row] for row in top], dtype=torch.float16),
    }


def write_shard(path: Path, samples: list[dict]) -> None:
    save_atomically(path, samples)  # a shard exists only once complete
    log.info("wrote %s (%d replies, %d tokens)", path, len(samples), sum(len(s["reply"]) for s in samples))


def reply_shards(data_dir: Path, num_prompts: int, shard_size: int) -> list[Path]:
    """The shard files `num_prompts` replies are written to, `shard_size` per file."""
    return [data_dir / f"shard-{index:04d}.pt" for index in range(-(-num_prompts // shard_size))]


def generate_data(llm: LLM, data_dir: Path, num_prompts: int, shard_size: int, max_tokens: int,
                  top_k: int, seed: int = 0, mix: str = "default") -> list[Path]:
    """Generate every missing shard; returns all shard paths. Half the replies are greedy, half
    sampled at temperature 1, so the drafter sees both regimes it will be used in. `mix`: the
    prompt families (prompts.build_prompts); "written" first has the target write half as many
    documents as prompts (written_documents, next to `data_dir`)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    documents = written_documents(llm, data_dir.parent / "documents", num_prompts // 2, shard_size, seed) \
        if mix == "written" else None
    prompts = build_prompts(num_prompts, seed, mix, documents)
    paths = reply_shards(data_dir, num_prompts, shard_size)
    for path, first in zip(paths, range(0, num_prompts, shard_size)):
        if path.exists():
            continue
        # Similar lengths side by side: prefill pads each batch to its longest prompt.
        chunk = sorted(prompts[first : first + shard_size], key=lambda c: len(c[1]))
        # Characters do not bound tokens (symbols and non-Latin text take several): a prompt
        # without room for a whole reply is left out rather than failing the shard.
        room = llm.engine.config.max_model_len - max_tokens
        fits = [len(llm.engine.encode(llm.engine.apply_chat_template([{"role": "user", "content": t}]))) <= room
                for _, t in chunk]
        if not all(fits):
            log.info("%s: %d prompts too long for max_model_len, left out", path.name, fits.count(False))
            chunk = [c for c, ok in zip(chunk, fits) if ok]
        params = [SamplingParams(temperature=0.0 if (first + i) % 2 == 0 else 1.0, max_tokens=max_tokens,
                                 seed=seed + first + i, logprobs=top_k) for i in range(len(chunk))]
        outs = llm.chat([[{"role": "user", "content": text}] for _, text in chunk], params)
        write_shard(path, [reply_sample(category, p.greedy, out, top_k)
                           for (category, _), p, out in zip(chunk, params, outs)])
    return paths


def written_documents(llm: LLM, folder: Path, num: int, shard_size: int, seed: int = 0,
                      max_tokens: int = 450) -> list[dict]:
    """The target's own articles for prompt mix "written" (prompts.document_requests), sampled at
    temperature 0.8 / top-p 0.95 and written in resumable shards; articles that loop
    (prompts.is_repetitive) or stop short of 600 characters are left out. Each document:
    kind ("news" or "encyclopedia"), subject, about (person, place or thing), text."""
    folder.mkdir(parents=True, exist_ok=True)
    requests = document_requests(num, seed)
    documents = []
    starts = range(0, num, shard_size)
    for start in tqdm(starts, desc="documents", unit="shard", disable=len(starts) < 2):
        path = folder / f"documents-{start // shard_size:04d}.pt"
        if not path.exists():
            chunk = requests[start : start + shard_size]
            params = [SamplingParams(temperature=0.8, top_p=0.95, max_tokens=max_tokens, seed=seed + start + i)
                      for i in range(len(chunk))]
            outs = llm.chat([[{"role": "user", "content": r["request"]}] for r in chunk], params, use_tqdm=False)
            kept = []
            for request, out in zip(chunk, outs):
                text = out.outputs[0].text.strip()
                if out.outputs[0].finish_reason == "length":  # end at the last whole sentence
                    text = text[: max(text.rfind(". "), text.rfind(".\n")) + 1]
                if len(text) >= 600 and not is_repetitive(text):
                    kept.append({**request, "text": text})
            save_atomically(path, kept)
            log.info("wrote %s (%d of %d documents kept)", path, len(kept), len(chunk))
        documents += torch.load(path)
    return documents


def continuation_texts(num: int, seed: int = 0) -> list[tuple[str, str]]:
    """(user message, reply) pairs from documentation passages: the opening sentence as the prompt
    ("Continue this text"), the rest of the passage as the reply."""
    passages = [p for p in doc_passages() if len(sentences([p])) >= 2]
    random.Random(seed).shuffle(passages)
    pairs = []
    for passage in passages[:num]:
        first = sentences([passage])[0]
        rest = passage[passage.index(first) + len(first) :].strip()
        if rest:
            pairs.append((f"Continue this text:\n\n{first}", rest))
    return pairs


@torch.inference_mode()
def forced_data(llm: LLM, data_dir: Path, num_texts: int, shard_size: int, top_k: int, batch_tokens: int = 2048,
                seed: int = 0) -> list[Path]:
    """The target's top-k log-probabilities along replies it did not write (continuation_texts):
    one forward pass per reply instead of one per token, so about ten times cheaper per position
    than generate_data on this CPU; the replies are the documentation's, not the target's."""
    data_dir.mkdir(parents=True, exist_ok=True)
    engine, runner = llm.engine, llm.engine.runner
    pairs = continuation_texts(num_texts, seed)
    paths = []
    for index, first in enumerate(range(0, len(pairs), shard_size)):
        path = data_dir / f"forced-{index:04d}.pt"
        paths.append(path)
        if path.exists():
            continue
        samples = []
        for user, reply in pairs[first : first + shard_size]:
            prompt = engine.encode(engine.apply_chat_template([{"role": "user", "content": user}]))
            room = engine.config.max_model_len - len(prompt)
            reply_ids = engine.tokenizer.encode(reply, add_special_tokens=False)[:room]
            samples.append({"category": "continuation", "greedy": False, "prompt": prompt, "reply": reply_ids})
        # Rows of similar length together, `batch_tokens` padded tokens per forward pass.
        order = sorted(range(len(samples)), key=lambda i: len(samples[i]["prompt"]) + len(samples[i]["reply"]))
        batch: list[int] = []
        with tqdm(total=len(order), desc=f"teacher pass {path.name}", unit="text") as bar:
            for n, i in enumerate(order):
                batch.append(i)
                longest = max(len(samples[j]["prompt"]) + len(samples[j]["reply"]) for j in batch)
                if n + 1 == len(order) or longest * (len(batch) + 1) > batch_tokens:
                    _teacher_pass(runner, [samples[j] for j in batch], top_k)
                    bar.update(len(batch))
                    batch = []
        for s in samples:
            s["prompt"] = torch.tensor(s["prompt"], dtype=torch.int32)
            s["reply"] = torch.tensor(s["reply"], dtype=torch.int32)
        write_shard(path, samples)
    return paths


def _teacher_pass(runner: ModelRunner, samples: list[dict], top_k: int) -> None:
    """Fill each sample's top_ids / top_logprobs: the output before reply token j predicts it."""
    slots = [runner.cache.allocate() for _ in samples]
    try:
        rows = [Row(slot, s["prompt"] + s["reply"][:-1], len(s["reply"])) for slot, s in zip(slots, samples)]
        logits = runner.forward(rows)
    finally:
        for slot in slots:
            runner.cache.free(slot)
    values, ids = torch.log_softmax(logits.float(), dim=-1).topk(top_k, dim=-1)
    sizes = [len(s["reply"]) for s in samples]
    for s, v, i in zip(samples, values.split(sizes), ids.split(sizes)):
        s["top_ids"], s["top_logprobs"] = i.to(torch.int32), v.to(torch.float16)
