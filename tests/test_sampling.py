import torch

from minedraft.sampling import SamplingParams, probabilities


def test_greedy_is_one_hot_at_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9]])
    assert probabilities(logits, [SamplingParams(temperature=0)]).tolist() == [[0, 1, 0, 0]]


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
