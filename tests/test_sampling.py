import json

import pytest
import torch

from minedraft.sampling import MIN_TEMPERATURE, SamplingParams, probabilities, sample, top_logprobs


def test_greedy_is_one_hot_at_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9]])
    assert probabilities(logits, [SamplingParams(temperature=0)]).tolist() == [[0, 1, 0, 0]]


def test_greedy_and_sampled_rows_in_one_batch():
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3], [0.2, 0.3, 0.5]], dtype=torch.float64))
    probs = probabilities(logits, [SamplingParams(temperature=0), SamplingParams(), SamplingParams(temperature=0)])
    assert probs[0].tolist() == [0, 1, 0] and probs[2].tolist() == [0, 0, 1]
    torch.testing.assert_close(probs[1], torch.tensor([0.5, 0.2, 0.3], dtype=torch.float64))
    tokens = sample(probs, [None, torch.Generator().manual_seed(0), None])
    assert tokens[0] == 1 and tokens[2] == 2 and tokens[1] in (0, 1, 2)


def test_temperature_top_k_and_top_p_per_row():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]] * 4, dtype=torch.float64))
    params = [SamplingParams(), SamplingParams(top_k=2), SamplingParams(top_p=0.65), SamplingParams(temperature=0.5)]
    probs = probabilities(logits, params)
    torch.testing.assert_close(probs[0], torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64))
    torch.testing.assert_close(probs[1], torch.tensor([4 / 7, 3 / 7, 0, 0], dtype=torch.float64))
    # 0.4 alone is below 0.65, 0.4 + 0.3 reaches it: the nucleus is the first two tokens.
    torch.testing.assert_close(probs[2], torch.tensor([4 / 7, 3 / 7, 0, 0], dtype=torch.float64))
    sq = torch.tensor([0.16, 0.09, 0.04, 0.01], dtype=torch.float64)
    torch.testing.assert_close(probs[3], sq / sq.sum())


def test_top_p_keeps_at_least_the_top_token():
    logits = torch.tensor([[5.0, 0.0, 0.0]])
    probs = probabilities(logits, [SamplingParams(top_p=0.01)])
    assert probs.tolist() == [[1.0, 0.0, 0.0]]


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
    probs = probabilities(logits, [params])
    assert torch.isfinite(probs).all() and probs[0, 0] > 0.99


def test_as_dict_rebuilds_the_same_params():
    params = SamplingParams(n=2, temperature=0.5, top_k=4, stop=["a", "bc"], stop_token_ids=[3], seed=9, logprobs=2)
    rebuilt = SamplingParams(**json.loads(json.dumps(params.as_dict())))
    assert rebuilt == params and rebuilt.stop_strings == params.stop_strings
