"""Continuous batching with chunked prefill: every step runs each prefilled sequence's next tokens
beside a bounded share of prompt tokens, admitted while KV slots are free: in arrival order, or
(policy "shortest_prompt") the soonest-done prompt first."""

from collections import deque
from dataclasses import dataclass, field

from minedraft.engine.sequence import Sequence, Status
from minedraft.kv_cache import KVCache


@dataclass
class ScheduledStep:
    running: list[Sequence] = field(default_factory=list)  # prefilled: they decode (or are verified)
    chunks: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, prompt tokens to run)
    handed_over: list[Sequence] = field(default_factory=list)  # admitted, for the drafter's target copy to prefill

    def __bool__(self) -> bool:
        return bool(self.running or self.chunks)


class PrefillPacer:
    """Sizes a step's prompt chunks. With no stream running nobody waits on the step: it takes
    `max_tokens`. Beside running streams it takes at most `tokens_beside_streams`, and with a
    `stall_ratio` few enough that a step carrying them takes at most that many times a step without
    them: every stream's inter-token gap then stays within that ratio of its usual gap, on any
    machine, whatever the prompt lengths and however many prompts wait. It learns, as moving
    averages, the time of a step without prompt tokens and the time each prompt token adds: on a
    CPU a decode step streams the weights once and each prompt token is compute on top, and the two
    compare very differently between CPUs (a 64-token chunk took a step from 44 to 159 ms on a Xeon,
    a 60-token one from 13 to 170 ms on an EPYC; docs/BENCHMARKS.md, issue 19). Steps of prompts
    alone give a first price of a token. Until both are known, beside streams it takes `MIN_TOKENS`."""

    WEIGHT = 0.2  # of the newest observation in each moving average
    MIN_TOKENS = 8  # prompts keep moving however slow a token is

    def __init__(self, stall_ratio: float | None, max_tokens: int, tokens_beside_streams: int | None = None):
        self.stall_ratio = stall_ratio
        self.max_tokens = max_tokens
        self.beside = max_tokens if tokens_beside_streams is None else min(tokens_beside_streams, max_tokens)
        self.step_s: float | None = None  # a step of running rows alone
        self.token_s: float | None = None  # what one prompt token adds to such a step

    def budget(self, streams: bool) -> int:
        """Prompt tokens for the next step; `streams`: whether prefilled sequences run in it."""
        if not streams:
            return self.max_tokens
        if self.stall_ratio is None:
            return self.beside
        floor = min(self.MIN_TOKENS, self.beside)
        if self.step_s is None or not self.token_s:
            return floor
        return max(floor, min(int((self.stall_ratio - 1) * self.step_s / self.token_s), self.beside))

    def observe(self, seconds: float, streams: bool, prompt_tokens: int) -> None:
        """A finished step's time, whether it ran streams, and the prompt tokens it carried."""
        if self.stall_ratio is None:  # off: nothing to learn
            return
        if not streams:  # prompts alone: each token's share of the step, a slight overestimate
            if prompt_tokens:
                self.token_s = _average(self.token_s, seconds / prompt_tokens, self.WEIGHT)
        elif not prompt_tokens:
            self.step_s = _average(self.step_s, seconds, self.WEIGHT)
        elif self.step_s is not None:
            self.token_s = _average(self.token_s, max(seconds - self.step_s, 0.0) / prompt_tokens, self.WEIGHT)


def _average(mean: float | None, value: float, weight: float) -> float:
    return value if mean is None else (1 - weight) * mean + weight * value


