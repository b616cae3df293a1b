from minedraft.engine.sequence import Sequence
from minedraft.sampling import SamplingParams
from minedraft.spec_decode.hindsight import Hindsight


def seq(seq_id: int) -> Sequence:
    return Sequence(seq_id, "", 0, None, [1, 2], SamplingParams(), None, None)


def test_a_draft_is_scored_by_its_agreement_with_the_tokens_the_target_emits():
    h = Hindsight(k=4)
    a, b, c, d = seq(0), seq(1), seq(2), seq(3)
    h.propose([a, b, c, d], [[5, 6, 7], [5, 6], [], [5, 6, 7, 8, 9]])
    assert h.score([a, b, c, d]) == [(4, 0)]  # no draft: nothing to wait for, rejected at once
    for s, token in zip((a, b, d), (5, 5, 5)):
        s.output_token_ids.append(token)
    assert h.score([a, b, d]) == []  # all agree so far
    a.output_token_ids.append(9)  # a's second draft rejected
    b.output_token_ids.append(6)  # b's two drafts both kept: scored as 2 of the 4 asked
    d.output_token_ids += [6, 7, 8]  # d's draft was cut to the 4 asked, all kept
    assert h.score([a, b, d]) == [(4, 1), (4, 2), (4, 4)]
    assert h.pending == {}


def test_a_pending_draft_is_kept_until_scored_and_dropped_with_its_sequence():
    h = Hindsight(k=2)
    a, b = seq(0), seq(1)
    h.propose([a, b], [[5, 6], [5, 6]])
    h.propose([a], [[7, 8]])  # a's first draft is not scored yet: it stays
    assert h.pending[0][1] == [5, 6]
    assert h.score([a]) == [] and 1 not in h.pending  # b no longer runs


def test_only_sequences_without_a_pending_draft_are_drafted_for():
    h = Hindsight(k=2)
    a, b = seq(0), seq(1)
    h.propose([a], [[5, 6]])
    assert h.undrafted([a, b]) == [b]
