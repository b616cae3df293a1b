import pytest

from minedraft.spec_decode.draft_length import DraftLengthController


def feed(c: DraftLengthController, steps: int, alpha_rows, verify, draft_per_token: float, running: int = 10) -> None:
    """`steps` rounds at the k the controller plans for `running` sequences: drafting and
    verification times from the given cost functions, rows (drafted, accepted) from `alpha_rows(k)`."""
    for _ in range(steps):
        k = c.plan(running)
        c.observe_draft(k * draft_per_token, k)
        c.observe_verify(verify(k), k, alpha_rows(k))


def test_acceptance_is_estimated_per_draft_position():
    c = DraftLengthController(parallel=False, decay=0.5)
    assert c.acceptance == [0.5]  # the prior: draft 1 kept in two of four trials
    # (drafted, accepted): draft 1 reached by 3 rows, kept by 2; draft 2 reached by 2, kept by 1;
    # drafts 3 and 4 reached and kept by 1.
    rows = [(4, 4), (4, 0), (4, 1), (0, 0)]
    c.observe_verify(0.1, 4, rows)
    assert c.acceptance == pytest.approx([(0.5 * 2 + 2) / (0.5 * 4 + 3), 0.5, 1, 1])
    for _ in range(40):  # the prior decays away
        c.observe_verify(0.1, 4, rows)
    assert c.acceptance == pytest.approx([2 / 3, 0.5, 1, 1])
    assert c.expected_tokens(2) == pytest.approx(1 + 2 / 3 + 1 / 3)
    assert c.expected_tokens(6) == pytest.approx(1 + 2 / 3 + 5 * 1 / 3)  # past position 4: its rate again
    for _ in range(40):  # one draft per row from now on: positions 2..4 are no longer measured
        c.observe_verify(0.1, 1, [(1, 1), (1, 0)])
    assert c.acceptance == pytest.approx([0.5])


def test_verify_time_is_a_line_through_the_measured_points():
    c = DraftLengthController(parallel=False)
    c.observe_verify(0.10, 1, [(1, 1)])
    assert c.predicted_verify(5, 1) == pytest.approx(0.10)  # one point: flat
    assert c.predicted_verify(0, 1) == pytest.approx(0.10)  # no plain step seen: the drafted one
    c.observe_verify(0.14, 3, [(3, 3)])
    assert c.predicted_verify(5, 1) == pytest.approx(0.18)
    assert c.predicted_verify(2, 1) == pytest.approx(0.12)
    # No plain step measured: it is priced as the shortest drafts, not the line run down to k = 0
    # (0.08), which could even call it free.
    assert c.predicted_verify(0, 1) == pytest.approx(0.10)


def test_high_acceptance_and_cheap_drafts_choose_long_drafts():
    c = DraftLengthController(parallel=False)
    feed(c, 64, lambda k: [(k, k)] * 9 + [(k, 0)], verify=lambda k: 0.05 + 0.002 * k, draft_per_token=0.001)
    assert c.best_k(10) == c.max_k


def test_low_acceptance_and_costly_drafts_switch_speculation_off():
    c = DraftLengthController(parallel=False)
    feed(c, 64, lambda k: [(k, 0)] * 9 + [(k, 1)], verify=lambda k: 0.05 + 0.01 * k, draft_per_token=0.01)
    assert c.best_k(10) == 0
    assert c.expected_tokens(0) == 1


def test_middling_acceptance_and_costly_verification_choose_one_token():
    # alpha = 0.5; verify 50 ms + 20 ms per draft; drafts 1 ms: tokens per second 20 (k = 0), 21.1 (k = 1), 19.0 (k = 2).
    c = DraftLengthController(parallel=False)
    feed(c, 64, lambda k: [(k, min(k, 1))] * 5 + [(k, 0)] * 5 if k else [], verify=lambda k: 0.05 + 0.02 * k,
         draft_per_token=0.001)
    assert c.acceptance[0] == pytest.approx(0.5, abs=0.05)
    assert c.best_k(10) == 1


def test_a_drafter_good_at_its_first_token_only_drafts_one():
    # Draft 1 kept 60% of the time, later drafts never: tokens per second 20 (k = 0), 28.6 (k = 1),
    # 25.8 (k = 2), less beyond. One rate for every position would have rated k = 2 at 31.6.
    c = DraftLengthController(parallel=False)
    feed(c, 64, lambda k: [(k, min(k, 1))] * 6 + [(k, 0)] * 4 if k else [], verify=lambda k: 0.05 + 0.005 * k,
         draft_per_token=0.001)
    assert c.acceptance[:2] == pytest.approx([0.6, 0.0], abs=0.02)
    assert c.best_k(10) == 1


def test_psd_drafts_only_as_long_as_verification_hides_it():
    # Verification 50 ms whatever k; 12 ms per drafted token; everything accepted. Sequential SD
    # pays for every drafted token, PSD stops where drafting outlasts verification (k = 4).
    sd, psd = DraftLengthController(parallel=False), DraftLengthController(parallel=True)
    for c in (sd, psd):
        feed(c, 64, lambda k: [(k, k)] * 19 + [(k, 0)], verify=lambda k: 0.05, draft_per_token=0.012)
    assert psd.best_k(10) == 4
    assert sd.best_k(10) > 4 and sd.step_time(4, 10) > psd.step_time(4, 10)


def test_exploration_visits_both_neighbours():
    c = DraftLengthController(parallel=False, explore_every=4)
    seen = set()
    for _ in range(40):
        seen.add(c.plan(1))
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
    assert c.predicted_rows(0, 8) == 8 and c.predicted_rows(1, 8) == 4
    assert (c.best_k(8) > 0) == speculate


