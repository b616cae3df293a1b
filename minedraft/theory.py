"""The analytic model of AR, SD and PSD decoding speed (the MineDraft paper's performance model).

Inputs, all measured: D, one plain decode step over the rows in flight; V, one verification of a
step's rows with k drafts each; t, drafting those k tokens for them; the rows per step (every
sequence in sd, one sub-batch in psd); and how often drafts are accepted. Output: tokens per
second of the decode phase, hence speedups and the best k.

Acceptance is modelled per draft position: rate[j] is the chance that draft j + 1 is accepted
given that the j before it were. The textbook model takes one rate alpha for every position
(E[tokens] = (1 - alpha^(k+1)) / (1 - alpha)); a weak drafter is much better at its first token
than at later ones, which that model misses.
"""

import statistics
from collections.abc import Iterable


def count_by_position(rows: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """(tried, accepted) per draft position from (drafted, accepted) per verified row: draft j + 1
    was tried where a row drafted more than j and accepted at least j, and accepted where it
    accepted more than j. The lists end at the last position some row reached."""
    tried: list[int] = []
    taken: list[int] = []
    for drafted, accepted in rows:
        for j in range(min(accepted + 1, drafted)):
            if j == len(tried):
                tried.append(0)
                taken.append(0)
            tried[j] += 1
            taken[j] += j < accepted
    return tried, taken


def acceptance_by_position(rows: Iterable[tuple[int, int]]) -> list[float]:
    """Per-position conditional acceptance rates of verified rows (drafted, accepted)."""
    tried, taken = count_by_position(rows)
    return [a / n for a, n in zip(taken, tried)]


def expected_tokens_by_position(rates: list[float], k: int) -> float:
    """Tokens per verification round of a row with k drafts: 1 + sum over j <= k of the chance
    that the first j drafts are all accepted. Positions past the measured ones reuse the last
    rate (none measured: nothing is accepted)."""
    total, p = 1.0, 1.0
    for j in range(k):
        p *= rates[min(j, len(rates) - 1)] if rates else 0.0
        total += p
    return total


def step_seconds(verify_s: float, draft_s: float, parallel: bool) -> float:
    """One speculative step: sd drafts then verifies; psd drafts one sub-batch while it verifies
    the other, so the slower of the two sets the pace."""
    return max(verify_s, draft_s) if parallel else verify_s + draft_s


def mean_step_seconds(verify_s: list[float], draft_s: list[float], overlapped_share: float) -> float:
    """Mean step time of a run from its verification and drafting times, in the order they ran,
    and the share of its steps that verified one sub-batch while the drafter drafted the other
    (psd with both sub-batches non-empty; 0 for sd, and for psd with one request in flight).
    Sequential steps take V + t. In an overlapped step the verification runs beside the drafting
    of the next sub-batch and the slower of the two ends it; the max is taken step by step, as the
    max of the means misses the few drafting steps that outlast verification (the drafter's
    catch-up on the prompts of new requests), and with them up to a quarter of the step time at 16
    requests in flight (docs/BENCHMARKS.md, run 7)."""
    sequential = statistics.mean(verify_s) + statistics.mean(draft_s)
    if not overlapped_share:
        return sequential
    overlapped = statistics.mean(max(v, t) for v, t in zip(verify_s, draft_s[1:]))
    return overlapped_share * overlapped + (1 - overlapped_share) * sequential


def psd_speedup(verify_s: float, draft_s: float) -> float:
    """PSD over sequential SD when costs are linear in batch size: (V + t) / max(V, t), V and t
    being one sub-batch's verify and draft times. At most 2, reached when V = t: the bound that
    the paper's analysis gives for overlapping the two stages."""
    return step_seconds(verify_s, draft_s, parallel=False) / step_seconds(verify_s, draft_s, parallel=True)


def psd_speedup_equal_concurrency(sd_verify_s: float, sd_draft_s: float, psd_verify_s: float,
                                  psd_draft_s: float) -> float:
    """PSD over SD with the same requests in flight: SD takes V(2b) + t(2b) per round for the whole
    batch, PSD max(V(b), t(b)) per sub-batch, two sub-batches per round."""
    sd_round = step_seconds(sd_verify_s, sd_draft_s, parallel=False)
    return sd_round / (2 * step_seconds(psd_verify_s, psd_draft_s, parallel=True))
