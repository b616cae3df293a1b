"""Sampling parameters (vLLM's field names), logits processing and token sampling."""

import dataclasses
import math
from dataclasses import dataclass, field

import torch
from torch import nn


MAX_LOGPROBS = 20
# Dividing logits by a temperature much below this overflows them (1e-38 already does in float32);
# like vLLM, smaller positive temperatures are raised to it (at 0.01 sampling is all but greedy).
MIN_TEMPERATURE = 1e-2
MAX_SEED = 2**63 - 1  # a request's n completions use seeds seed .. seed + n - 1, all in 0..MAX_SEED
# Top-p without top-k looks for its nucleus among this many most likely tokens first (SmolLM2 at
# temperature 1: top-p 0.9 leaves 13 tokens at the median, more than 1024 at 1.5% of positions).
NUCLEUS_WIDTH = 1024


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


@dataclass
class Dist:
    """Rows of token distributions over a vocabulary of `vocab` tokens, kept compact. With `ids`
    None, probs [N, vocab] are the distributions themselves; otherwise row i gives probs[i, j] to
    token ids[j] (ids [S]: one support for every row, a drafter's reduced vocabulary) or to
    ids[i, j] (ids [N, S]: each row's own, what top-k / top-p leave; padding has probability 0)."""

    probs: torch.Tensor
    ids: torch.Tensor | None
    vocab: int

    def __len__(self) -> int:
        return len(self.probs)

    def __getitem__(self, rows: slice) -> "Dist":
        return Dist(self.probs[rows], self.ids if self._shared else self.ids[rows], self.vocab)

    @property
    def _shared(self) -> bool:
        return self.ids is None or self.ids.dim() == 1

    def _support(self, i: int) -> torch.Tensor | None:
        return self.ids if self._shared else self.ids[i]

    def prob(self, i: int, token: int) -> torch.Tensor:
        """Row i's probability of `token`."""
        ids = self._support(i)
        return self.probs[i, token] if ids is None else self.probs[i][ids == token].sum()

    def dense(self, i: int) -> torch.Tensor:
        """Row i over the whole vocabulary, [vocab] (scattered: for the few callers that need it)."""
        ids = self._support(i)
        return self.probs[i] if ids is None else self.probs.new_zeros(self.vocab).index_add_(0, ids, self.probs[i])

    def sample(self, i: int, generator: torch.Generator) -> int:
        """A token drawn from row i with `generator`."""
        j = int(torch.multinomial(self.probs[i], 1, generator=generator))
        ids = self._support(i)
        return j if ids is None else int(ids[j])

    def onto(self, ids: torch.Tensor, vocab: int) -> "Dist":
        """The same rows with token j read as token ids[j] of a `vocab`-token vocabulary (a
        drafter's reduced vocabulary mapped onto its target's)."""
        return Dist(self.probs, ids if self.ids is None else ids[self.ids], vocab)

    @staticmethod
    def cat(parts: list["Dist"]) -> "Dist":
        """The rows of `parts` in order. A support they all share stays shared; otherwise every
        row gets its own, padded to the widest."""
        first = parts[0]
        if first._shared and all(p.ids is first.ids for p in parts):
            return Dist(torch.cat([p.probs for p in parts]), first.ids, first.vocab)
        width = max(p.probs.shape[-1] for p in parts)
        ids = [(torch.arange(p.vocab, device=p.probs.device) if p.ids is None else p.ids).expand(len(p), -1)
               for p in parts]
        pad = [(0, width - p.probs.shape[-1]) for p in parts]
        return Dist(torch.cat([nn.functional.pad(p.probs, w) for p, w in zip(parts, pad)]),
                    torch.cat([nn.functional.pad(i, w) for i, w in zip(ids, pad)]), first.vocab)


