"""psd's choice between overlapping its sub-batches and merging them (minedraft.engine.overlap)."""

import pytest

from minedraft.engine.overlap import DecayedLine, OverlapPolicy


def test_the_line_fits_recent_points_and_never_slopes_down():
    line = DecayedLine(decay=0.9)
    for x in (2, 4, 6, 8):
        line.observe(x, 0.010 + 0.002 * x)
    assert line(5) == pytest.approx(0.020) and line(0) == pytest.approx(0.010)
    falling = DecayedLine(decay=0.9)
    for x in (2, 4):
        falling.observe(x, 0.1 / x)
    assert falling(2) == falling(100) == pytest.approx((0.9 * 0.05 + 0.025) / 1.9)  # flat at the weighted mean


def learn(policy: OverlapPolicy, verify_fixed: float, per_token: float, draft_fixed: float, per_row: float) -> None:
    """Steps of 3..8 rows with k = 3: a target pass costs verify_fixed + per_token * tokens, a
    drafting round draft_fixed + per_row * rows."""
    for rows in (3, 4, 5, 6, 7, 8) * 3:
        policy.observe_verify(4 * rows, verify_fixed + per_token * 4 * rows)
        policy.observe_draft(rows, draft_fixed + per_row * rows)


def test_merges_where_a_pass_costs_more_than_drafting_the_whole_batch():
    # The bundled pair on a CPU core: a pass streams the weights (45 ms), a head drafts 8 rows in 21 ms.
    cpu = OverlapPolicy()
    assert cpu.round_seconds(8, 32) is None and cpu.overlap(8, 32)  # nothing learnt: psd as asked
    learn(cpu, 0.045, 0.0015, 0.005, 0.002)
    overlapped, merged = cpu.round_seconds(8, 32)
    assert overlapped == pytest.approx(2 * (0.045 + 0.0015 * 16)) and merged == pytest.approx(0.045 + 0.048 + 0.021)
    assert not cpu.overlap(8, 32)
    # A big drafter on its own device: drafting costs about what verifying does.
    gpu = OverlapPolicy()
    learn(gpu, 0.020, 0.0002, 0.015, 0.001)
    assert gpu.overlap(8, 32)


def test_a_switch_needs_a_clear_margin():
    policy = OverlapPolicy(margin=0.1)
    learn(policy, 0.030, 0.001, 0.025, 0.001)  # overlapped 2 * 0.046 = 0.092, merged 0.062 + 0.033 = 0.095
    assert policy.overlap(8, 32)  # merged is not 10% quicker: stay
    learn(policy, 0.045, 0.0015, 0.005, 0.002)
    assert not policy.overlap(8, 32)
    learn(policy, 0.030, 0.001, 0.025, 0.001)
    assert not policy.overlap(8, 32)  # nor is overlapping now: stay merged
    learn(policy, 0.010, 0.0002, 0.030, 0.001)
    assert policy.overlap(8, 32)


def test_a_cost_seen_at_one_size_is_taken_as_proportional():
    single = DecayedLine(decay=0.9)
    single.observe(4, 0.02)
    assert single(8) == pytest.approx(0.04) and single(2) == pytest.approx(0.01)
    policy = OverlapPolicy()
    for _ in range(20):
        policy.observe_verify(32, 0.1)
        policy.observe_draft(8, 0.001)
    assert policy.round_seconds(8, 32) == pytest.approx((0.1, 0.101)) and policy.overlap(8, 32)
