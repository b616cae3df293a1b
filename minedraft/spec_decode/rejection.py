"""Verification's sampler: keep a prefix of the drafts and one token from the target, so that the
output is distributed exactly as the target's (Leviathan et al. 2023; Chen et al. 2023)."""

import torch

from minedraft.sampling import Dist


def rejection_sample(p: Dist, q: Dist | None, drafts: list[int], generator: torch.Generator) -> list[int]:
    """Verify one sampled row's drafts: the accepted prefix plus one token from the target.

    p: len(drafts) + 1 target distributions, q: len(drafts) draft distributions the drafts were
    drawn from (None without drafts), both after the request's temperature / top-k / top-p, each
    dense or compact. Draft x is kept with probability min(1, p(x) / q(x)); the first rejected
    position draws from normalise(max(0, p - q)), and after all are kept a bonus token draws from
    the last p. The output is distributed exactly as the target's (Leviathan et al. 2023; Chen et
    al. 2023).
    """
    uniform = torch.rand(len(drafts), generator=generator, dtype=p.probs.dtype, device=p.probs.device)
    for i, x in enumerate(drafts):
        if uniform[i] * q.prob(i, x) >= p.prob(i, x):
            # The only place either distribution is needed over the whole vocabulary.
            target = p.dense(i)
            residual = (target - q.dense(i).to(target.device)).clamp_min_(0)
            return drafts[:i] + [int(torch.multinomial(residual, 1, generator=generator))]
    return drafts + [p.sample(len(drafts), generator)]


def agreement(drafts: list[int], target: list[int]) -> int:
    """How many drafts, from the first, equal the target's tokens at their positions."""
    kept = 0
    while kept < min(len(drafts), len(target)) and drafts[kept] == target[kept]:
        kept += 1
    return kept


def greedy_verify(target: list[int], drafts: list[int]) -> list[int]:
    """Verify one greedy row's drafts: keep them while they equal the target's argmax at each
    position (`target`, len(drafts) + 1 tokens), then the target's token."""
    kept = agreement(drafts, target)
    return drafts[:kept] + [target[kept]]
