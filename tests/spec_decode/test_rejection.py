"""The rejection sampler: the output follows the target's distribution (the way vLLM tests it:
tiny vocabulary, many samples, total-variation distance), greedy keeps the matching prefix."""

import pytest
import torch

from minedraft.sampling import Dist, SamplingParams, probabilities
from minedraft.spec_decode.rejection import agreement, greedy_verify, rejection_sample


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a - b).abs().sum().item()


def empirical_output_distributions(p, q, num_samples, seed=0):
    """Histograms of the first and second emitted token over many rounds of draft-then-verify."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(2, p.vocab, dtype=torch.float64)
    for _ in range(num_samples):
        drafts = [q.sample(i, gen) for i in range(len(q))]
        out = rejection_sample(p, q, drafts, gen)
        for pos in range(min(2, len(out))):
            counts[pos, out[pos]] += 1
    return counts / counts.sum(dim=1, keepdim=True)


def random_case(seed, vocab=8, k=3, params=None):
    gen = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(k + 1, vocab, generator=gen, dtype=torch.float64) * 2
    draft_logits = torch.randn(k, vocab, generator=gen, dtype=torch.float64) * 2
    params = params or SamplingParams()
    return probabilities(target_logits, [params] * (k + 1)), probabilities(draft_logits, [params] * k)


@pytest.mark.parametrize("params", [
    SamplingParams(),
    SamplingParams(temperature=0.6),
    SamplingParams(temperature=1.3, top_k=5),
    SamplingParams(temperature=0.9, top_p=0.8),
    SamplingParams(top_k=4, top_p=0.9),
], ids=["plain", "temperature", "top_k", "top_p", "top_k_top_p"])
def test_rejection_sampler_matches_target_distribution(params):
    p, q = random_case(seed=1, params=params)
    sizes = [100, 1000, 10000]
    distances = [tv(empirical_output_distributions(p, q, n)[0], p.dense(0)) for n in sizes]
    assert distances[-1] < distances[0]
    assert distances[-1] < 0.03
    # Far below the distance from the target to random distributions (and to the draft's).
    gen = torch.Generator().manual_seed(9)
    random_tv = min(tv(torch.softmax(torch.randn(8, generator=gen, dtype=torch.float64) * 2, -1), p.dense(0))
                    for _ in range(20))
    assert distances[-1] < random_tv / 4
    assert distances[-1] < tv(q.dense(0), p.dense(0)) / 4


def test_rejection_sampler_second_position_follows_target():
    p, q = random_case(seed=2)
    second = empirical_output_distributions(p, q, 20000)[1]
    assert tv(second, p.dense(1)) < 0.04 < tv(q.dense(1), p.dense(1))


def test_rejection_sampler_accepts_identical_distributions_always():
    p, _ = random_case(seed=3)
    gen = torch.Generator().manual_seed(0)
    drafts = [p.sample(i, gen) for i in range(3)]
    assert rejection_sample(p, p[:3], drafts, gen)[:3] == drafts


def test_greedy_verification_keeps_matching_prefix_then_target_argmax():
    target = [1, 0, 2, 0]  # the target's argmax at each position
    assert greedy_verify(target, [1, 0, 2]) == [1, 0, 2, 0]  # all kept + bonus
    assert greedy_verify(target, [1, 2, 2]) == [1, 0]  # second rejected: target's argmax
    assert greedy_verify(target[:1], []) == [1]


@pytest.mark.parametrize("support", ["reduced_vocabulary", "per_row"])
def test_compact_draft_distributions_decide_exactly_as_dense_ones(support):
    """The same accept / reject arithmetic: with the same generator, a compact q and its dense
    copy keep the same drafts and draw the same recovered token."""
    p, _ = random_case(seed=4, vocab=8, k=3)
    gen = torch.Generator().manual_seed(5)
    probs = torch.softmax(torch.randn(3, 4, generator=gen, dtype=torch.float64), -1)
    ids = torch.tensor([6, 1, 3, 4]) if support == "reduced_vocabulary" else torch.tensor([[6, 1, 3, 4], [0, 7, 2, 5], [5, 4, 1, 0]])
    compact = Dist(probs, ids, 8)
    dense = Dist(torch.stack([compact.dense(i) for i in range(3)]), None, 8)
    outcomes = set()
    for seed in range(300):
        drafts = [compact.sample(i, gen) for i in range(3)]
        kept = rejection_sample(p, compact, drafts, torch.Generator().manual_seed(seed))
        assert kept == rejection_sample(p, dense, drafts, torch.Generator().manual_seed(seed))
        outcomes.add(len(kept))
    assert len(outcomes) > 2  # rejections at several positions, and acceptances


def test_agreement_counts_the_drafts_equal_to_the_target_from_the_first():
    assert agreement([1, 2, 3], [1, 2, 4, 5]) == 2
    assert agreement([1, 2, 3], [1, 2]) == 2  # a target not yet that long
    assert agreement([], [1]) == 0 and agreement([7], [1]) == 0
