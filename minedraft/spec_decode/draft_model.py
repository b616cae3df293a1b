"""Draft tokens from a draft model that keeps its own KV slot per sequence."""

import torch

from minedraft.spec_decode.base import SlotProposer
from minedraft.spec_decode.chain import draft_chain
from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.engine.sequence import Sequence
from minedraft.models.llama import Decoder
from minedraft.sampling import Dist


def _kept_tokens(seq: Sequence, view: tuple[int, list[int]] | None) -> int:
    """How many tokens of a drafter's view of `seq` are still the sequence's tokens. The view is
    (tokens it had seen, drafts it made after them); None when it has not seen `seq`."""
    if view is None:
        return 0
    base, drafts = view
    actual = seq.tokens_from(base)
    kept = 0
    while kept < min(len(drafts), len(actual)) and drafts[kept] == actual[kept]:
        kept += 1
    return base + kept


class DraftModelProposer(SlotProposer):
    """Proposes tokens by sampling a draft model autoregressively.

    Each sequence gets a drafter KV slot on first use (keyed by its seq_id). Each round the drafter
    keeps the KV entries of tokens that are still the sequence's (its accepted drafts included) and
    catches up on the rest: the prompt on the first call, then normally one token, or two when all
    drafts were accepted (the last draft was never fed to it).
    """

    def __init__(self, model: Decoder, num_slots: int, max_len: int, dtype: torch.dtype, device: torch.device,
                 compile_sizes: tuple[int, ...] = (), cuda_graphs: bool = False):
        self.runner = ModelRunner(model, num_slots, max_len, dtype, device, compile_sizes, cuda_graphs)
        self.runner.warm_up("compiling the drafter")
        # A reduced head scores its own tokens: their ids in the target's vocabulary, and its size.
        self.vocab = None if model.draft_vocab is None else (model.draft_vocab, model.args.vocab_size)
        self.slots: dict[int, int] = {}
        self.views: dict[int, tuple[int, list[int]]] = {}

    def propose(
        self, seqs: list[Sequence], num_tokens: list[int], generators: list[torch.Generator | None],
        capacity: int | None = None,
    ) -> tuple[list[list[int]], list[Dist | None]]:
        cache = self.runner.cache
        active = [i for i, n in enumerate(num_tokens) if n > 0]
        for i in active:
            seq = seqs[i]
            # Drop KV entries of drafts the target rejected since the last round. The last token is
            # always fed again (its logits start the drafts), even where the target chose a draft
            # TETRIS had not sent for verification.
            cache.truncate(self.slot(seq), min(self._valid(seq), len(seq) - 1))
        pending = {i: seqs[i].tokens_from(cache.lengths[self.slots[seqs[i].seq_id]]) for i in active}
        # Long catch-ups (prompts) run on their own, so short rows are not padded to a prompt's length.
        long = [i for i in active if len(pending[i]) > 2]
        if long:
            self.runner.forward([Row(self.slots[seqs[i].seq_id], pending[i][:-1]) for i in long])
            for i in long:
                pending[i] = pending[i][-1:]
        fed: dict[int, list[int]] = {i: [] for i in active}  # drafts fed back: their KV entries exist

        def step(rows: list[int], last: list[int] | None) -> torch.Tensor:
            if last is not None:
                for i, token in zip(rows, last):
                    fed[i].append(token)
            tokens = [pending[i] for i in rows] if last is None else [[t] for t in last]
            return self.runner.forward([Row(self.slots[seqs[i].seq_id], t) for i, t in zip(rows, tokens)])

        drafts, dists = draft_chain(step, [s.params for s in seqs], generators, num_tokens, capacity, self.vocab)
        for i in active:
            # Every fed draft, TETRIS's dropped ones too: their KV entries stay valid where the
            # target happens to produce the same tokens (_kept_tokens compares them).
            self.views[seqs[i].seq_id] = (len(seqs[i]), fed[i])
        return drafts, dists

    def backlog(self, seq: Sequence) -> int:
        return max(len(seq) - self._valid(seq), 0) if seq.seq_id in self.slots else len(seq)

    def prefill(self, seqs: list[Sequence], ends: list[int]) -> None:
        cache, rows = self.runner.cache, []
        for seq, end in zip(seqs, ends):
            slot, valid = self.slot(seq), self._valid(seq)  # a sequence drafted for before may hold rejected drafts
            cache.truncate(slot, valid)
            if end > valid:
                rows.append(Row(slot, seq.tokens_from(valid)[: end - valid]))
            self.views[seq.seq_id] = (end, [])
        if rows:
            self.runner.hidden_states(rows)

    def _valid(self, seq: Sequence) -> int:
        """The leading entries of the sequence's slot that are still its tokens."""
        return min(self.runner.cache.lengths[self.slots[seq.seq_id]], _kept_tokens(seq, self.views.get(seq.seq_id)))

    def forget(self, seq_id: int) -> None:
        self.views.pop(seq_id, None)
