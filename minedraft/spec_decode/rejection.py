"""Verification's sampler: keep a prefix of the drafts and one token from the target, so that the
output is distributed exactly as the target's (Leviathan et al. 2023; Chen et al. 2023)."""

import torch


def rejection_sample(
    p: torch.Tensor, q: torch.Tensor, drafts: list[int], generator: torch.Generator | None
) -> list[int]:
    """Verify one row's drafts: the accepted prefix plus one token from the target.

    p: [len(drafts) + 1, V] target distributions, q: [len(drafts), V] the draft distributions the
    drafts were drawn from (both after the request's temperature / top-k / top-p). Draft x is kept
    with probability min(1, p(x) / q(x)); the first rejected position draws from
    normalise(max(0, p - q)), and after all are kept a bonus token draws from the last p. The output
    is distributed exactly as the target's (Leviathan et al. 2023; Chen et al. 2023). A None
    generator marks a greedy row: keep drafts while they equal the target's argmax.
    """
    if generator is None:
        target = p.argmax(dim=-1).tolist()
        for i, x in enumerate(drafts):
            if x != target[i]:
                return drafts[:i] + [target[i]]
        return drafts + [target[len(drafts)]]
    uniform = torch.rand(len(drafts), generator=generator, dtype=p.dtype, device=p.device)
    for i, x in enumerate(drafts):
        if uniform[i] * q[i, x] >= p[i, x]:
            residual = (p[i] - q[i]).clamp_min_(0)
            return drafts[:i] + [int(torch.multinomial(residual, 1, generator=generator))]
    return drafts + [int(torch.multinomial(p[len(drafts)], 1, generator=generator))]