def test_verification_times_are_compared_at_the_load_of_the_step_planned():
    # A quarter of one-token drafts kept; drafting 1 ms. A plain step over 8 sequences takes 49 ms,
    # one with drafts 70 ms: a plain step wins (163 tokens/s against 8 * 1.25 / 0.071 = 141). Over
    # 4, 30 ms against 32 ms: drafting wins (133 against 4 * 1.25 / 0.033 = 152). Comparing the last
    # drafted time (32 ms, taken over 4) with the last plain one (49 ms, over 8) would have made
    # drafting look quicker over 8 too.
    c = DraftLengthController(parallel=False, explore_every=1000)
    for rows, plain, drafted in ((8, 0.049, 0.070), (4, 0.030, 0.032)):
        for _ in range(30):
            c.observe_draft(0.001, 1)
            c.observe_verify(drafted, 1, [(1, 1)] * (rows // 4) + [(1, 0)] * (rows - rows // 4))
            c.observe_verify(plain, 0, [(0, 0)] * rows)
    assert c.predicted_verify(0, 8) == pytest.approx(0.049) and c.predicted_verify(1, 4) == pytest.approx(0.032)
    assert c.best_k(8) == 0 and c.best_k(4) > 0
    # A load never measured takes the nearest one measured (the larger on a tie).
    assert c.best_k(7) == 0 and c.best_k(6) == 0 and c.best_k(5) > 0 and c.best_k(1) > 0
    assert c.plan(8) == 0 and c.plan(4) == 0  # chosen once per verification learned from
    c.observe_verify(0.030, 0, [(0, 0)] * 4)
    assert c.plan(4) > 0


def test_what_drafts_add_is_carried_to_a_load_where_only_plain_steps_were_measured():
    # Over 8 rows a plain step takes 46 ms and one-token drafts add 16 ms (2 ms a row); over 1 row
    # only a plain step (13 ms) was measured, as when a batch ends. Priced as the 62 ms measured over
    # 8, k = 1 could never pay over 1 row; carried over, it costs 13 + 16 / 8 = 15 ms and, with half
    # the drafts kept (1.5 tokens in 15 + 1 ms against 1 in 13), it does.
    c = DraftLengthController(parallel=False, explore_every=1000)
    for _ in range(30):
        c.observe_draft(0.001, 1)
        c.observe_verify(0.062, 1, [(1, 1), (1, 0)] * 4)
        c.observe_verify(0.046, 0, [(0, 0)] * 8)
    c.observe_verify(0.013, 0, [(0, 0)])
    assert c.predicted_verify(1, 1) == pytest.approx(0.015)
    assert c.predicted_verify(1, 8) == pytest.approx(0.062) and c.predicted_verify(0, 1) == pytest.approx(0.013)
    assert c.best_k(1) > 0  # drafting pays there
    # Not carried where a plain step is known at one load only: the drafted time as measured.
    c = DraftLengthController(parallel=False)
    c.observe_verify(0.062, 1, [(1, 1)] * 8)
    c.observe_verify(0.013, 0, [(0, 0)])
    assert c.predicted_verify(1, 1) == pytest.approx(0.062)


def test_explorations_grow_rarer_while_the_choice_holds():
    c = DraftLengthController(parallel=False, explore_every=8, max_interval=64)
    drafted_steps = []
    for step in range(400):
        if c.plan(4):
            drafted_steps.append(step)
        c.observe_draft(0.01 * c.k, c.k)
        c.observe_verify(0.05 + 0.02 * c.k, c.k, [(c.k, 0)] * 4)  # nothing accepted: k = 0 is best
    # The start (k = 2, then a plain step: measured before anything is weighed against it), then
    # explorations of k = 1 (none below 0) 8, 8, 16, 32, 64, 64, ... steps apart.
    assert drafted_steps == [0, 8, 16, 32, 64, 128, 192, 256, 320, 384]


def test_k_climbs_one_measured_step_at_a_time():
    # Two noisy points whose line is flat would make k = 8 look as cheap as k = 2; the next k
    # considered is one past the longest measured.
    c = DraftLengthController(parallel=False, explore_every=1000)
    assert c.plan(4) == 2  # start_k
    c.observe_verify(0.068, 2, [(2, 2)] * 4)
    assert c.plan(4) == 0  # then a plain step, before anything is weighed against it
    c.observe_verify(0.050, 0, [(0, 0)] * 4)
    c.observe_verify(0.076, 1, [(1, 1)] * 4)
    assert c.predicted_verify(8, 4) == pytest.approx(0.072)  # the line, flat (its slope is never negative)
    assert c.plan(4) == 3
    c.observe_verify(0.2, 3, [(3, 3)] * 4)
    assert c.plan(4) < 3  # measured: k = 3 costs too much


def test_steps_carrying_prompt_chunks_play_the_best_k_known_and_keep_an_exploration_for_later():
    c = DraftLengthController(parallel=False, explore_every=2)
    assert c.plan(4, learn=False) == 0  # nothing measured: no drafts beside prompt chunks
    assert c.plan(4) == 2  # start_k on the first step to learn from
    c.observe_verify(0.05, 0, [(0, 0)] * 4)
    for _ in range(20):  # drafts cost and are never kept
        c.observe_verify(0.08, 1, [(1, 0)] * 4)
    assert c.plan(4) == 1  # the first exploration: the best (k = 0) and one up
    assert c.plan(4, learn=False) == 0  # a step with chunks plays the best instead
    assert c.plan(4) == 1  # and the exploration waits for the next step to learn from
