"""Continuous batching: FIFO admission bounded by free KV slots and a prefill token budget."""

from collections import deque

from minedraft.engine.sequence import Sequence, Status
from minedraft.kv_cache import KVCache


class Scheduler:
    def __init__(self, cache: KVCache, max_num_batched_tokens: int):
        self.cache = cache
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.prefilled_last = False

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """The sequences for the next step and whether it is a prefill step.

        Waiting requests are admitted (prefill), as many as free slots and the prompt-token budget
        allow (the first always fits); otherwise every running sequence decodes. A prefill step is
        never followed by another while sequences are running: a queue of long prompts would
        otherwise stall every stream in flight for as long as their prefills take.
        """
        admitted: list[Sequence] = []
        tokens = 0
        while self.waiting and self.cache.num_free > 0 and not (self.prefilled_last and self.running):
            seq = self.waiting[0]
            if admitted and tokens + len(seq) > self.max_num_batched_tokens:
                break
            self.waiting.popleft()
            seq.slot = self.cache.allocate()
            seq.status = Status.RUNNING
            admitted.append(seq)
            tokens += len(seq)
        self.prefilled_last = bool(admitted)
        if admitted:
            self.running.extend(admitted)
            return admitted, True
        return list(self.running), False

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
