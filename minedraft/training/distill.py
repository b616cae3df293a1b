"""Distil a small drafter from its target: a few of the target's layers at full width, the
target's frozen input embedding, and a head over the most frequent tokens only.

The student is trained with transformers' Llama (autograd, causal masks, padding) and exported as
a checkpoint our own decoder loads: the tensors the drafter owns, stored in float16, plus the ids of
its vocabulary. The loss is the cross-entropy from the target's top-k distribution (recorded with
the data) to the student's, at every reply position: forward KL up to the target's entropy.
"""

import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from tqdm import tqdm

from minedraft.models.draft_format import draft_checkpoint, draft_vocab
from minedraft.models.loader import read_config, read_safetensors

log = logging.getLogger("minedraft")


@dataclass
class TrainConfig:
    init_layers: tuple[int, ...] = (0, 1, 2, 3)  # target layers the student starts from
    init_from: str | None = None  # or a drafter folder this recipe exported: its weights and vocabulary
    autocast_bf16: bool = False  # train steps under bfloat16 autocast (about 1.8x faster on an AMX CPU)
    vocab_size: int = 8192  # draft head: this many most frequent reply tokens
    epochs: int = 3
    batch_tokens: int = 4096  # padded tokens per optimiser step
    lr: float = 3e-4
    warmup_steps: int = 50
    eval_every: int = 100
    seed: int = 0


class Student(nn.Module):
    """Llama layers over the target's frozen embedding, with a reduced-vocabulary head."""

    def __init__(self, target_dir: Path, init_layers: tuple[int, ...], vocab_ids: torch.Tensor):
        super().__init__()
        from transformers import LlamaConfig, LlamaModel

        cfg = read_config(target_dir)
        self.target_config = cfg
        self.init_layers = tuple(init_layers)
        config = LlamaConfig(**{**cfg, "num_hidden_layers": len(init_layers), "tie_word_embeddings": False})
        config._attn_implementation = "sdpa"
        self.body = LlamaModel(config)
        weights = read_safetensors(target_dir)
        state = {"embed_tokens.weight": weights["model.embed_tokens.weight"],
                 "norm.weight": weights["model.norm.weight"]}
        for i, src in enumerate(init_layers):
            prefix = f"model.layers.{src}."
            state.update({f"layers.{i}.{k[len(prefix):]}": v for k, v in weights.items() if k.startswith(prefix)})
        self.body.load_state_dict(state, strict=True)
        self.body.embed_tokens.weight.requires_grad_(False)
        self.register_buffer("vocab_ids", vocab_ids.long())
        self.head = nn.Linear(cfg["hidden_size"], len(vocab_ids), bias=False)
        with torch.no_grad():  # the target's tied head, restricted to the draft vocabulary
            self.head.weight.copy_(weights["model.embed_tokens.weight"][vocab_ids])

    def load_drafter(self, folder: Path) -> None:
        """Continue from a drafter this recipe exported (same layer count and vocabulary)."""
        tensors = read_safetensors(folder)
        if not torch.equal(draft_vocab(tensors), self.vocab_ids):
            raise ValueError(f"drafter {str(folder)!r} has another draft vocabulary")
        state = {k[len("model."):]: v.float() for k, v in tensors.items() if k.startswith("model.")}
        state["embed_tokens.weight"] = self.body.embed_tokens.weight
        try:
            self.body.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise ValueError(f"drafter {str(folder)!r} does not fit --init-layers: {e}") from None
        with torch.no_grad():
            self.head.weight.copy_(tensors["lm_head.weight"].float())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def export(self, out: Path, extra: dict) -> Path:
        """Write a checkpoint `minedraft.models.loader.load_model` reads (with the target's embedding)."""
        out.mkdir(parents=True, exist_ok=True)
        tensors = {f"model.{k}": v.detach().to(torch.float16).contiguous()
                   for k, v in self.body.state_dict().items() if k != "embed_tokens.weight"}
        tensors["lm_head.weight"] = self.head.weight.detach().to(torch.float16).contiguous()
        config, tensors = draft_checkpoint(self.target_config, len(self.init_layers), tensors, self.vocab_ids,
                                           {"init_layers": list(self.init_layers), **extra})
        save_file(tensors, out / "model.safetensors")
        config.update(torch_dtype="float16", dtype="float16")
        (out / "config.json").write_text(json.dumps(config, indent=2))
        return out


def load_samples(shards: list[Path]) -> list[dict]:
    return [s for path in shards for s in torch.load(path)]


def split(samples: list[dict], every: int = 32) -> tuple[list[dict], list[dict]]:
    """(train, held-out): every `every`-th sample is held out, the same ones on every run."""
    return ([s for i, s in enumerate(samples) if i % every], [s for i, s in enumerate(samples) if i % every == 0])