class Scheduler:
    """Prompt tokens go to prompts in arrival order ("fcfs"), or with "shortest_prompt" by the time
    each would be done if it had the prompt budget to itself from its arrival: arrival + tokens
    left x the engine's wall-clock seconds per prompt token (learned). That is shortest-first among
    prompts that arrive close together, which cuts the median time to first token under load
    (docs/BENCHMARKS.md, issue 19), and arrival order once a prompt has waited as long as it
    takes: no newcomer passes a prompt that has waited its own prefill time, so none starves."""

    def __init__(self, cache: KVCache, max_num_batched_tokens: int, chunked: bool = True,
                 stall_ratio: float | None = None, tokens_beside_streams: int | None = None,
                 policy: str = "fcfs"):
        self.cache = cache
        self.chunked = chunked
        self.shortest_first = policy == "shortest_prompt"
        self.prompt_token_s = 0.0  # wall-clock seconds per prompt token, a moving average; 0: arrival order
        self.pacer = PrefillPacer(stall_ratio if chunked else None, max_num_batched_tokens, tokens_beside_streams)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # Set by the engine ("prefill_on_drafter"): up to this many prompts at a time, admitted
        # beside running streams, are handed over whole to a copy of the target in the drafter's
        # process; `elsewhere` holds the seq ids of those not back yet.
        self.hand_over = 0
        self.elsewhere: set[int] = set()

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def prompt_left(self, seq: Sequence) -> int:
        """Prompt tokens of a running sequence not yet in its KV cache (0 once it is prefilled)."""
        return 0 if seq.output_token_ids else len(seq.prompt_token_ids) - self.cache.lengths[seq.slot]

    def schedule(self) -> ScheduledStep:
        """The next step: every prefilled sequence, and up to `max_num_batched_tokens` prompt tokens
        (fewer beside running streams, as the pacer says), first of prompts already begun, then
        of waiting requests admitted in order while slots are free. Streams in flight thus never
        wait for more than one bounded chunk of prompts. Without chunking a prompt is never split:
        prompts go whole while they fit (the first one always). With `hand_over`, prompts admitted
        beside streams go to the drafter's target copy first, whole and outside the budget, while
        it holds fewer than that many; the others are prefilled here as usual."""
        step = ScheduledStep()
        prefilling = []
        for seq in self.running:
            if seq.seq_id not in self.elsewhere:
                (prefilling if self.prompt_left(seq) else step.running).append(seq)
        if self.shortest_first:
            prefilling.sort(key=lambda s: s.arrival_time + self.prompt_left(s) * self.prompt_token_s)
            self.waiting = deque(sorted(self.waiting, key=lambda s: s.arrival_time + len(s) * self.prompt_token_s))
        budget = self.pacer.budget(bool(step.running))
        for seq in prefilling:
            left = self.prompt_left(seq)
            if budget > 0 and (self.chunked or not step.chunks or left <= budget):
                n = left if not self.chunked else min(left, budget)
                step.chunks.append((seq, n))
                budget -= n
        while self.waiting and self.cache.num_free > 0:
            seq = self.waiting[0]
            hand_over = bool(step.running) and len(self.elsewhere) < self.hand_over
            if not hand_over and (budget <= 0 or not self.chunked and step.chunks and len(seq) > budget):
                break
            self.waiting.popleft()
            seq.slot = self.cache.allocate()
            seq.status = Status.RUNNING
            self.running.append(seq)
            if hand_over:
                step.handed_over.append(seq)
                self.elsewhere.add(seq.seq_id)
                continue
            n = len(seq) if not self.chunked else min(len(seq), budget)
            step.chunks.append((seq, n))
            budget -= n
        return step

    def observe(self, seconds: float, streams: bool, prompt_tokens: int) -> None:
        """A finished step's time, whether it ran streams, and the prompt tokens it carried."""
        self.pacer.observe(seconds, streams, prompt_tokens)
        if prompt_tokens:
            self.prompt_token_s = _average(self.prompt_token_s or None, seconds / prompt_tokens, PrefillPacer.WEIGHT)

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a sequence wherever it is and release its slot."""
        if seq.status == Status.FINISHED:
            return
        if seq.status == Status.WAITING:
            self.waiting.remove(seq)
        else:
            self.running.remove(seq)
            self.elsewhere.discard(seq.seq_id)
            self.cache.free(seq.slot)
            seq.slot = None
        seq.status = Status.FINISHED
        seq.finish_reason = reason
