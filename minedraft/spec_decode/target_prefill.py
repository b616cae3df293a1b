"""The target's prefill in the drafter process (`"prefill_on_drafter": true`).

A drafter in its own process waits most of the time: in psd an EAGLE-3 head drafts a sub-batch in
a fraction of a verification. Prompts the engine hands over while its target runs streams are
prefilled here instead, by a copy of the target, chunk by chunk in that waiting time. Their KV
entries and last logits go back to the engine with its next drafts; the engine writes the entries
into its cache and samples the first token, as if its own target had prefilled the prompt. The
drafter's own model takes the target's states (an EAGLE-3 head) or tokens from here as they come.
"""

import time

import torch

from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.engine.sequence import Sequence
from minedraft.models.llama import Decoder
from minedraft.spec_decode.base import Prefilled, Proposer


class TargetPrefill:
    """Prompts waiting for the target's copy, first come first served, one at a time in one slot."""

    FIRST_CHUNK = 16  # tokens, until the time of a token is known
    MIN_CHUNK = 4  # a shorter chunk costs mostly the pass's fixed overhead: wait for the next window
    MAX_CHUNK = 256
    WEIGHT = 0.2  # of the newest chunk in the moving average of a token's time

    def __init__(self, model: Decoder, max_len: int, dtype: torch.dtype, device: torch.device,
                 aux_layers: tuple[int, ...] = ()):
        self.runner = ModelRunner(model, 1, max_len, dtype, device)
        self.aux_layers = aux_layers
        self.slot = self.runner.cache.allocate()
        self.queue: list[tuple[Sequence, int]] = []  # (sequence, prompt length)
        self.done: list[Prefilled] = []
        self.token_s: float | None = None

    def add(self, seq: Sequence) -> None:
        """Queue `seq`'s tokens so far: its prompt."""
        self.queue.append((seq, len(seq)))

    def drop(self, seq_id: int) -> None:
        """A released sequence: forget its prompt, begun or done."""
        if self.queue and self.queue[0][0].seq_id == seq_id:
            self.runner.cache.truncate(self.slot, 0)
        self.queue = [(s, n) for s, n in self.queue if s.seq_id != seq_id]
        self.done = [p for p in self.done if p.seq_id != seq_id]

    def take(self) -> list[Prefilled]:
        done, self.done = self.done, []
        return done

    def run(self, proposer: Proposer, deadline: float | None) -> None:
        """Prefill chunks until about `deadline` (time.time()); with None, until one prompt is done.
        The proposer gets each chunk (the target's states for a head) as it is run."""
        cache = self.runner.cache
        while self.queue:
            seq, length = self.queue[0]
            prompt = seq.tokens_from(0)[:length]
            start = cache.lengths[self.slot]
            left = len(prompt) - start
            n = min(left, self.MAX_CHUNK)
            if deadline is not None:
                room = deadline - time.time()
                n = min(n, int(room / self.token_s) if self.token_s else self.FIRST_CHUNK)
                if room <= 0 or n < min(left, self.MIN_CHUNK):
                    return
            last = start + n == len(prompt)
            began = time.perf_counter()
            inputs = {"aux_layers": self.aux_layers} if self.aux_layers else {}
            logits, states = self.runner.run([Row(self.slot, prompt[start : start + n], int(last))], **inputs)
            token_s = (time.perf_counter() - began) / n
            self.token_s = token_s if self.token_s is None else (1 - self.WEIGHT) * self.token_s + self.WEIGHT * token_s
            if states is not None:
                proposer.accept_states(seq, start, states)
            proposer.prefill([seq], [start + n])
            if last:
                k, v = cache.k[:, self.slot, :, : len(prompt)], cache.v[:, self.slot, :, : len(prompt)]
                self.done.append(Prefilled(seq.seq_id, k.clone(), v.clone(), logits))
                cache.truncate(self.slot, 0)
                self.queue.pop(0)
                if deadline is None:
                    return
