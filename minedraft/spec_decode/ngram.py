"""Prompt lookup (n-gram) drafting: no draft model. If the sequence's last n tokens occurred
before, propose the tokens that followed them there. It pays off where replies copy from their
context (summaries, answers from a passage, code edits)."""

import torch

from minedraft.spec_decode.base import Proposer
from minedraft.engine.sequence import Sequence
from minedraft.sampling import Dist


def lookup(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix of
    `tokens` with min_n..max_n tokens; [] when no such suffix occurred before."""
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # latest match first
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


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

    def release(self, seq: Sequence) -> None:
        """Nothing to free: the proposer keeps no state per sequence."""
