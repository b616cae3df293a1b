import json

import pytest
import torch

from conftest import reference_probabilities
from minedraft import sampling
from minedraft.sampling import MIN_TEMPERATURE, Dist, SamplingParams, probabilities, sample, top_logprobs


def test_greedy_rows_take_the_argmax_without_a_distribution():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9], [3.0, 0.0, 0.0, 0.0]])
    assert sample(logits, [SamplingParams(temperature=0)] * 2, [None, None]) == ([1, 0], None)


def test_greedy_and_sampled_rows_in_one_batch():
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3], [0.2, 0.3, 0.5]], dtype=torch.float64))
    params = [SamplingParams(temperature=0), SamplingParams(), SamplingParams(temperature=0)]
    tokens, dist = sample(logits, params, [None, torch.Generator().manual_seed(0), None])
    assert tokens[0] == 1 and tokens[2] == 2 and tokens[1] in (0, 1, 2)
    assert len(dist) == 1 and dist.ids is None  # only the sampled row's distribution, dense
    torch.testing.assert_close(dist.probs[0], torch.tensor([0.5, 0.2, 0.3], dtype=torch.float64))


def test_temperature_top_k_and_top_p_per_row():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]] * 4, dtype=torch.float64))
    params = [SamplingParams(), SamplingParams(top_k=2), SamplingParams(top_p=0.65), SamplingParams(temperature=0.5)]
    probs = probabilities(logits, params).probs  # a row without top-k / top-p: dense rows
    torch.testing.assert_close(probs[0], torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64))
    torch.testing.assert_close(probs[1], torch.tensor([4 / 7, 3 / 7, 0, 0], dtype=torch.float64))
    # 0.4 alone is below 0.65, 0.4 + 0.3 reaches it: the nucleus is the first two tokens.
    torch.testing.assert_close(probs[2], torch.tensor([4 / 7, 3 / 7, 0, 0], dtype=torch.float64))
    sq = torch.tensor([0.16, 0.09, 0.04, 0.01], dtype=torch.float64)
    torch.testing.assert_close(probs[3], sq / sq.sum())


def test_top_p_keeps_at_least_the_top_token():
    logits = torch.tensor([[5.0, 0.0, 0.0]])
    probs = probabilities(logits, [SamplingParams(top_p=0.01)])
    assert probs.dense(0).tolist() == [1.0, 0.0, 0.0] and probs.ids.tolist() == [[0]]


# -- the rejection sampler, tested the way vLLM tests its own --------------------------------------


def test_top_logprobs_are_the_models_own_and_include_the_chosen_token():
    logits = torch.tensor([[2.0, 0.5, -1.0, 3.0], [0.0, 0.0, 1.0, -2.0]], dtype=torch.float64)
    rows = top_logprobs(logits, [2, 3], 2)
    logp = torch.log_softmax(logits, -1)
    assert list(rows[0]) == [3, 0, 2]  # top two first, then the chosen token
    assert rows[0][2] == pytest.approx(float(logp[0, 2]))
    assert rows[1][3] == pytest.approx(float(logp[1, 3]))
    assert list(top_logprobs(logits, [3], 1)[0]) == [3]


@pytest.mark.parametrize("value", [-1, 21, 1.5])
def test_bad_logprobs_is_named(value):
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=value)


@pytest.mark.parametrize("kwargs,field", [
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"top_p": float("nan")}, "top_p"),
    ({"n": True}, "n"),
    ({"max_tokens": True}, "max_tokens"),
    ({"top_k": 2.0}, "top_k"),
    ({"seed": -1}, "seed"),
    ({"seed": 2**63}, "seed"),
    ({"seed": 2**63 - 1, "n": 2}, "seed"),  # the second completion's seed would be 2**63
    ({"seed": 18446744073709551615, "n": 2}, "seed"),
    ({"seed": True}, "seed"),
    ({"logprobs": True}, "logprobs"),
    ({"stop": 5}, "stop"),
    ({"stop": [1]}, "stop"),
    ({"stop_token_ids": 5}, "stop_token_ids"),
    ({"stop_token_ids": [True]}, "stop_token_ids"),
    ({"ignore_eos": 1}, "ignore_eos"),
])
def test_bad_values_name_their_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field} "):
        SamplingParams(**kwargs)


def test_seeds_up_to_the_generators_range_are_accepted():
    assert SamplingParams(seed=2**63 - 2, n=2).seed == 2**63 - 2
    assert SamplingParams(seed=0).seed == 0


@pytest.mark.parametrize("temperature", [1e-320, 1e-38, 1e-5])
def test_tiny_temperatures_are_raised_to_a_safe_floor(temperature):
    params = SamplingParams(temperature=temperature)
    assert params.temperature == MIN_TEMPERATURE
    logits = torch.tensor([[30.0, 29.9, -5.0]])
    probs = probabilities(logits, [params]).probs
    assert torch.isfinite(probs).all() and probs[0, 0] > 0.99


