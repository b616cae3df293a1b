"""Train an EAGLE-3 head for a target (`minedraft train-draft --method eagle3`), resumably.

Data: the target's own replies (training/data.py shards), then one frozen target pass per reply
that records, at every position, the residual stream before the head's three auxiliary layers and
the final normed hidden state (from which the target's distribution over the draft vocabulary is
recomputed at training time). Training follows the paper's "training-time test": the head is
unrolled `ttt_steps` draft steps per position, step j reading its own output of step j - 1 as the
feature, attending to the step-0 entries of earlier positions (what its cache holds at inference)
and to its own entries of steps 1..j at that position. The loss at step j is the cross-entropy
from the target's distribution over the draft vocabulary at the position it predicts.
"""

import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.models.eagle3 import Eagle3Args, Eagle3Head, default_aux_layers, read_eagle3_state, save_eagle3
from minedraft.models.hf_format import ModelArgs
from minedraft.models.llama import Decoder, rope_tables, rotate
from minedraft.models.loader import read_config
from minedraft.training.distill import batches, save_atomically

log = logging.getLogger("minedraft")


@dataclass
class Eagle3TrainConfig:
    ttt_steps: int = 4  # draft steps unrolled per position
    # Loss weight of prompt positions against reply ones (1): the target's distribution along the
    # prompt is as exact a label as along its reply, and prompts hold most of the data's tokens.
    prompt_loss_weight: float = 0.0
    step_decay: float = 0.8  # loss weight of step j: decay ** j
    epochs: int = 20
    batch_tokens: int = 4096  # padded tokens per optimiser step
    lr: float = 1e-3
    warmup_steps: int = 30
    eval_every: int = 50
    checkpoint_minutes: float = 5.0
    autocast_bf16: bool = False
    seed: int = 0


# -- features ----------------------------------------------------------------------------------------


@torch.inference_mode()
def extract_features(runner: ModelRunner, aux_layers: tuple[int, ...], samples: list[dict],
                     batch_tokens: int = 4096) -> None:
    """Add "aux" [T, 3 * hidden] and "final" [T, hidden] (float16) to each sample: the target's
    states along prompt + reply, one teacher-forced pass per batch of samples."""
    order = sorted(range(len(samples)), key=lambda i: len(samples[i]["prompt"]) + len(samples[i]["reply"]))
    batch: list[int] = []
    for n, i in enumerate(order):
        batch.append(i)
        longest = max(len(samples[j]["prompt"]) + len(samples[j]["reply"]) for j in batch)
        fits = longest * (len(batch) + 1) <= batch_tokens and len(batch) < runner.cache.num_free
        if n + 1 < len(order) and fits:
            continue
        slots = [runner.cache.allocate() for _ in batch]
        try:
            tokens = [torch.cat([samples[j]["prompt"], samples[j]["reply"]]).tolist() for j in batch]
            final, aux = runner.hidden_states([Row(s, t) for s, t in zip(slots, tokens)], aux_layers=aux_layers)
        finally:
            for slot in slots:
                runner.cache.free(slot)
        sizes = [len(t) for t in tokens]
        for j, f, a in zip(batch, final.split(sizes), aux.split(sizes)):
            samples[j]["final"], samples[j]["aux"] = f.to(torch.float16), a.to(torch.float16)
        batch = []


def feature_shards(target: Decoder, data_shards: list[Path], out: Path, aux_layers: tuple[int, ...],
                   max_len: int) -> list[Path]:
    """A features file per data shard (written whole or not at all); returns those that exist."""
    out.mkdir(parents=True, exist_ok=True)
    runner = ModelRunner(target, 16, max_len, torch.float32, torch.device("cpu"))
    paths = []
    for shard in tqdm(data_shards, desc="target features", unit="shard"):
        path = out / shard.name
        if not path.exists():
            samples = [{k: s[k] for k in ("category", "greedy", "prompt", "reply")} for s in torch.load(shard)]
            extract_features(runner, aux_layers, samples)
            save_atomically(path, samples)
        paths.append(path)
    return paths


def load_features(paths: list[Path]) -> list[dict]:
    """Every sample of the feature files, memory-mapped: the states stay in the page cache (which
    the kernel can reclaim) rather than in the process, so the data may outgrow the machine's RAM."""
    return [s for path in paths for s in torch.load(path, mmap=True)]


# -- the head and its training-time test ----------------------------------------------------------------