def probabilities(logits: torch.Tensor, params: list[SamplingParams]) -> Dist:
    """The distribution each row samples from: temperature, then top-k, then top-p. Every row's
    request samples (a greedy one takes the argmax of its logits; see `sample`). Rows with top-k or
    top-p keep only their survivors (compact); a batch with a row that has neither stays dense."""
    dtype = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
    vocab = logits.shape[-1]
    temps = torch.tensor([p.temperature for p in params], dtype=dtype, device=logits.device)[:, None]
    cut = [i for i, p in enumerate(params) if p.top_p < 1 or 0 < p.top_k < vocab]
    if len(cut) == len(params):  # every row truncates: compact rows
        return _truncate(logits, temps, params)
    scaled = logits / temps if any(p.temperature != 1 for p in params) else logits
    probs = torch.softmax(scaled, dim=-1, dtype=dtype)
    if cut:
        part = _truncate(logits[cut], temps[cut], [params[i] for i in cut])
        probs[cut] = probs.new_zeros(len(cut), vocab).scatter_add_(-1, part.ids, part.probs)
    return Dist(probs, None, vocab)


def _truncate(logits: torch.Tensor, temps: torch.Tensor, params: list[SamplingParams]) -> Dist:
    """Each row's top-k, then its top-p nucleus, as compact rows of the survivors, most likely first.
    `topk` finds them (sorted). A row with top-p alone is normalised over the whole vocabulary and
    its nucleus looked for among its NUCLEUS_WIDTH most likely tokens first, then 8 times as many
    while those hold less than top-p of the row's mass (the last step: the whole vocabulary)."""
    vocab, device = logits.shape[-1], logits.device
    top_k = torch.tensor([vocab if p.top_k == -1 else min(p.top_k, vocab) for p in params], device=device)[:, None]
    # math.inf: a row without top-p keeps every token, whatever the rounding of its running mass.
    top_p = torch.tensor([p.top_p if p.top_p < 1 else math.inf for p in params], dtype=temps.dtype, device=device)
    alone = top_k[:, 0] == vocab  # top-p without top-k
    log_norm = (logits[alone] / temps[alone]).logsumexp(dim=-1, keepdim=True)
    width = int(top_k.masked_fill(alone[:, None], min(NUCLEUS_WIDTH, vocab)).max())
    while True:
        values, ids = logits.topk(width, dim=-1)
        values = (values / temps).masked_fill_(torch.arange(width, device=device) >= top_k, float("-inf"))
        norm = values.logsumexp(dim=-1, keepdim=True)
        norm[alone] = log_norm
        probs = (values - norm).exp()
        mass = probs.cumsum(dim=-1)
        if width == vocab or bool((mass[alone, -1] >= top_p[alone]).all()):
            break
        width = min(8 * width, vocab)  # a flatter row's nucleus is wider
    # Out: tokens whose more likely predecessors already reach top_p (never the first: 0 before it).
    probs = probs.masked_fill_(mass - probs >= top_p[:, None], 0)
    probs /= probs.sum(dim=-1, keepdim=True)
    keep = int((probs > 0).sum(dim=-1).max())  # each row's survivors come first
    return Dist(probs[:, :keep], ids[:, :keep], vocab)


def top_logprobs(logits: torch.Tensor, tokens: list[int], n: int) -> list[dict[int, float]]:
    """Per row: log-probabilities of the chosen token and of the n most likely ones, under the
    model's own distribution (before temperature, top-k and top-p, as vLLM reports them)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    values, ids = logp.topk(n, dim=-1)
    return [{**dict(zip(i.tolist(), v.tolist())), t: float(row[t])}
            for row, i, v, t in zip(logp, ids, values, tokens)]


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> tuple[list[int], Dist | None]:
    """One token per row: the argmax where the generator is None (a greedy row: no distribution is
    built for it), else a draw from the row's distribution with its generator. Second: the
    distributions of the rows that drew, in order (None when every row is greedy)."""
    drawn = [i for i, g in enumerate(generators) if g is not None]
    tokens = logits.argmax(dim=-1).tolist() if len(drawn) < len(generators) else [0] * len(generators)
    if not drawn:
        return tokens, None
    dist = probabilities(logits if len(drawn) == len(logits) else logits[drawn], [params[i] for i in drawn])
    for j, i in enumerate(drawn):
        tokens[i] = dist.sample(j, generators[i])
    return tokens, dist


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)
