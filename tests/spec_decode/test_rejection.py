"""The rejection sampler: the output follows the target's distribution (the way vLLM tests it:
tiny vocabulary, many samples, total-variation distance), greedy keeps the matching prefix."""

import pytest
import torch

from minedraft.sampling import SamplingParams, probabilities
from minedraft.spec_decode.rejection import rejection_sample


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a - b).abs().sum().item()


def empirical_output_distributions(p, q, num_samples, seed=0):
    """Histograms of the first and second emitted token over many rounds of draft-then-verify."""
    gen = torch.Generator().manual_seed(seed)
    vocab = p.shape[-1]
    counts = torch.zeros(2, vocab, dtype=torch.float64)
    for _ in range(num_samples):
        drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(q.shape[0])]
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
    distances = [tv(empirical_output_distributions(p, q, n)[0], p[0]) for n in sizes]
    assert distances[-1] < distances[0]
    assert distances[-1] < 0.03
    # Far below the distance from the target to random distributions (and to the draft's).
    gen = torch.Generator().manual_seed(9)
    random_tv = min(tv(torch.softmax(torch.randn(8, generator=gen, dtype=torch.float64) * 2, -1), p[0])
                    for _ in range(20))
    assert distances[-1] < random_tv / 4
    assert distances[-1] < tv(q[0], p[0]) / 4


def test_rejection_sampler_second_position_follows_target():
    p, q = random_case(seed=2)
    second = empirical_output_distributions(p, q, 20000)[1]
    assert tv(second, p[1]) < 0.04 < tv(q[1], p[1])


def test_rejection_sampler_accepts_identical_distributions_always():
    p, _ = random_case(seed=3)
    gen = torch.Generator().manual_seed(0)
    drafts = [int(torch.multinomial(p[i], 1, generator=gen)) for i in range(3)]
    assert rejection_sample(p, p[:3], drafts, gen)[:3] == drafts


def test_greedy_rejection_keeps_matching_prefix_then_target_argmax():
    logits = torch.tensor([[0.0, 3, 1], [2, 0, 1], [0, 0, 5], [4, 0, 0]])
    p = probabilities(logits, [SamplingParams(temperature=0)] * 4)
    assert rejection_sample(p, None, [1, 0, 2], None) == [1, 0, 2, 0]  # all kept + bonus
    assert rejection_sample(p, None, [1, 2, 2], None) == [1, 0]  # second rejected: target's argmax