def new_head(target: Decoder, vocab_ids: torch.Tensor, aux_layers: tuple[int, ...], seed: int) -> Eagle3Head:
    """A head the shape of one target layer: random layer weights (std 0.02), the target's final
    norm, and the target's head rows for the draft vocabulary as its head."""
    t = target.args
    layer = ModelArgs(**{**t.__dict__, "num_layers": 1, "draft_vocab_size": len(vocab_ids), "tie_word_embeddings": False,
                         "shared_embedding": False, "qk_norm": False, "qkv_bias": False, "o_bias": False})
    head = Eagle3Head(Eagle3Args(layer, t.hidden_size, aux_layers, norm_before_residual=False))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(target.norm.weight if name == "norm.weight" else torch.ones_like(p))
            elif name == "lm_head.weight":
                p.copy_(target.lm_head.weight[:, vocab_ids])
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        head.draft_to_target.copy_(vocab_ids)
    head.embed = target.input_embedding.detach()
    return head


def head_vocabulary(folder: Path) -> torch.Tensor:
    """The target ids of an exported head's draft vocabulary (from its d2t), in draft order."""
    return read_eagle3_state(folder)["draft_to_target"]


def head_aux_layers(folder: Path | None, target_layers: int) -> tuple[int, ...]:
    """The target layers an exported head reads (the default for the target's depth without one)."""
    if folder is None:
        return default_aux_layers(target_layers)
    return Eagle3Args.from_hf(read_config(folder)).aux_layers(target_layers)


def warm_start(head: Eagle3Head, folder: Path) -> None:
    """Load an exported head's weights (public layout) into a new head of the same shape, in the new
    head's dtype. With another draft vocabulary, the head rows of the tokens both vocabularies hold
    come from the exported head and the others keep the new head's (the target's rows)."""
    state = read_eagle3_state(folder)
    own = head.state_dict()
    old_ids, new_ids = state.pop("draft_to_target"), own["draft_to_target"]
    missing = set(own) - set(state) - {"draft_to_target"}
    if missing or any(state[k].shape != own[k].shape for k in state if k != "lm_head.weight"):
        raise ValueError(f"{folder} does not match the head's shape (missing {sorted(missing)})")
    # The exported head's row of each new draft token (-1: it has none, the target's row stays).
    old_row = torch.full((int(max(old_ids.max(), new_ids.max())) + 1,), -1)
    old_row[old_ids] = torch.arange(len(old_ids))
    source = old_row[new_ids]
    shared = source >= 0
    lm_head = own["lm_head.weight"].clone()  # [hidden, draft vocab]
    lm_head[:, shared] = state["lm_head.weight"][:, source[shared]].to(lm_head.dtype)
    state.update({"lm_head.weight": lm_head, "draft_to_target": new_ids})
    head.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=True)
    log.info("warm start from %s: %d of %d draft tokens' head rows (the rest the target's)", folder,
             int(shared.sum()), len(new_ids))


def ttt_attention(head: Eagle3Head, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  kv: list[tuple[torch.Tensor, torch.Tensor]], pad: torch.Tensor) -> torch.Tensor:
    """Attention of draft step j = len(kv) for every position t of [B, T, 2H] inputs: step 0's keys
    at positions <= t (causal) and steps 1..j's keys at t only. Appends this step's keys to kv."""
    attn = head.attn
    B, T, _ = x.shape
    H, Hkv, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q, k, v = attn.qkv(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
    q = rotate(q.view(B, T, H, D), cos, sin).transpose(1, 2)  # [B, H, T, D]
    k = rotate(k.view(B, T, Hkv, D), cos, sin).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    v = v.view(B, T, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    kv.append((k, v))
    scale = 1 / math.sqrt(D)
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    first = (q @ kv[0][0].transpose(-1, -2)) * scale
    first = first.masked_fill(~causal | pad[:, None, None, :], float("-inf"))
    diagonal = [(q * ki).sum(-1, keepdim=True) * scale for ki, _ in kv[1:]]  # [B, H, T, 1] each
    weights = torch.softmax(torch.cat([first, *diagonal], dim=-1), dim=-1)
    out = weights[..., :T] @ kv[0][1]
    for i, (_, vi) in enumerate(kv[1:]):
        out = out + weights[..., T + i : T + i + 1] * vi
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, H * D))


