"""The draft loop every model-based proposer shares: sample a token per row from the drafter's
logits, feed it back, repeat until each row has its drafts; then TETRIS's selection, if asked."""

from typing import Callable

import torch

from minedraft.spec_decode.tetris import select_lengths
from minedraft.sampling import SamplingParams, probabilities, sample

# step(rows, last) -> logits [len(rows), vocab] for the next draft of each row in `rows` (indices
# into the batch); `last` holds each such row's previous draft, None at the first step.
Step = Callable[[list[int], list[int] | None], torch.Tensor]


def draft_chain(
    step: Step, params: list[SamplingParams], generators: list[torch.Generator | None], num_tokens: list[int],
    capacity: int | None = None,
) -> tuple[list[list[int]], list[torch.Tensor | None]]:
    """Drafts per row (num_tokens[i] of them) and the distributions they were drawn from. With a
    `capacity` (TETRIS), only that many drafts in all are kept, the most promising prefixes by the
    drafter's own confidence (spec_decode.tetris)."""
    drafts: list[list[int]] = [[] for _ in num_tokens]
    dists: list[list[torch.Tensor]] = [[] for _ in num_tokens]
    confidences: list[list[float]] = [[] for _ in num_tokens]
    active = [i for i, n in enumerate(num_tokens) if n > 0]
    last = None
    while active:
        logits = step(active, last)
        probs = probabilities(logits, [params[i] for i in active])
        tokens = sample(probs, [generators[i] for i in active])
        if capacity is not None:  # a position's mode probability; greedy rows: the temperature-1 softmax
            greedy = torch.tensor([generators[i] is None for i in active])
            mode = torch.where(greedy, torch.softmax(logits.float(), dim=-1).amax(dim=-1), probs.amax(dim=-1))
            for j, i in enumerate(active):
                confidences[i].append(float(mode[j]))
        for j, i in enumerate(active):
            drafts[i].append(tokens[j])
            dists[i].append(probs[j])
        active = [i for i in active if len(drafts[i]) < num_tokens[i]]
        last = [drafts[i][-1] for i in active]
    if capacity is not None:
        keep = select_lengths(confidences, capacity)
        drafts = [d[:n] for d, n in zip(drafts, keep)]
        dists = [d[:n] for d, n in zip(dists, keep)]
    return drafts, [torch.stack(d) if d else None for d in dists]
