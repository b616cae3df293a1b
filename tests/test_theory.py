import pytest

from minedraft.theory import (acceptance_by_position, expected_tokens_by_position, mean_step_seconds, psd_speedup,
                              psd_speedup_equal_concurrency, step_seconds)


def test_psd_speedup_is_two_when_draft_and_verify_cost_the_same():
    assert psd_speedup(0.1, 0.1) == 2
    assert psd_speedup(0.3, 0.1) == pytest.approx(4 / 3)
    # Linear costs: V(2b) = 2 V(b), t(2b) = 2 t(b) gives the same figure.
    assert psd_speedup_equal_concurrency(0.6, 0.2, 0.3, 0.1) == pytest.approx(4 / 3)


def test_acceptance_by_position_counts_each_draft_only_where_it_was_reached():
    # (drafted, accepted): draft 1 tried by the four rows that drafted, accepted by three;
    # draft 2 reached by those three, accepted by two; draft 3 drafted and reached by one only.
    rows = [(3, 3), (3, 1), (3, 0), (2, 2), (0, 0)]
    assert acceptance_by_position(rows) == pytest.approx([3 / 4, 2 / 3, 1.0])
    assert acceptance_by_position([]) == []


def test_expected_tokens_by_position():
    assert expected_tokens_by_position([0.5], 2) == pytest.approx((1 - 0.5**3) / (1 - 0.5))  # one rate: geometric
    assert expected_tokens_by_position([1.0], 4) == 5 and expected_tokens_by_position([0.0], 4) == 1
    assert expected_tokens_by_position([0.5, 0.2], 3) == pytest.approx(1 + 0.5 + 0.1 + 0.02)  # last rate reused
    assert expected_tokens_by_position([], 4) == 1
    assert expected_tokens_by_position([0.9, 0.9], 0) == 1


def test_step_time():
    assert step_seconds(0.3, 0.1, parallel=False) == pytest.approx(0.4)
    assert step_seconds(0.3, 0.1, parallel=True) == pytest.approx(0.3)
    # Sequential steps: mean V + mean t. Overlapped: verification j beside drafting j + 1; one slow
    # drafting step (0.5 s, a catch-up on new prompts) costs what it outlasts its verification by.
    verify, draft = [0.2, 0.2, 0.2, 0.2], [0.9, 0.1, 0.5, 0.1]
    assert mean_step_seconds(verify, draft, overlapped_share=0.0) == pytest.approx(0.2 + 0.4)
    assert mean_step_seconds(verify, draft, overlapped_share=1.0) == pytest.approx((0.2 + 0.5 + 0.2) / 3)
    assert mean_step_seconds(verify, draft, overlapped_share=0.5) == pytest.approx((0.6 + 0.3) / 2)