def test_as_dict_rebuilds_the_same_params():
    params = SamplingParams(n=2, temperature=0.5, top_k=4, stop=["a", "bc"], stop_token_ids=[3], seed=9, logprobs=2)
    rebuilt = SamplingParams(**json.loads(json.dumps(params.as_dict())))
    assert rebuilt == params and rebuilt.stop_strings == params.stop_strings


CASES = [SamplingParams(), SamplingParams(temperature=0.7), SamplingParams(top_k=5), SamplingParams(top_k=80),
         SamplingParams(temperature=1.4, top_p=0.8), SamplingParams(top_k=10, top_p=0.5), SamplingParams(top_p=0.999)]


@pytest.mark.parametrize("params", [[p] * 3 for p in CASES] + [CASES, CASES[2:]],
                         ids=[f"{p}" for p in range(len(CASES))] + ["mixed", "mixed_truncated"])
def test_probabilities_match_a_full_sort(params):
    logits = torch.randn(len(params), 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    dist = probabilities(logits, params)
    for i, p in enumerate(params):
        torch.testing.assert_close(dist.dense(i), reference_probabilities(logits[i], p))


def test_top_k_and_top_p_rows_keep_only_their_survivors():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3
    top_k = probabilities(logits, [SamplingParams(top_k=3), SamplingParams(top_k=5)] * 2)
    assert top_k.ids.shape == (4, 5) and top_k.probs[0::2, 3:].eq(0).all()  # the widest top-k, zeros after
    nucleus = probabilities(logits, [SamplingParams(top_p=0.5)] * 4)
    widths = [int((reference_probabilities(row, SamplingParams(top_p=0.5)) > 0).sum()) for row in logits]
    assert nucleus.ids.shape == (4, max(widths))
    dense = probabilities(logits, [SamplingParams(top_k=3), SamplingParams()] * 2)
    assert dense.ids is None and dense.probs.shape == (4, 50)  # a row without truncation: dense rows


def test_compact_rows_read_map_and_concatenate():
    shared = Dist(torch.tensor([[0.25, 0.75], [1.0, 0.0]]), torch.tensor([1, 3]), 5)
    assert shared.prob(0, 3) == 0.75 and shared.prob(0, 2) == 0 and shared.dense(1).tolist() == [0, 1, 0, 0, 0]
    assert shared[1:].ids is shared.ids and Dist.cat([shared[:1], shared[1:]]).ids is shared.ids
    own = Dist(torch.tensor([[0.5, 0.5, 0.0]]), torch.tensor([[4, 0, 2]]), 5)
    both = Dist.cat([shared, own])  # one support each, padded to the widest with probability 0
    assert both.ids.tolist() == [[1, 3, 0], [1, 3, 0], [4, 0, 2]]
    assert [both.dense(i).tolist() for i in range(3)] == [[0, 0.25, 0, 0.75, 0], [0, 1, 0, 0, 0], [0.5, 0, 0, 0, 0.5]]
    mapped = own.onto(torch.tensor([7, 8, 9, 10, 11]), 12)  # a drafter's ids onto its target's
    assert mapped.ids.tolist() == [[11, 7, 9]] and mapped.vocab == 12 and mapped.prob(0, 11) == 0.5
    assert Dist(torch.tensor([[0.0, 1.0]]), None, 2).onto(torch.tensor([3, 4]), 6).dense(0).tolist() == [0, 0, 0, 0, 1, 0]


@pytest.mark.parametrize("scale,widths", [(8.0, [10]), (0.5, [10, 50]), (0.02, [10, 50])],
                         ids=["nucleus_within", "wider", "whole_row"])
def test_top_p_alone_looks_among_the_most_likely_tokens_first(monkeypatch, scale, widths):
    """Rows with top-p and no top-k look at the NUCLEUS_WIDTH most likely tokens (here 2, or the
    widest top-k, 10), then 8 times as many (here the whole row) while those hold less than top-p."""
    monkeypatch.setattr(sampling, "NUCLEUS_WIDTH", 2)
    seen, topk = [], torch.Tensor.topk
    monkeypatch.setattr(torch.Tensor, "topk", lambda t, k, **kw: seen.append(k) or topk(t, k, **kw))
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * scale
    params = [SamplingParams(top_p=0.9), SamplingParams(top_k=10, top_p=0.5), SamplingParams(temperature=0.7, top_p=0.8)] * 2
    dist = probabilities(logits, params)
    assert seen == widths
    for i, p in enumerate(params):
        torch.testing.assert_close(dist.dense(i), reference_probabilities(logits[i], p))
