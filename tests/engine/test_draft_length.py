import pytest

from minedraft.engine.draft_length import DraftLengthController


def feed(c: DraftLengthController, steps: int, alpha_rows, verify, draft_per_token: float) -> None:
    """`steps` rounds at the controller's own k: drafting and verification times from the
    given cost functions, rows (drafted, accepted) from `alpha_rows(k)`."""
    for _ in range(steps):
        k = c.k
        c.observe_draft(k * draft_per_token, k)
        c.observe_verify(verify(k), k, alpha_rows(k))


def test_acceptance_estimate_counts_trials_up_to_the_first_rejection():
    c = DraftLengthController(parallel=False, decay=0.5)
    assert c.alpha == 0.5  # the prior: two successes in four trials
    # 4 drafts all kept: 4 trials, 4 kept; 4 drafts none kept: 1 trial; 4 drafts 2 kept: 3 trials.
    c.observe_verify(0.1, 4, [(4, 4), (4, 0), (4, 2), (0, 0)])
    assert c.alpha == pytest.approx((0.5 * 2 + 6) / (0.5 * 4 + 8))
    for _ in range(40):  # the prior decays away
        c.observe_verify(0.1, 4, [(4, 4), (4, 0), (4, 2)])
    assert c.alpha == pytest.approx(6 / 8)
    assert c.expected_tokens(2) == pytest.approx(1 + 0.75 + 0.75**2)


def test_verify_time_is_a_line_through_the_measured_points():
    c = DraftLengthController(parallel=False)
    c.observe_verify(0.10, 1, [(1, 1)])
    assert c.predicted_verify(5) == pytest.approx(0.10)  # one point: flat
    c.observe_verify(0.14, 3, [(3, 3)])
    assert c.predicted_verify(5) == pytest.approx(0.18)
    assert c.predicted_verify(2) == pytest.approx(0.12)


def test_high_acceptance_and_cheap_drafts_choose_long_drafts():
    c = DraftLengthController(parallel=False)
    feed(c, 64, lambda k: [(k, k)] * 9 + [(k, 0)], verify=lambda k: 0.05 + 0.002 * k, draft_per_token=0.001)
    assert c.best_k() == c.max_k


def test_low_acceptance_and_costly_drafts_switch_speculation_off():
    c = DraftLengthController(parallel=False)
    feed(c, 64, lambda k: [(k, 0)] * 9 + [(k, 1)], verify=lambda k: 0.05 + 0.01 * k, draft_per_token=0.01)
    assert c.best_k() == 0
    assert c.expected_tokens(0) == 1


def test_middling_acceptance_and_costly_verification_choose_one_token():
    # alpha = 0.5; verify 50 ms + 20 ms per draft; drafts 1 ms: tokens per second 20 (k = 0), 21.1 (k = 1), 19.0 (k = 2).
    c = DraftLengthController(parallel=False)
    feed(c, 64, lambda k: [(k, min(k, 1))] * 5 + [(k, 0)] * 5 if k else [], verify=lambda k: 0.05 + 0.02 * k,
         draft_per_token=0.001)
    assert c.alpha == pytest.approx(0.5, abs=0.05)
    assert c.best_k() == 1


def test_psd_drafts_only_as_long_as_verification_hides_it():
    # Verification 50 ms whatever k; 12 ms per drafted token; everything accepted. Sequential SD
    # pays for every drafted token, PSD stops where drafting outlasts verification (k = 4).
    sd, psd = DraftLengthController(parallel=False), DraftLengthController(parallel=True)
    for c in (sd, psd):
        feed(c, 64, lambda k: [(k, k)] * 19 + [(k, 0)], verify=lambda k: 0.05, draft_per_token=0.012)
    assert psd.best_k() == 4
    assert sd.best_k() > 4 and sd.step_time(4) > psd.step_time(4)


def test_exploration_visits_both_neighbours():
    c = DraftLengthController(parallel=False, explore_every=4)
    seen = set()
    for _ in range(40):
        seen.add(c.k)
        c.observe_draft(0.01 * c.k, c.k)
        c.observe_verify(0.05, c.k, [(c.k, 0)])  # nothing accepted: k = 0 is best
    assert {0, 1} <= seen and c.k in (0, 1)


@pytest.mark.parametrize("accepted,speculate", [(2, True), (0, False)])
def test_psd_weighs_a_plain_step_over_all_rows_against_a_sub_batch_verification(accepted, speculate):
    # A plain step decodes all 8 sequences in 60 ms; a psd step verifies a sub-batch of 4 in 40 ms.
    # Half the drafts kept: 4 * 1.5 / 0.04 = 150 tokens/s beats 8 / 0.06 = 133; none kept: 4 / 0.04 = 100 does not.
    c = DraftLengthController(parallel=True, explore_every=1000)
    for _ in range(60):
        c.observe_draft(0.01, 1)
        c.observe_verify(0.04, 1, [(1, 1)] * accepted + [(1, 0)] * (4 - accepted))
        c.observe_verify(0.06, 0, [(0, 0)] * 8)
    assert c.predicted_rows(0) == pytest.approx(8) and c.predicted_rows(1) == pytest.approx(4)
    assert (c.best_k() > 0) == speculate
