import random

import torch

from minedraft.engine.sequence import Sequence
from minedraft.sampling import Dist, SamplingParams
from minedraft.spec_decode.base import Proposer
from minedraft.spec_decode.ngram import LookupFirst, NgramProposer, lookup


def test_lookup_takes_the_longest_suffix_and_its_latest_occurrence():
    tokens = [1, 2, 3, 9, 2, 3, 8, 7, 1, 2, 3]
    # "1 2 3" occurred at 0 (followed by 9 2); "2 3" alone also at 4 (followed by 8): longest wins.
    assert lookup(tokens, 1, 3, 2) == [9, 2]
    assert lookup(tokens, 1, 2, 2) == [8, 7]  # "2 3": the latest earlier occurrence
    assert lookup(tokens, 1, 3, 10) == [9, 2, 3, 8, 7, 1, 2, 3]  # stops at the end of the sequence


def test_lookup_without_a_match_proposes_nothing():
    assert lookup([1, 2, 3, 4], 1, 3, 4) == []
    assert lookup([5], 1, 3, 4) == []
    assert lookup([4, 6, 4], 2, 3, 4) == []  # only a 1-gram repeats, below min_n


class FakeModel(Proposer):
    """Drafts token 99 for every row asked, and records what it was asked."""

    aux_layers = (1, 2)

    def __init__(self):
        self.asked, self.released = [], []

    def propose(self, seqs, num_tokens, generators, capacity=None):
        self.asked.append(list(num_tokens))
        drafts = [[99] * n for n in num_tokens]
        return drafts, [Dist(torch.full((n, 3), 1 / 3), torch.tensor([97, 98, 99]), 100) if n and g is not None else None
                        for n, g in zip(num_tokens, generators)]

    def release(self, seq):
        self.released.append(seq.seq_id)


def seq(seq_id, tokens):
    return Sequence(seq_id, "", 0, None, tokens[:2], SamplingParams(), None, None, tokens[2:])


def test_lookup_first_drafts_rows_with_a_match_and_asks_the_model_for_the_rest():
    model = FakeModel()
    proposer = LookupFirst(model, NgramProposer(2, 3, 100, torch.float64))
    assert proposer.aux_layers == (1, 2)  # the engine sends the model's states through the wrapper
    rows = [seq(0, [1, 2, 3, 1, 2]), seq(1, [4, 5, 6, 7]), seq(2, [8, 9, 8, 9])]
    gen = torch.Generator()
    drafts, dists = proposer.propose(rows, [3, 3, 2], [None, gen, gen])
    assert drafts == [[3, 1, 2], [99, 99, 99], [8, 9]]
    assert model.asked == [[0, 3, 0]]  # the matched rows are not drafted twice
    assert dists[0] is None  # greedy
    assert dists[1].ids.tolist() == [97, 98, 99]  # the model's distribution for its row
    assert dists[2].ids[:, 0].tolist() == [8, 9] and dists[2].probs.flatten().tolist() == [1.0, 1.0]  # certain
    assert proposer.propose(rows[:1], [2], [None]) == ([[3, 1]], [None]) and len(model.asked) == 1
    proposer.release(rows[1])
    assert model.released == [1]


def brute_force_lookup(tokens, min_n, max_n, k):
    """The definition, spelled out: longest suffix first, then its latest earlier occurrence."""
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tokens[-n:]:
                return tokens[start + n : start + n + k]
    return []


def test_lookup_agrees_with_the_definition_on_random_sequences():
    rng = random.Random(0)
    for _ in range(5000):
        tokens = [rng.randrange(rng.choice([2, 3, 5, 20])) for _ in range(rng.randrange(0, 40))]
        min_n = rng.randrange(1, 4)
        args = (tokens, min_n, rng.randrange(min_n, 6), rng.randrange(1, 6))
        assert lookup(*args) == brute_force_lookup(*args), args


def test_lookup_first_under_auto_asks_the_model_only_while_its_gate_says_so():
    model = FakeModel()
    proposer = LookupFirst(model, NgramProposer(2, 3, 100, torch.float64))
    assert proposer.choices() == {}  # a fixed k: the model drafts every row the lookup missed
    proposer.adapt(True)
    rows = [seq(0, [1, 2, 3, 1, 2]), seq(1, [4, 5, 6, 7])]
    assert proposer.propose(rows, [3, 3], [None, None])[0] == [[3, 1, 2], [99, 99, 99]]  # first, the model
    assert proposer.propose(rows, [3, 3], [None, None])[0] == [[3, 1, 2], []]  # then without it
    assert model.asked == [[0, 3]]
    assert proposer.propose(rows[:1], [3], [None])[0] == [[3, 1, 2]] and proposer.gate.rounds == 2  # no choice
    assert set(proposer.choices()["model_gate"]) == {"model_drafts", "tokens_per_s"}
    proposer.adapt(False)
    assert proposer.gate is None

