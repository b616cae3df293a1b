"""Prompt lookup (n-gram) drafting: no draft model. If the sequence's last n tokens occurred
before, propose the tokens that followed them there. It pays off where replies copy from their
context (summaries, answers from a passage, code edits)."""

import torch

from minedraft.engine.sequence import Sequence
from minedraft.sampling import Dist
from minedraft.spec_decode.base import Proposer
from minedraft.spec_decode.gate import ModelGate


def lookup(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix of
    `tokens` with min_n..max_n tokens; [] when no such suffix occurred before."""
    if len(tokens) < 2:
        return []
    last, stop = tokens[-1], len(tokens) - 1
    longest = min(max_n, stop)
    best_n, best_end, end = min_n - 1, -1, -1
    # Each earlier occurrence of the last token ends a candidate match; list.index finds them at C
    # speed, so a long context with few candidates costs little (this runs every round, per row).
    while True:
        try:
            end = tokens.index(last, end + 1, stop)
        except ValueError:
            break
        n = 1
        while n < min(longest, end + 1) and tokens[end - n] == tokens[-1 - n]:
            n += 1
        if n >= best_n and n >= min_n:  # the longest match, the latest among equals
            best_n, best_end = n, end
    return tokens[best_end + 1 : best_end + 1 + k] if best_end >= 0 else []


class NgramProposer(Proposer):
    def __init__(self, min_n: int, max_n: int, vocab_size: int, dtype: torch.dtype):
        self.min_n, self.max_n, self.vocab_size, self.dtype = min_n, max_n, vocab_size, dtype

    def propose(
        self, seqs: list[Sequence], num_tokens: list[int], generators: list[torch.Generator | None],
        capacity: int | None = None,
    ) -> tuple[list[list[int]], list[Dist | None]]:
        """Drafts (at most num_tokens[i], maybe none) and, for sampled rows, their distributions:
        each draft token was chosen with certainty, so q is one-hot (kept as the token alone), and
        rejection sampling keeps it with probability p(x). `capacity` is not used: certain drafts
        give TETRIS nothing to rank (the config rejects it)."""
        drafts = [lookup(s.prompt_token_ids + s.output_token_ids, self.min_n, self.max_n, k) if k else []
                  for s, k in zip(seqs, num_tokens)]
        return drafts, [Dist(torch.ones(len(d), 1, dtype=self.dtype), torch.tensor(d)[:, None], self.vocab_size)
                        if d and g is not None else None for d, g in zip(drafts, generators)]

    def free_drafts(self, seqs: list[Sequence], k: int) -> list[list[int]]:
        return self.propose(seqs, [k] * len(seqs), [None] * len(seqs))[0]

    def release(self, seq: Sequence) -> None:
        """Nothing to free: the proposer keeps no state per sequence."""


class LookupFirst(Proposer):
    """Prompt lookup in front of a model drafter: a row whose recent tokens occurred before takes
    the lookup's draft (no model pass, microseconds a row; where a reply copies from its prompt
    often kept several tokens at a time), the other rows the model's, or with "auto" draft lengths
    none while the model does not pay (spec_decode/gate.py). The model sees every token a row keeps
    either way (its states through `accept_states`, its tokens when it next drafts), so skipping
    rounds is safe."""

    def __init__(self, model: Proposer, lookup: NgramProposer):
        self.model, self.lookup = model, lookup
        self.aux_layers = model.aux_layers
        self.gate: ModelGate | None = None

    def propose(
        self, seqs: list[Sequence], num_tokens: list[int], generators: list[torch.Generator | None],
        capacity: int | None = None,
    ) -> tuple[list[list[int]], list[Dist | None]]:
        looked, looked_dists = self.lookup.propose(seqs, num_tokens, generators)
        rest = [0 if d else n for d, n in zip(looked, num_tokens)]
        if self.gate is not None:
            self.gate.observe(seqs)
        if not any(rest) or (self.gate is not None and not self.gate.choose(seqs)):
            return looked, looked_dists
        drafts, dists = self.model.propose(seqs, rest, generators, capacity)
        return ([d or m for d, m in zip(looked, drafts)],
                [q if d else p for d, q, p in zip(looked, looked_dists, dists)])

    def adapt(self, on: bool) -> None:
        self.gate = ModelGate() if on else None

    def choices(self) -> dict:
        return {} if self.gate is None else {"model_gate": self.gate.as_dict()}

    def free_drafts(self, seqs: list[Sequence], k: int) -> list[list[int]] | None:
        """The lookup's, while the gate keeps the model off (the model's drafts are not free)."""
        return self.lookup.free_drafts(seqs, k) if self.gate is not None and not self.gate.best() else None

    def prefill(self, seqs: list[Sequence], ends: list[int]) -> None:
        self.model.prefill(seqs, ends)

    def backlog(self, seq: Sequence) -> int:
        return self.model.backlog(seq)

    def accept_states(self, seq: Sequence, start: int, states: torch.Tensor) -> None:
        self.model.accept_states(seq, start, states)

    def release(self, seq: Sequence) -> None:
        self.model.release(seq)

    def free_slots(self) -> int | None:
        return self.model.free_slots()

    def flush(self) -> None:
        self.model.flush()

    def close(self, graceful: bool = True) -> None:
        self.model.close(graceful)