def reply_token_counts(samples: list[dict], vocab_size: int) -> torch.Tensor:
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in samples:
        counts.index_add_(0, s["reply"].long(), torch.ones(len(s["reply"]), dtype=torch.long))
    return counts


def frequent_tokens(samples: list[dict], vocab_size: int, size: int, always: set[int]) -> tuple[torch.Tensor, float]:
    """The `size` most frequent reply tokens (`always` included, e.g. end-of-sequence ids), sorted,
    and the share of reply tokens they cover."""
    counts = reply_token_counts(samples, vocab_size)
    score = counts.clone()
    score[list(always)] = counts.sum() + 1
    ids = score.topk(size).indices.sort().values
    return ids, float(counts[ids].sum()) / max(1, int(counts.sum()))


def batches(samples: list[dict], batch_tokens: int, rng: random.Random) -> list[list[dict]]:
    """Length-sorted batches (little padding) in random order."""
    order = sorted(samples, key=lambda s: len(s["prompt"]) + len(s["reply"]))
    out, batch, longest = [], [], 0
    for s in order:
        n = len(s["prompt"]) + len(s["reply"])
        if batch and max(longest, n) * (len(batch) + 1) > batch_tokens:
            out.append(batch)
            batch, longest = [], 0
        batch.append(s)
        longest = max(longest, n)
    if batch:
        out.append(batch)
    rng.shuffle(out)
    return out


def collate(batch: list[dict], to_draft: torch.Tensor) -> dict[str, torch.Tensor]:
    """Padded inputs and, for every reply position, where its prediction sits and its teacher."""
    T = max(len(s["prompt"]) + len(s["reply"]) for s in batch)
    ids = torch.zeros(len(batch), T, dtype=torch.long)
    mask = torch.zeros(len(batch), T, dtype=torch.long)
    rows, cols, top_ids, top_lp = [], [], [], []
    for b, s in enumerate(batch):
        seq = torch.cat([s["prompt"], s["reply"]]).long()
        ids[b, : len(seq)], mask[b, : len(seq)] = seq, 1
        n, p = len(s["reply"]), len(s["prompt"])
        rows.append(torch.full((n,), b))
        cols.append(torch.arange(p - 1, p - 1 + n))  # the output at p-1+j predicts reply token j
        top_ids.append(s["top_ids"].long())
        top_lp.append(s["top_logprobs"].float())
    top_ids, top_lp = torch.cat(top_ids), torch.cat(top_lp)
    draft_ids = to_draft[top_ids]
    top_lp = top_lp.masked_fill(draft_ids < 0, float("-inf"))  # teacher mass the head cannot express
    return {"input_ids": ids, "attention_mask": mask, "rows": torch.cat(rows), "cols": torch.cat(cols),
            "draft_ids": draft_ids.clamp_min(0), "teacher": torch.softmax(top_lp, dim=-1),
            "target_top1": top_ids[:, 0]}


