"""The shared draft loop with a reduced-vocabulary drafter: drafts drawn over its own tokens and
mapped to the target's, their distributions kept over those tokens."""

import torch

from minedraft.sampling import SamplingParams
from minedraft.spec_decode.chain import draft_chain
from minedraft.spec_decode.tetris import select_lengths

IDS = torch.tensor([7, 2, 9, 4])  # the drafter's token j is the target's IDS[j]; the target has 12


def chain(params, num_tokens, capacity=None):
    logits = torch.randn(len(params), 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    gens = [None if p.greedy else torch.Generator().manual_seed(i) for i, p in enumerate(params)]
    return logits, draft_chain(lambda rows, last: logits[rows], params, gens, num_tokens, capacity, (IDS, 12))


def test_greedy_rows_draft_the_mapped_argmax_and_carry_no_distribution():
    logits, (drafts, dists) = chain([SamplingParams(temperature=0)] * 2, [3, 1])
    assert drafts == [[int(IDS[logits[0].argmax()])] * 3, [int(IDS[logits[1].argmax()])]]
    assert dists == [None, None]


def test_sampled_rows_keep_their_distribution_over_the_draft_vocabulary():
    logits, (drafts, dists) = chain([SamplingParams(temperature=0), SamplingParams(temperature=0.5)], [2, 3])
    assert dists[0] is None and set(drafts[1]) <= set(IDS.tolist())
    q = dists[1]
    assert q.ids is IDS and q.probs.shape == (3, 4) and q.vocab == 12  # no [rows, 12] fill
    expected = torch.zeros(12, dtype=torch.float64).index_add_(0, IDS, torch.softmax(logits[1] / 0.5, -1))
    torch.testing.assert_close(q.dense(0), expected)
    assert all(q.prob(j, x) > 0 for j, x in enumerate(drafts[1]))


def test_top_k_rows_keep_their_survivors_as_target_ids():
    logits, (drafts, dists) = chain([SamplingParams(top_k=2), SamplingParams(top_k=2)], [2, 2])
    for row, q, d in zip(logits, dists, drafts):
        assert q.ids.shape == (2, 2) and sorted(q.ids[0].tolist()) == sorted(IDS[row.topk(2).indices].tolist())
        assert all(x in q.ids[j].tolist() for j, x in enumerate(d))


def test_tetris_ranks_reduced_vocabulary_rows_by_their_own_confidence():
    logits, (drafts, _) = chain([SamplingParams(temperature=0)] * 2, [3, 3], capacity=3)
    mode = torch.softmax(logits, -1).amax(-1).tolist()  # the step returns the same logits each time
    assert list(map(len, drafts)) == select_lengths([[m] * 3 for m in mode], 3)