def collate(batch: list[dict]) -> dict[str, torch.Tensor]:
    T = max(len(s["prompt"]) + len(s["reply"]) for s in batch)
    B = len(batch)
    ids = torch.zeros(B, T, dtype=torch.long)
    aux = torch.zeros(B, T, batch[0]["aux"].shape[-1])
    final = torch.zeros(B, T, batch[0]["final"].shape[-1])
    length = torch.zeros(B, dtype=torch.long)
    prompt = torch.zeros(B, dtype=torch.long)
    for b, s in enumerate(batch):
        n = len(s["prompt"]) + len(s["reply"])
        ids[b, :n] = torch.cat([s["prompt"], s["reply"]]).long()
        aux[b, :n], final[b, :n] = s["aux"].float(), s["final"].float()
        length[b], prompt[b] = n, len(s["prompt"])
    return {"ids": ids, "aux": aux, "final": final, "length": length, "prompt": prompt}


def unroll(head: Eagle3Head, batch: dict[str, torch.Tensor], steps: int, cos: torch.Tensor, sin: torch.Tensor,
           target_head: torch.Tensor):
    """Yield, for each draft step j, (draft logits [B, T-1, draft vocab], the target's logits over the
    draft vocabulary at the positions they predict, the mask of reply positions that exist, the mask
    of all positions that exist).
    Index t of step j: input token t + 1 + j at position t + j (as vLLM places it: beside the
    target's state of position t + j), predicting token t + 2 + j."""
    ids, length, prompt = batch["ids"], batch["length"], batch["prompt"]
    B, T = ids.shape
    t = torch.arange(T - 1)
    feature = head.features(batch["aux"][:, :-1])
    kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    pad = t[None, :] + 1 >= length[:, None]  # step-0 entries past a row's end
    with torch.no_grad():
        teachers = batch["final"] @ target_head
    for j in range(steps):
        pos = (t + 1 + j).clamp_max(T - 1)
        tokens = ids[:, pos]
        normed, feature = head.layer(head.embed[tokens], feature,
                                     lambda x: ttt_attention(head, x, cos[pos - 1][:, None], sin[pos - 1][:, None], kv, pad))
        teacher = teachers[:, pos]
        inside = t[None, :] + 1 + j < length[:, None]
        yield head.compute_logits(normed), teacher, inside & (t[None, :] + 1 + j >= prompt[:, None] - 1), inside


