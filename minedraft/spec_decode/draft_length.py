"""`"num_speculative_tokens": "auto"`: each step's draft length chosen from live measurements."""

from itertools import zip_longest

from minedraft.spec_decode.exploration import Exploration
from minedraft.spec_decode.hindsight import Hindsight
from minedraft.theory import count_by_position, expected_tokens_by_position, step_seconds

AUTO_MAX_K = 8  # the longest draft "auto" considers


class DraftLengthController:
    """Picks k in 0..max_k to maximise the expected tokens emitted per second; k = 0 (no drafts:
    a plain decode step over every running sequence) when speculation does not pay.

    Measured live, as exponential moving averages over recent steps:
      acceptance per draft position j: of the rows whose drafts reached position j (asked for that
                 many, every earlier draft accepted), the share that kept draft j; a draft asked
                 for and not made (a prompt lookup with no match) counts as rejected. Positions past
                 those measured take the last measured rate (minedraft.theory, which also gives
                 E[tokens per row](k) from these rates). A weak drafter's first token is accepted
                 far more often than its later ones; one rate for every position would overrate
                 long drafts. While k = 0 is played, a drafter whose drafts cost nothing (prompt
                 lookup) still drafts, unverified, and its drafts are scored against what the target
                 emits (spec_decode/hindsight.py): its long matches stay measured.
      draft      seconds of one drafting step (one token for every row drafted).
      verify(k, n) seconds of a verification of n rows asked for k drafts, per n and k: a step
                 over many rows costs more than one over few, so times taken at different loads (as
                 requests come and go) must not be compared. For the rows of the step being planned,
                 each kind of step (plain, drafted) is looked up at the nearest n it was measured
                 at; among the k >= 1 measured there a line (or the one value, while only one k has
                 been seen) predicts the others, and what drafts add to a plain step is carried
                 from that n to the step's own in proportion to the rows, where plain steps were
                 measured at both.
      rows(k)    sequences a step advances: every running one in sd; in psd a sub-batch, about half,
                 with drafts, all of them in a plain step.
    Step time: sd drafts then verifies, k * draft + verify(k); psd drafts one sub-batch while it
    verifies the other, max(verify(k), k * draft). Tokens per second: rows(k) * E[tokens per
    row](k) / step time(k), for k up to one past the longest measured. Now and then the next k is a
    neighbour of the best, so verify(k) and the acceptance of the next position stay measured
    around the optimum (and a drafter switched off at k = 0 is tried again; its catch-up on the
    tokens it missed counts as drafting time), as often as spec_decode/exploration.py says. Steps
    carrying prompt chunks are neither measured nor explored with.
    """

    def __init__(self, parallel: bool, max_k: int = AUTO_MAX_K, start_k: int = 2, decay: float = 0.9,
                 explore_every: int = 8, max_interval: int = 64):
        # Whether the next step overlaps (psd); with "overlap": "auto" the engine sets it each step.
        self.parallel, self.max_k, self.decay = parallel, max_k, decay
        self.k = self.choice = start_k  # the k of the step under way; the last one planned to learn from
        self.exploration = Exploration(explore_every, max_interval)
        # Decayed trials and acceptances per draft position; the prior, draft 1 accepted in two of
        # four trials, decays away.
        self.tried, self.taken = [4.0], [2.0]
        self.draft_s: float | None = None
        self.verify_s: dict[int, dict[int, float]] = {}  # rows -> k -> seconds
        self.hindsight = Hindsight(max_k)
        self.steps = self.planned = 0  # verifications learned from; how many when k was last chosen

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else self.decay * old + (1 - self.decay) * new

    def observe_draft(self, seconds: float, steps: int) -> None:
        """The drafter took `seconds` for `steps` drafting steps."""
        if steps > 0:
            self.draft_s = self._ema(self.draft_s, seconds / steps)

    def observe_verify(self, seconds: float, k: int, rows: list[tuple[int, int]],
                       hindsight: list[tuple[int, int]] = ()) -> None:
        """A verification of rows asked for k drafts (0: a plain decode step) took `seconds`; rows
        are (drafted, accepted) per sequence, drafts asked for and not made counted as drafted.
        `hindsight`: more such rows, free drafts made at earlier plain steps and scored against the
        tokens emitted since (`self.hindsight`, which the engine fills)."""
        by_k = self.verify_s.setdefault(len(rows), {})
        by_k[k] = self._ema(by_k.get(k), seconds)
        tried, taken = count_by_position(list(rows) + list(hindsight))
        self.tried = [self.decay * old + new for old, new in zip_longest(self.tried, tried, fillvalue=0)]
        self.taken = [self.decay * old + new for old, new in zip_longest(self.taken, taken, fillvalue=0)]
        self.steps += 1

    def plan(self, running: int, learn: bool = True) -> int:
        """The draft length for a step over `running` sequences: the best k for that many, or at
        times a neighbour (an exploration). `learn`: whether the step's verification will be
        learned from; one carrying prompt chunks is not, as their tokens swamp what drafts cost, so
        it plays the best k known (none before anything is measured) and never explores. A step to
        learn from chooses again only once a verification has been learned from since the last
        choice, so an exploration holds until it is measured."""
        if not learn:
            self.k = self.best_k(running) if self.verify_s else 0
            return self.k
        if self.steps > self.planned:
            self.planned = self.steps
            best = self.best_k(running)
            if self.exploration.due(self.steps, best):
                up = (self.exploration.tries % 2 or best == 0) and best < self.max_k  # alternate, within 0..max_k
                best = best + 1 if up else best - 1
            self.choice = best
        self.k = self.choice
        return self.k

    @property
    def acceptance(self) -> list[float]:
        """Acceptance rate per draft position, up to the last position still measured (positions
        left untried for long decay to nothing and drop out)."""
        rates = []
        for tried, taken in zip(self.tried, self.taken):
            if tried < 1e-3:
                break
            rates.append(taken / tried)
        return rates

    def expected_tokens(self, k: int) -> float:
        return expected_tokens_by_position(self.acceptance, k)

    def _measured(self, drafted: bool, rows: int) -> tuple[int, dict[int, float]]:
        """(n, verification seconds by k), plain (k = 0) or drafted (k >= 1), at the number of rows
        n nearest `rows` where that kind was measured (the larger on a tie); (0, {}) if never."""
        seen = [n for n, by_k in self.verify_s.items() if any((k > 0) == drafted for k in by_k)]
        if not seen:
            return 0, {}
        n = min(seen, key=lambda n: (abs(n - rows), -n))
        return n, {k: v for k, v in self.verify_s[n].items() if (k > 0) == drafted}

    def predicted_verify(self, k: int, rows: int) -> float:
        """Seconds to verify `rows` rows at k. k = 0: the plain step measured at the nearest number
        of rows. k >= 1: a least-squares line through the k >= 1 measured at the nearest number of
        rows n where any was (flat while one k has been seen there; the plain step while none has).
        Where n is not `rows` but plain steps were measured at both, what the drafts add to a plain
        step at n is carried over in proportion to the rows: plain(rows) + (line(n) - plain(n)) *
        rows / n. (As the load falls at the end of a batch, drafts timed over 8 rows would otherwise
        be priced at three times a one-row plain step.) While no plain step has been measured, a
        plain one is priced as the shortest drafts measured."""
        _, plain = self._measured(False, rows)
        if k == 0 and plain:
            return plain[0]
        n, points = self._measured(True, rows)
        if not points:
            return plain[0]
        ks = list(points)
        if len(ks) == 1:
            line = points[ks[0]]
        else:
            mean_k, mean_v = sum(ks) / len(ks), sum(points.values()) / len(ks)
            slope = sum((x - mean_k) * (points[x] - mean_v) for x in ks) / sum((x - mean_k) ** 2 for x in ks)
            line = max(1e-9, mean_v + max(0.0, slope) * (max(k, min(ks)) - mean_k))
        plain_here, plain_there = (self.verify_s.get(m, {}).get(0) for m in (rows, n))
        if n == rows or plain_here is None or plain_there is None:
            return line
        return plain_here + max(0.0, line - plain_there) * rows / n

    def predicted_rows(self, k: int, running: int) -> int:
        """Sequences a step of length k over `running` advances: psd verifies one sub-batch (the
        larger of two, when their sizes differ), a plain step takes them all, and so does sd."""
        return max(1, (running + 1) // 2) if self.parallel and k else running

    def step_time(self, k: int, running: int) -> float:
        verify = self.predicted_verify(k, self.predicted_rows(k, running))
        return step_seconds(verify, k * (self.draft_s or 0.0), self.parallel)

    def best_k(self, running: int) -> int:
        """The k with the most tokens per second for a step over `running` sequences, at most one
        past the longest measured at that load: a line through a few noisy points may call long
        drafts nearly free, so k climbs one measured step at a time. Until a plain step has been
        measured, k = 0: what speculation is weighed against must be known."""
        if not self.verify_s:
            return self.choice
        if not self._measured(False, running)[1]:
            return 0
        reach = min(self.max_k, 1 + max(self._measured(True, self.predicted_rows(1, running))[1], default=0))
        return max(range(reach + 1), key=lambda k: self.predicted_rows(k, running) * self.expected_tokens(k)
                   / self.step_time(k, running))

    def as_dict(self) -> dict:
        return {"k": self.k, "acceptance": self.acceptance, "draft_s": self.draft_s,
                "verify_s": {n: dict(sorted(by_k.items())) for n, by_k in sorted(self.verify_s.items())}}

