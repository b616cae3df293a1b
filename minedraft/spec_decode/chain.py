"""The draft loop every model-based proposer shares: sample a token per row from the drafter's
logits, feed it back, repeat until each row has its drafts; then TETRIS's selection, if asked."""

from typing import Callable

import torch

from minedraft.spec_decode.tetris import select_lengths
from minedraft.sampling import Dist, SamplingParams, sample

# step(rows, last) -> logits [len(rows), vocab] for the next draft of each row in `rows` (indices
# into the batch); `last` holds each such row's previous draft, None at the first step. A drafter
# with a reduced vocabulary scores only its own tokens: [len(rows), its vocabulary].
Step = Callable[[list[int], list[int] | None], torch.Tensor]


def draft_chain(
    step: Step, params: list[SamplingParams], generators: list[torch.Generator | None], num_tokens: list[int],
    capacity: int | None = None, vocab: tuple[torch.Tensor, int] | None = None,
) -> tuple[list[list[int]], list[Dist | None]]:
    """Drafts per row (num_tokens[i] of them) and the distributions they were drawn from (None for
    greedy rows). With a `capacity` (TETRIS), only that many drafts in all are kept, the most
    promising prefixes by the drafter's own confidence (spec_decode.tetris). `vocab`, for a drafter
    with a reduced vocabulary: the target's id of each of its tokens and the target's vocabulary
    size; drafts are drawn over the drafter's tokens and their distributions stay that compact."""
    drafts: list[list[int]] = [[] for _ in num_tokens]
    dists: list[list[Dist]] = [[] for _ in num_tokens]
    confidences: list[list[float]] = [[] for _ in num_tokens]
    active = [i for i, n in enumerate(num_tokens) if n > 0]
    last = None
    while active:
        logits = step(active, last)
        gens = [generators[i] for i in active]
        tokens, dist = sample(logits, [params[i] for i in active], gens)
        if vocab is not None:
            tokens = vocab[0][tokens].tolist()
            dist = None if dist is None else dist.onto(*vocab)
        if capacity is not None:
            for i, mode in zip(active, _modes(logits, dist, gens)):
                confidences[i].append(mode)
        drawn = 0  # the row of `dist` of the next row that drew
        for j, i in enumerate(active):
            drafts[i].append(tokens[j])
            if gens[j] is not None:
                dists[i].append(dist[drawn : drawn + 1])
                drawn += 1
        active = [i for i in active if len(drafts[i]) < num_tokens[i]]
        last = [drafts[i][-1] for i in active]
    if capacity is not None:
        keep = select_lengths(confidences, capacity)
        drafts = [d[:n] for d, n in zip(drafts, keep)]
        dists = [d[:n] for d, n in zip(dists, keep)]
    return drafts, [Dist.cat(d) if d else None for d in dists]


def _modes(logits: torch.Tensor, dist: Dist | None, generators: list[torch.Generator | None]) -> list[float]:
    """Each row's mode probability (TETRIS's confidence): of the distribution the row drew from; a
    greedy row's, of its temperature-1 softmax."""
    drawn = iter(dist.probs.amax(dim=-1).tolist() if dist is not None else ())
    plain = None
    if None in generators:
        logits = logits.float()
        plain = (logits.amax(dim=-1) - logits.logsumexp(dim=-1)).exp().tolist()
    return [plain[j] if g is None else next(drawn) for j, g in enumerate(generators)]