class Trainer:
    """Owns the head, its optimiser and the position in the data; checkpoints all three."""

    def __init__(self, target: Decoder, work: Path, config: Eagle3TrainConfig, aux_layers: tuple[int, ...],
                 vocab_ids: torch.Tensor, init_from: Path | None = None):
        """`init_from`: an exported head to start from (ignored once a checkpoint exists)."""
        self.config, self.work = config, work
        self.head = new_head(target, vocab_ids, aux_layers, config.seed)
        self.aux_layers = aux_layers
        self.target_head = target.lm_head.weight.detach()[:, vocab_ids].float()  # [hidden, draft vocab]
        self.full_head = target.lm_head.weight.detach().float()
        self.cos, self.sin = rope_tables(target.args, target.args.max_position_embeddings, torch.float32)
        params = [p for p in self.head.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
        self.step, self.epoch, self.batch_in_epoch, self.seconds = 0, 0, 0, 0.0
        self.best = -1.0
        self.checkpoint = work / "checkpoint.pt"
        if self.checkpoint.exists():
            state = torch.load(self.checkpoint)
            if not torch.equal(state["vocab_ids"], vocab_ids):
                raise ValueError(f"{self.checkpoint} was trained with another draft vocabulary")
            self.head.load_state_dict(state["head"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
            self.seconds, self.best = state["seconds"], state["best"]
            log.info("resumed at step %d (epoch %d, %.1f min)", self.step, self.epoch, self.seconds / 60)
        elif init_from is not None:
            warm_start(self.head, init_from)

    def save(self) -> None:
        save_atomically(self.checkpoint, {
            "head": self.head.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
            "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "seconds": self.seconds, "best": self.best,
            "vocab_ids": self.head.draft_to_target.clone(), "config": asdict(self.config)})

    def lr(self) -> float:
        c = self.config
        return c.lr * min(1.0, (self.step + 1) / c.warmup_steps)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        total, weight = 0.0, 0.0
        for j, (logits, teacher, reply, inside) in enumerate(unroll(self.head, batch, self.config.ttt_steps, self.cos,
                                                                    self.sin, self.target_head)):
            weights = reply.float() + self.config.prompt_loss_weight * (inside & ~reply).float()
            mask = weights > 0
            if not mask.any():
                break
            p = torch.softmax(teacher[mask], dim=-1)
            ce = -(p * F.log_softmax(logits[mask].float(), dim=-1)).sum(-1)
            ce = (ce * weights[mask]).sum() / weights[mask].sum()
            total = total + self.config.step_decay ** j * ce
            weight += self.config.step_decay ** j
        return total / max(weight, 1e-9)

    def train_step(self, batch: dict[str, torch.Tensor]) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.config.autocast_bf16):
            loss = self.loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
        self.optimizer.step()
        self.step += 1
        return float(loss.detach())

    @torch.no_grad()
    def evaluate(self, held_out: list[dict], k: int = 4) -> dict:
        """Greedy acceptance simulated on held-out greedy replies, teacher-forced (an accepted
        draft equals the reply token, so the inputs are exact): per draft position, the share kept
        of those whose earlier drafts were all kept, and the mean acceptance length (tokens per
        verification, bonus included) at k drafts."""
        kept = torch.zeros(k)  # [j]: positions whose first j + 1 drafts were all kept
        reached = torch.zeros(k)  # [j]: positions whose first j drafts were all kept
        for batch in batches([s for s in held_out if s["greedy"]], self.config.batch_tokens, random.Random(0)):
            b = collate(batch)
            T = b["ids"].shape[1]
            alive = None
            top = (b["final"] @ self.full_head).argmax(-1)  # the target's greedy token after each position
            for j, (logits, _, mask, _) in enumerate(unroll(self.head, b, k, self.cos, self.sin, self.target_head)):
                target_top = top[:, (torch.arange(T - 1) + 1 + j).clamp_max(T - 1)]
                if alive is None:  # reply positions where all k drafts fit
                    alive = mask & (torch.arange(T - 1)[None, :] + k < b["length"][:, None])
                reached[j] += alive.sum()
                alive = alive & (self.head.draft_to_target[logits.argmax(-1)] == target_top)
                kept[j] += alive.sum()
        n = int(reached[0])
        per_position = (kept / reached.clamp_min(1)).tolist()
        return {"acceptance_by_position": [round(x, 4) for x in per_position],
                "mean_acceptance_length": 1 + float(kept.sum()) / max(n, 1), "positions": n}

    def train(self, samples: list[dict], held_out: list[dict], export: Path, max_minutes: float | None = None) -> None:
        c = self.config
        log_path = self.work / "log.jsonl"
        last_save = time.time()
        stop_at = None if max_minutes is None else time.time() + 60 * max_minutes
        if self.step == 0:
            self._log(log_path, held_out, export, None)
        while self.epoch < c.epochs:
            plan = batches(samples, c.batch_tokens, random.Random(c.seed + self.epoch))
            bar = tqdm(plan, desc=f"eagle3 epoch {self.epoch + 1}/{c.epochs}", unit="batch", initial=self.batch_in_epoch)
            for batch in plan[self.batch_in_epoch :]:
                start = time.time()
                loss = self.train_step(collate(batch))
                self.seconds += time.time() - start
                self.batch_in_epoch += 1
                bar.update()
                bar.set_postfix(loss=f"{loss:.3f}")
                if self.step % c.eval_every == 0:
                    self._log(log_path, held_out, export, loss)
                if time.time() - last_save > 60 * c.checkpoint_minutes:
                    self.save()
                    last_save = time.time()
                if stop_at is not None and time.time() > stop_at:
                    self.save()
                    bar.close()
                    return
            bar.close()
            self.epoch += 1
            self.batch_in_epoch = 0
            self.save()
        self._log(log_path, held_out, export, None)
        self.save()

    def _log(self, log_path: Path, held_out: list[dict], export: Path, loss: float | None) -> None:
        metrics = self.evaluate(held_out)
        row = {"step": self.step, "epoch": self.epoch, "train_minutes": round(self.seconds / 60, 2),
               "train_loss": loss, **metrics}
        with log_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        log.info("eagle3 %s", row)
        if metrics["mean_acceptance_length"] > self.best:  # export whenever held-out acceptance improves
            self.best = metrics["mean_acceptance_length"]
            save_eagle3(self.head, export, self.aux_layers, extra={"step": self.step, **metrics})


def plot_curve(log_path: Path, png: Path) -> None:
    """Held-out acceptance (first draft position, and mean acceptance length at k = 4) against
    training minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in log_path.read_text().splitlines()]
    minutes = [r["train_minutes"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(minutes, [r["acceptance_by_position"][0] for r in rows], marker="o")
    ax1.set(xlabel="training minutes (CPU)", ylabel="held-out first-draft acceptance (greedy)")
    ax2.plot(minutes, [r["mean_acceptance_length"] for r in rows], marker="o")
    ax2.set(xlabel="training minutes (CPU)", ylabel="held-out mean acceptance length, k = 4")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
