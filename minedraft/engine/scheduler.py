"""Continuous batching with chunked prefill: every step runs each prefilled sequence's next tokens
beside a bounded share of prompt tokens, admitted in arrival order while KV slots are free."""

from collections import deque
from dataclasses import dataclass, field

from minedraft.engine.sequence import Sequence, Status
from minedraft.kv_cache import KVCache


@dataclass
class ScheduledStep:
    running: list[Sequence] = field(default_factory=list)  # prefilled: they decode (or are verified)
    chunks: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, prompt tokens to run)

    def __bool__(self) -> bool:
        return bool(self.running or self.chunks)


class Scheduler:
    def __init__(self, cache: KVCache, max_num_batched_tokens: int, chunked: bool = True):
        self.cache = cache
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked = chunked
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def prompt_left(self, seq: Sequence) -> int:
        """Prompt tokens of a running sequence not yet in its KV cache (0 once it is prefilled)."""
        return 0 if seq.output_token_ids else len(seq.prompt_token_ids) - self.cache.lengths[seq.slot]

    def schedule(self) -> ScheduledStep:
        """The next step: every prefilled sequence, and up to `max_num_batched_tokens` prompt tokens,
        first of prompts already begun, then of waiting requests admitted in order while slots are
        free. Streams in flight thus never wait for more than one bounded chunk of prompts. Without
        chunking a prompt is never split: prompts go whole while they fit (the first one always)."""
        step, budget = ScheduledStep(), self.max_num_batched_tokens
        for seq in self.running:
            left = self.prompt_left(seq)
            if not left:
                step.running.append(seq)
            elif budget > 0 and (self.chunked or not step.chunks or left <= budget):
                n = left if not self.chunked else min(left, budget)
                step.chunks.append((seq, n))
                budget -= n
        while self.waiting and self.cache.num_free > 0 and budget > 0:
            seq = self.waiting[0]
            if not self.chunked and step.chunks and len(seq) > budget:
                break
            self.waiting.popleft()
            seq.slot = self.cache.allocate()
            seq.status = Status.RUNNING
            self.running.append(seq)
            n = len(seq) if not self.chunked else min(len(seq), budget)
            step.chunks.append((seq, n))
            budget -= n
        return step

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a sequence wherever it is and release its slot."""
        if seq.status == Status.FINISHED:
            return
        if seq.status == Status.WAITING:
            self.waiting.remove(seq)
        else:
            self.running.remove(seq)
            self.cache.free(seq.slot)
            seq.slot = None
        seq.status = Status.FINISHED
        seq.finish_reason = reason
