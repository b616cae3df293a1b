"""Sampling parameters (vLLM's field names), logits processing and token sampling."""

import dataclasses
import math
from dataclasses import dataclass, field

import torch


MAX_LOGPROBS = 20
# Dividing logits by a temperature much below this overflows them (1e-38 already does in float32);
# like vLLM, smaller positive temperatures are raised to it (at 0.01 sampling is all but greedy).
MIN_TEMPERATURE = 1e-2
MAX_SEED = 2**63 - 1  # a request's n completions use seeds seed .. seed + n - 1, all in 0..MAX_SEED


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class SamplingParams:
    """How to sample one request. Greedy when `temperature` is 0."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k
    max_tokens: int = 16
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None  # also return this many most likely tokens' log-probabilities
    stop_strings: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field; ValueError starting with the field's name. The engine calls it again
        on admission, so parameters changed after construction are checked too."""
        def fail(name: str, rule: str) -> None:
            raise ValueError(f"{name} {rule}, got {getattr(self, name)!r}")

        if not _is_int(self.n) or self.n < 1:
            fail("n", "must be an integer >= 1")
        if not _is_number(self.temperature) or self.temperature < 0:
            fail("temperature", "must be a finite number >= 0")
        if 0 < self.temperature < MIN_TEMPERATURE:
            self.temperature = MIN_TEMPERATURE
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            fail("top_p", "must be in (0, 1]")
        if not _is_int(self.top_k) or not (self.top_k == -1 or self.top_k >= 1):
            fail("top_k", "must be -1 (disabled) or an integer >= 1")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            fail("max_tokens", "must be an integer >= 1")
        if not isinstance(self.ignore_eos, bool):
            fail("ignore_eos", "must be true or false")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED - (self.n - 1)):
            fail("seed", f"must be None or an integer in 0..2**63 - n (= {MAX_SEED - (self.n - 1)})")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            fail("logprobs", f"must be None or an integer in 0..{MAX_LOGPROBS}")
        stops = [self.stop] if isinstance(self.stop, str) else [] if self.stop is None else self.stop
        if not isinstance(stops, (list, tuple)) or any(not isinstance(s, str) or not s for s in stops):
            fail("stop", "must be a non-empty string or a list of them")
        self.stop_strings = tuple(stops)
        ids = [] if self.stop_token_ids is None else self.stop_token_ids
        if not isinstance(ids, (list, tuple)) or any(not _is_int(i) or i < 0 for i in ids):
            fail("stop_token_ids", "must be a list of non-negative token ids")
        self.stop_token_ids = list(ids)

    def as_dict(self) -> dict:
        """The constructor's arguments, as plain values (what the drafter process is sent)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probabilities(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The distribution each row samples from: temperature, then top-k, then top-p. Rows: [N, V].

    Greedy rows get a one-hot distribution at the argmax, so callers can treat every row alike.
    """
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    temps = torch.tensor([p.temperature or 1.0 for p in params], dtype=logits.dtype, device=logits.device)
    logits = logits / temps[:, None]
    top_k = [p.top_k for p in params]
    top_p = [p.top_p for p in params]
    if any(k != -1 for k in top_k) or any(p < 1 for p in top_p):
        logits = _truncate(logits, top_k, top_p)
    # Greedy rows are one-hot at the argmax: one batched argmax for all of them (this runs every
    # step), and no softmax at all when every row is greedy.
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if len(greedy) == len(params):
        probs = torch.zeros_like(logits)
    else:
        probs = torch.softmax(logits, dim=-1)
        probs[greedy] = 0
    probs[greedy, logits[greedy].argmax(dim=-1)] = 1
    return probs


def _truncate(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Mask tokens outside each row's top-k, then outside its top-p nucleus (at least one stays)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    k = torch.tensor([vocab if x == -1 else min(x, vocab) for x in top_k], device=logits.device)
    ranks = torch.arange(vocab, device=logits.device)
    drop = ranks[None, :] >= k[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    p = torch.tensor(top_p, dtype=logits.dtype, device=logits.device)
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop = mass_before >= p[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def top_logprobs(logits: torch.Tensor, tokens: list[int], n: int) -> list[dict[int, float]]:
    """Per row: log-probabilities of the chosen token and of the n most likely ones, under the
    model's own distribution (before temperature, top-k and top-p, as vLLM reports them)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    values, ids = logp.topk(n, dim=-1)
    return [{**dict(zip(i.tolist(), v.tolist())), t: float(row[t])}
            for row, i, v, t in zip(logp, ids, values, tokens)]


def sample(probs: torch.Tensor, generators: list[torch.Generator | None]) -> list[int]:
    """One token per row, each row drawing from its own generator; a None generator marks a greedy
    row (its distribution is one-hot: take the argmax without drawing)."""
    best = probs.argmax(dim=-1).tolist() if None in generators else None  # one pass for every greedy row
    return [best[i] if g is None else int(torch.multinomial(row, 1, generator=g))
            for i, (row, g) in enumerate(zip(probs, generators))]


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)