def loss_and_agreement(student: Student, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft cross-entropy per position, and whether the student's argmax is the target's."""
    hidden = student(batch["input_ids"], batch["attention_mask"])[batch["rows"], batch["cols"]]
    logp = F.log_softmax(student.head(hidden).float(), dim=-1)
    teacher = batch["teacher"].nan_to_num(0.0)  # rows whose whole top-k is outside the head
    loss = -(teacher * logp.gather(1, batch["draft_ids"])).sum(-1)
    agree = student.vocab_ids[logp.argmax(-1)] == batch["target_top1"]
    return loss, agree


def kind(sample: dict) -> str:
    """How a reply was made: the target's greedy or sampled reply, or forced text (data.forced_data)."""
    if sample["category"] == "continuation":
        return "forced"
    return "greedy" if sample["greedy"] else "sampled"


@torch.no_grad()
def evaluate(student: Student, held_out: list[dict], to_draft: torch.Tensor, batch_tokens: int) -> dict:
    """Loss and top-1 agreement with the target on held-out replies, by how they were made."""
    student.eval()
    out = {}
    for name in ("greedy", "sampled", "forced"):
        part = [s for s in held_out if kind(s) == name and len(s["reply"])]
        losses, agrees = [], []
        for batch in batches(part, batch_tokens, random.Random(0)):
            loss, agree = loss_and_agreement(student, collate(batch, to_draft))
            losses.append(loss)
            agrees.append(agree)
        if losses:
            out[f"{name}_loss"] = float(torch.cat(losses).mean())
            out[f"{name}_agreement"] = float(torch.cat(agrees).float().mean())
    student.train()
    return out


def train(target_dir: Path, shards: list[Path], work: Path, config: TrainConfig, always: set[int]) -> Student:
    """Train (resuming from work/checkpoint.pt if present); logs to work/log.jsonl."""
    torch.manual_seed(config.seed)
    train_set, held_out = split(load_samples(shards))
    vocab_size = read_config(target_dir)["vocab_size"]
    vocab_ids, coverage = choose_vocabulary(train_set, vocab_size, config, always)
    log.info("%d training replies, %d held out; draft vocabulary of %d covers %.2f%% of reply tokens",
             len(train_set), len(held_out), len(vocab_ids), 100 * coverage)
    to_draft = torch.full((vocab_size,), -1, dtype=torch.long)
    to_draft[vocab_ids] = torch.arange(len(vocab_ids))
    student = Student(target_dir, config.init_layers, vocab_ids)
    if config.init_from:
        student.load_drafter(Path(config.init_from))
    params = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    rng = random.Random(config.seed)
    plan = [b for _ in range(config.epochs) for b in batches(train_set, config.batch_tokens, rng)]
    total = len(plan)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(config.warmup_steps, total))
    ckpt, log_path = work / "checkpoint.pt", work / "log.jsonl"
    work.mkdir(parents=True, exist_ok=True)
    if ckpt.exists():
        step, elapsed = resume(ckpt, config, student, optimizer, scheduler)
        log.info("resumed at step %d of %d", step, total)
    else:
        step, elapsed = 0, 0.0
        append_record(log_path, {"step": 0, "time_s": 0.0, "coverage": coverage,
                                 **evaluate(student, held_out, to_draft, config.batch_tokens)})
    started, seen_tokens, losses = time.time(), 0, []
    student.train()
    with tqdm(total=total, initial=step, desc="distilling", unit="step") as bar:
        while step < total:
            batch = collate(plan[step], to_draft)
            losses.append(train_step(student, batch, params, optimizer, scheduler, config.autocast_bf16))
            step += 1
            seen_tokens += int(batch["attention_mask"].sum())
            bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{seen_tokens / (time.time() - started):.0f}")
            bar.update()
            if step % config.eval_every == 0 or step == total:
                record = {"step": step, "time_s": elapsed + time.time() - started,
                          "train_loss": sum(losses) / len(losses),
                          **evaluate(student, held_out, to_draft, config.batch_tokens)}
                losses = []
                append_record(log_path, record)
                save_atomically(ckpt, {"student": student.state_dict(), "optimizer": optimizer.state_dict(),
                                       "scheduler": scheduler.state_dict(), "step": step,
                                       "elapsed_s": record["time_s"], "config": asdict(config)})
                log.info("step %d: %s", step, record)
    return student


def choose_vocabulary(train_set: list[dict], vocab_size: int, config: TrainConfig,
                      always: set[int]) -> tuple[torch.Tensor, float]:
    """The draft vocabulary (the drafter's own when continuing from one, else the most frequent
    reply tokens) and the share of reply tokens it covers."""
    if not config.init_from:
        return frequent_tokens(train_set, vocab_size, config.vocab_size, always)
    vocab_ids = draft_vocab(read_safetensors(Path(config.init_from)))
    counts = reply_token_counts(train_set, vocab_size)
    return vocab_ids, float(counts[vocab_ids].sum()) / max(1, int(counts.sum()))


def warmup_cosine(warmup_steps: int, total: int) -> Callable[[int], float]:
    """The learning-rate factor at a step: a linear warm-up times a cosine decay to zero."""
    return lambda step: min(1.0, (step + 1) / warmup_steps) * 0.5 * (1 + math.cos(math.pi * step / total))


def resume(ckpt: Path, config: TrainConfig, student: Student, optimizer: torch.optim.Optimizer,
           scheduler: torch.optim.lr_scheduler.LRScheduler) -> tuple[int, float]:
    """Load a run's state from `ckpt`; its step and training seconds so far."""
    state = torch.load(ckpt, weights_only=False)
    if state["config"] != asdict(config):
        raise ValueError(f"{ckpt} was made with a different training config; remove it to start over")
    student.load_state_dict(state["student"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return state["step"], state["elapsed_s"]


def train_step(student: Student, batch: dict[str, torch.Tensor], params: list[nn.Parameter],
               optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
               autocast_bf16: bool) -> float:
    """One optimiser step on one batch; its mean loss."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_bf16):
        loss, _ = loss_and_agreement(student, batch)
    loss = loss.mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    scheduler.step()
    return loss.item()


def append_record(log_path: Path, record: dict) -> None:
    with log_path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def save_atomically(path: Path, state: object) -> None:
    """Write to a temporary file first: an interrupted save leaves the previous file whole, or none."""
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.rename(path)
