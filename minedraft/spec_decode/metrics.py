"""Speculative-decoding counters with vLLM's definitions."""

from dataclasses import dataclass, field


@dataclass
class SpecDecodeMetrics:
    num_drafts: int = 0  # verified rows that carried at least one draft token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: drafts whose i-th token was kept
    num_steps: int = 0  # speculative steps (each verifies one batch or sub-batch)
    num_overlapped_steps: int = 0  # PSD steps whose verification ran beside drafting
    drafter_failures: int = 0
    num_prompts_prefilled_by_drafter: int = 0  # "prefill_on_drafter": by the target's copy there

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_position) < num_draft_tokens:
            self.accepted_per_position += [0] * (num_draft_tokens - len(self.accepted_per_position))
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    def as_dict(self) -> dict:
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_position": list(self.accepted_per_position),
            "acceptance_rate": self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0,
            "mean_acceptance_length": 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0,
            "num_steps": self.num_steps,
            "num_overlapped_steps": self.num_overlapped_steps,
            "drafter_failures": self.drafter_failures,
            "num_prompts_prefilled_by_drafter": self.num_prompts_prefilled_by_drafter,
        }
