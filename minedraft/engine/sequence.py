"""Request state: one Sequence per completion being generated, and what the user gets back."""

import enum
import time
from dataclasses import dataclass, field

import torch

from minedraft.engine.detokenizer import DecodeState
from minedraft.sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    seq_id: int  # unique per engine; workers key their state by it
    request_id: str
    index: int  # which of the request's n completions
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    decode_state: DecodeState
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None  # per output token, when params.logprobs is set
    text: str = ""
    status: Status = Status.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    slot: int | None = None
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None

    def tokens_from(self, start: int) -> list[int]:
        """Prompt and output tokens from position `start` on (those not yet in the KV cache)."""
        prompt_len = len(self.prompt_token_ids)
        if start >= prompt_len:
            return self.output_token_ids[start - prompt_len :]
        return self.prompt_token_ids[start:] + self.output_token_ids

    def __len__(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def output_text(self) -> str:
        """The text so far. Until the sequence finishes, as many of its last characters as could
        begin a stop string are held back, so text once shown is never cut off by a later stop."""
        if self.status == Status.FINISHED or not self.params.stop_strings:
            return self.text
        hold = max(len(s) for s in self.params.stop_strings) - 1
        return self.text[: max(len(self.text) - hold, 0)]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[dict[int, float]] | None = None  # per token: {token id: log-probability}


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    arrival_time: float  # time.perf_counter() seconds
    first_token_time: float | None
    finish_time: float | None

    def latencies(self) -> tuple[float, float | None, float] | None:
        """(TTFT, TPOT, E2E) in seconds of a finished request, TPOT over its longest completion
        (None for one token); None before it finished. The server and the benchmarks both report these."""
        if self.first_token_time is None or self.finish_time is None:
            return None
        ttft, e2e = self.first_token_time - self.arrival_time, self.finish_time - self.arrival_time
        return ttft, time_per_output_token(e2e, ttft, max(len(o.token_ids) for o in self.outputs)), e2e

    @classmethod
    def from_sequences(cls, seqs: list[Sequence]) -> "RequestOutput":
        first = seqs[0]
        outputs = [CompletionOutput(s.index, s.output_text, list(s.output_token_ids), s.finish_reason,
                                    None if s.logprobs is None else list(s.logprobs)) for s in seqs]
        done = all(s.status == Status.FINISHED for s in seqs)
        firsts = [s.first_token_time for s in seqs if s.first_token_time is not None]
        return cls(first.request_id, first.prompt, first.prompt_token_ids, outputs, done, first.arrival_time,
                   min(firsts) if firsts else None, max(s.finish_time for s in seqs) if done else None)


def time_per_output_token(e2e: float, ttft: float, tokens: int) -> float | None:
    """TPOT as vLLM defines it: the time after the first token over the tokens after it."""
    return (e2e - ttft) / (tokens - 1) if tokens > 1 else None
