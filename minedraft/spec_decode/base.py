"""The proposer protocol: what the engine asks of every drafter, in its process or another."""

from dataclasses import dataclass

import torch

from minedraft.engine.model_runner import ModelRunner
from minedraft.engine.sequence import Sequence
from minedraft.sampling import Dist


@dataclass
class Prefilled:
    """A prompt the drafter's copy of the target prefilled ("prefill_on_drafter"): its KV entries
    [layers, kv heads, tokens, head dim] and the logits of its last token [1, vocab]."""

    seq_id: int
    keys: torch.Tensor
    values: torch.Tensor
    logits: torch.Tensor


class Proposer:
    """Drafts tokens for sequences; keeps whatever per-sequence state it needs, keyed by seq_id."""

    # Target layers whose input states the proposer reads (an EAGLE-3 head); the engine then hands
    # it those states for every token a sequence keeps, through `accept_states`.
    aux_layers: tuple[int, ...] = ()

    def propose(
        self, seqs: list[Sequence], num_tokens: list[int], generators: list[torch.Generator | None],
        capacity: int | None = None,
    ) -> tuple[list[list[int]], list[Dist | None]]:
        """Drafts per sequence (at most num_tokens[i]) and the distributions they were drawn from
        (len(drafts) rows; None for a greedy row, whose generator is None, or without drafts).
        With a `capacity` (TETRIS), only that many drafts in all are kept."""
        raise NotImplementedError

    def prefill(self, seqs: list[Sequence], ends: list[int]) -> None:
        """The first ends[i] tokens of seqs[i] (its prompt, chunk by chunk as the target prefills
        it) are final: a drafter with a cache of its own may prefill them now, so that a request's
        first draft costs what a later one does."""

    def backlog(self, seq: Sequence) -> int:
        """Tokens of `seq` it holds but has not run its model over yet (what its next draft for the
        sequence, or a prefill, must catch up on first)."""
        return 0

    def accept_states(self, seq: Sequence, start: int, states: torch.Tensor) -> None:
        """The target's `aux_layers` states [n, ...] at `seq`'s positions start..start + n - 1, all
        of them tokens the sequence keeps."""

    def release(self, seq: Sequence) -> None:
        """Forget a finished or aborted sequence and free what it held."""

    def free_slots(self) -> int | None:
        """Free KV slots of the drafter's own cache (None: it keeps none, or cannot tell now)."""
        return None

    def flush(self) -> None:
        """Called after every step: a proposer in another process sends queued releases."""

    def hand_over(self, seqs: list[Sequence]) -> None:
        """Prompts for a copy of the target beside the drafter to prefill ("prefill_on_drafter",
        spec_decode/target_prefill.py); they come back through `prefilled`."""
        raise NotImplementedError("this drafter cannot prefill the target's prompts")

    def prefilled(self) -> list[tuple[Sequence, Prefilled]]:
        """Handed-over prompts done since the last call (they arrive with drafts)."""
        return []

    def wait_prefilled(self) -> None:
        """Block until at least one handed-over prompt is done (the engine has nothing else to do)."""

    def observe_verify(self, seconds: float) -> None:
        """How long the target's last verification took: about how long the drafter may work on
        handed-over prompts after its drafts are out without delaying the next ones."""

    def adapt(self, on: bool) -> None:
        """Whether draft lengths are "auto": the proposer may then also switch off, from live
        timings, parts of itself that do not pay (LookupFirst: its model)."""

    def choices(self) -> dict:
        """What it chose for itself under "auto", for the metrics."""
        return {}

    def free_drafts(self, seqs: list[Sequence], k: int) -> list[list[int]] | None:
        """The drafts, at most k a sequence, it would make now if they cost nothing to make and were
        made with certainty (prompt lookup: spec_decode/hindsight.py scores them); None if not."""
        return None

    def close(self, graceful: bool = True) -> None:
        """Free the proposer's resources (a drafter process: stop it)."""


class SlotProposer(Proposer):
    """A proposer that runs a model over its own KV cache (`runner`), one slot per sequence
    (`slots`: seq_id -> slot); `forget` drops whatever else it keeps about a sequence."""

    runner: ModelRunner
    slots: dict[int, int]

    def slot(self, seq: Sequence) -> int:
        """The sequence's slot, allocated on first sight."""
        if seq.seq_id not in self.slots:
            self.slots[seq.seq_id] = self.runner.cache.allocate()
        return self.slots[seq.seq_id]

    def forget(self, seq_id: int) -> None:
        """Drop the proposer's other per-sequence state."""

    def release(self, seq: Sequence) -> None:
        self.forget(seq.seq_id)
        slot = self.slots.pop(seq.seq_id, None)
        if slot is not None:
            self.runner.cache.free(slot)

    def free_slots(self) -> int:
        return self.runner.cache.num_free
