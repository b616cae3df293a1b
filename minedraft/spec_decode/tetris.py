"""TETRIS draft selection (the paper's MineDraft = PSD + TETRIS): every row drafts k + e tokens,
then across the batch only the `capacity` most promising draft prefixes go to verification."""

import math


def select_lengths(confidences: list[list[float]], capacity: int) -> list[int]:
    """How many drafts each row keeps. confidences[i][j] is the drafter's confidence at row i's
    j-th draft position: the probability of the most likely token of the distribution the draft was
    drawn from, not of the drawn token. A prefix scores the product of its confidences, and the
    `capacity` best prefixes across all rows are kept; scores only fall along a row (ties go to the
    shorter prefix), so what a row keeps is a prefix.

    Why not the drawn token's probability (the paper's cumulative draft probability): then whether
    a draft is verified would depend on the draft itself, and rejection sampling is exact only when
    the decision to verify position j depends on the drafts before it. The test at temperature 1
    (tests/engine/test_speculative.py) measured the drawn-token variant off the target's
    distribution; this one passes it."""
    scored = []
    for i, row in enumerate(confidences):
        total = 0.0
        for j, q in enumerate(row):
            total += math.log(q) if q > 0 else -math.inf
            scored.append((-total, j, i))
    keep = [0] * len(confidences)
    for _, j, i in sorted(scored)[:capacity]:
        keep[i] = max(keep[i], j + 1)
    return keep
