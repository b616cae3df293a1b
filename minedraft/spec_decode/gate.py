"""With `"num_speculative_tokens": "auto"`, whether the model behind a prompt lookup drafts the rows
the lookup found nothing for: only while that yields more tokens per second than leaving those
rows undrafted.

At one request in flight on a CPU the bundled EAGLE-3 head loses (docs/BENCHMARKS.md, "Which
drafter pays at 1 in flight"): its drafts are kept too rarely to pay for its steps and the longer
verifications, while the lookup alone, which costs microseconds, pays. Elsewhere (a better head, a
drafter on a GPU of its own) it may pay. Rather than model every cost, the gate measures the
thing it maximises: tokens emitted per second of wall clock, by arm (model on or off), over the
rounds where the choice mattered (some row missed the lookup). It plays the better arm, and at
times the other (spec_decode/exploration.py: after 8 such rounds, then 16, 32, 64 while the choice
holds; again after 8 when a try beat the better arm's rate), so a change in either is seen;
switching the model back on costs its catch-up on the tokens it missed, which that round's time
includes. In psd, drafting hidden behind verification costs nothing here, as it should.

A round runs from one proposal for a set of sequences to the next for the same set (psd alternates
two sets); rounds where sequences joined or left are not measured (admissions and idle time would
land in one arm only), nor rounds over `outlier` times the arm's mean (a waiting prompt's chunks
rode on them). The choice depends only on the past, never on the drafts being verified, so it keeps
the output distribution exact.
"""

import time
from collections.abc import Callable

from minedraft.engine.sequence import Sequence
from minedraft.spec_decode.exploration import Exploration


class ModelGate:
    def __init__(self, explore_every: int = 8, max_interval: int = 64, decay: float = 0.97, outlier: float = 4.0,
                 clock: Callable[[], float] = time.perf_counter):
        self.exploration = Exploration(explore_every, max_interval)
        self.decay, self.outlier, self.clock = decay, outlier, clock
        # Decayed sums per arm (True: the model drafted): rounds measured, tokens emitted, seconds.
        self.count = {True: 0.0, False: 0.0}
        self.tokens = {True: 0.0, False: 0.0}
        self.seconds = {True: 0.0, False: 0.0}
        self.rounds = 0  # rounds where the choice mattered
        # Rounds under way by set of sequences: arm, lengths by seq_id, start.
        self.pending: dict[frozenset[int], tuple[bool, dict[int, int], float]] = {}

    def rate(self, arm: bool) -> float | None:
        """Tokens per second measured for `arm` (None: not measured yet)."""
        return self.tokens[arm] / self.seconds[arm] if self.seconds[arm] > 0 else None

    def best(self) -> bool:
        """The arm to play: the model first, then the other while unmeasured, then the quicker."""
        on, off = self.rate(True), self.rate(False)
        if on is None or off is None:
            return on is None
        return on >= off

    def observe(self, seqs: list[Sequence]) -> None:
        """A proposal for `seqs` begins: the round before it over the same sequences, if any, ends."""
        now = self.clock()
        round_ = self.pending.pop(frozenset(s.seq_id for s in seqs), None)
        if round_ is None:
            return
        arm, lengths, start = round_
        seconds = now - start
        if seconds <= 0 or (self.count[arm] and seconds > self.outlier * self.seconds[arm] / self.count[arm]):
            return
        d, tokens, other = self.decay, sum(len(s) - lengths[s.seq_id] for s in seqs), self.rate(not arm)
        self.count[arm] = d * self.count[arm] + 1
        self.tokens[arm] = d * self.tokens[arm] + tokens
        self.seconds[arm] = d * self.seconds[arm] + seconds
        if arm != self.best() and other is not None and tokens / seconds > other:  # a try that did well
            self.exploration.soon(self.rounds)

    def choose(self, seqs: list[Sequence]) -> bool:
        """Whether the model drafts in this round of `seqs`, some of whose rows the lookup missed."""
        self.rounds += 1
        arm = self.best()
        if self.exploration.due(self.rounds, arm):
            arm = not arm
        if len(self.pending) >= 2:  # psd's two sub-batches at most; an older set will not recur
            del self.pending[next(iter(self.pending))]
        self.pending[frozenset(s.seq_id for s in seqs)] = (arm, {s.seq_id: len(s) for s in seqs}, self.clock())
        return arm

    def as_dict(self) -> dict:
        return {"model_drafts": self.best(), "tokens_per_s": {"model": self.rate(True), "lookup_alone": self.rate(False)}}
