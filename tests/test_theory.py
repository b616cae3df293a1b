import pytest

from minedraft.theory import expected_tokens, psd_speedup, psd_speedup_equal_concurrency


def test_expected_tokens():
    assert expected_tokens(0.0, 4) == 1
    assert expected_tokens(1.0, 4) == 5
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_psd_speedup_is_two_when_draft_and_verify_cost_the_same():
    assert psd_speedup(0.1, 0.1) == 2
    assert psd_speedup(0.3, 0.1) == pytest.approx(4 / 3)
    # Linear costs: V(2b) = 2 V(b), t(2b) = 2 t(b) gives the same figure.
    assert psd_speedup_equal_concurrency(0.6, 0.2, 0.3, 0.1) == pytest.approx(4 / 3)
