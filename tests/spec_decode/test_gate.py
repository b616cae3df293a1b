import pytest

from minedraft.engine.sequence import Sequence
from minedraft.sampling import SamplingParams
from minedraft.spec_decode.gate import ModelGate


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def seqs(n: int) -> list[Sequence]:
    return [Sequence(i, "", 0, None, [1, 2], SamplingParams(), None, None) for i in range(n)]


def run_rounds(gate: ModelGate, clock: Clock, rows: list[Sequence], rounds: int, on: tuple[float, int],
               off: tuple[float, int]) -> list[bool]:
    """Rounds where the model's arm takes on = (seconds, tokens emitted) and the other off."""
    arms = []
    for _ in range(rounds):
        gate.observe(rows)
        arm = gate.choose(rows)
        seconds, tokens = on if arm else off
        clock.now += seconds
        rows[0].output_token_ids += [3] * tokens
        arms.append(arm)
    return arms


def test_the_gate_plays_the_quicker_arm_and_explores_the_other_ever_more_rarely():
    clock = Clock()
    gate = ModelGate(explore_every=8, max_interval=64, clock=clock)
    rows = seqs(2)
    # The model: 5 tokens in 30 ms; without it 2 in 10 ms (1.2x quicker).
    arms = run_rounds(gate, clock, rows, 200, on=(0.030, 5), off=(0.010, 2))
    assert arms[:2] == [True, False]  # each arm is measured first
    assert not gate.best() and gate.rate(False) > gate.rate(True)
    # From there on the model drafts only in the tries: rounds 8, 16, 32, 64, 128, 192.
    assert [i + 1 for i, arm in enumerate(arms) if arm][1:] == [8, 16, 32, 64, 128, 192]
    # The model gets better (8 tokens in 20 ms): its next try (round 256) beats the other arm, so
    # the one after comes 8 rounds later, where the model's average overtakes and it stays on (round
    # 280 tries the other arm).
    arms = run_rounds(gate, clock, rows, 80, on=(0.020, 8), off=(0.010, 2))
    assert [i + 201 for i, arm in enumerate(arms) if arm] == [256] + list(range(264, 280)) and gate.best()


def test_rounds_where_sequences_came_or_went_are_not_measured():
    clock = Clock()
    gate = ModelGate(clock=clock)
    rows = seqs(3)
    gate.observe(rows)
    assert gate.choose(rows)
    clock.now += 5.0  # say a prompt was prefilled, and a sequence finished
    gate.observe(rows[:2])
    assert gate.rate(True) is None
    gate.choose(rows[:2])
    clock.now += 0.5
    rows[0].output_token_ids += [3, 3]
    gate.observe(rows[:2])
    assert gate.rate(True) == 4.0  # 2 tokens in 0.5 s


def test_a_round_without_a_choice_is_not_measured():
    """Every row took the lookup's draft: the model was not asked either way."""
    clock = Clock()
    gate = ModelGate(clock=clock)
    rows = seqs(1)
    gate.observe(rows)
    gate.choose(rows)
    clock.now += 1.0
    gate.observe(rows)  # measured (0 tokens in 1 s); no choice follows
    clock.now += 1.0
    rows[0].output_token_ids += [3] * 5
    gate.observe(rows)
    assert gate.rate(True) == 0.0 and gate.rounds == 1


def test_psds_two_sub_batches_are_measured_each_from_its_own_last_round():
    clock = Clock()
    gate = ModelGate(clock=clock)
    a, b = seqs(4)[:2], seqs(4)[2:]
    for group in (a, b, a):  # a's round runs from its proposal to its next, over b's
        gate.observe(group)
        gate.choose(group)
        clock.now += 0.1
        group[0].output_token_ids += [3] * 3
    assert gate.rate(True) == pytest.approx(3 / 0.2)  # a's round: its 3 tokens over its step and b's


def test_a_round_far_slower_than_its_arms_mean_is_not_measured():
    """Say a waiting prompt's chunks rode on it: 30x a normal round."""
    clock = Clock()
    gate = ModelGate(explore_every=1000, decay=1.0, clock=clock)
    gate.best = lambda: True  # the model's arm every round
    rows = seqs(1)
    for seconds in (0.01, 0.01, 0.3, 0.01, 0.03):
        gate.observe(rows)
        gate.choose(rows)
        clock.now += seconds
        rows[0].output_token_ids += [3]
    gate.observe(rows)
    assert gate.rate(True) == pytest.approx(4 / 0.06)  # 0.3 s left out; 0.03 s (3x) kept
