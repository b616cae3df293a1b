"""psd with `"overlap": "auto"`: overlap the two sub-batches only while that is quicker than
drafting and verifying the whole batch in turn.

Overlapping hides drafting behind verification, but splits the batch: the target runs two passes
a round instead of one. A round of R rows with n tokens to verify costs
    overlapped: 2 max(V(n / 2), t(R / 2))        merged: V(n) + t(R)
where V(n) is a target pass over n tokens and t(R) a drafting round of R rows. With V(n) = a + c n
and drafting shorter than verification, overlapping pays exactly when drafting the whole batch
takes longer than the target's fixed cost per pass, t(R) > a. On a CPU a pass streams every weight
(a = a one-token step) while a small drafter's round is a fraction of that, so merging wins there;
a big drafter on its own GPU is the paper's case, where overlapping does (docs/BENCHMARKS.md,
issue 19). Merged steps also stop prompt chunks, which ride on every target pass, from being paid
twice per round by every stream.
"""


class DecayedLine:
    """A least-squares line y = a + b x through recent observations (each older one weighing
    `decay` times less), with b >= 0: a bigger batch never costs less. While the x observed hardly
    vary (weighted variance under `min_spread`) no line can be fitted, and y is taken as
    proportional to x, with no fixed cost."""

    def __init__(self, decay: float, min_spread: float = 0.25):
        self.decay, self.min_spread = decay, min_spread
        self.w = self.x = self.y = self.xx = self.xy = 0.0

    def observe(self, x: float, y: float) -> None:
        d = self.decay
        self.w, self.x, self.y = d * self.w + 1, d * self.x + x, d * self.y + y
        self.xx, self.xy = d * self.xx + x * x, d * self.xy + x * y

    def spread(self) -> float:
        """Weighted variance of the x observed: 0 while every x was the same."""
        return self.xx / self.w - (self.x / self.w) ** 2 if self.w else 0.0

    def __call__(self, x: float) -> float:
        mean_x, mean_y = self.x / self.w, self.y / self.w
        if self.spread() < self.min_spread:
            return mean_y * x / mean_x
        slope = max(0.0, (self.xy / self.w - mean_x * mean_y) / self.spread())
        return max(0.0, mean_y + slope * (x - mean_x))


class OverlapPolicy:
    """Learns V and t from the engine's own steps (every verification pass, its prompt chunks'
    tokens counted: they spread the sizes seen, and as the priciest tokens they steepen the line,
    lowering the fixed cost it finds, which errs towards overlapping; every drafting round) and
    says, before each psd step, whether to overlap. Before anything is measured it overlaps, as psd
    was asked for; a cost seen at one size only is taken as proportional to the size, which also
    favours overlapping. A switch needs the other schedule to be `margin` quicker, so that noise
    does not make it flap."""

    def __init__(self, decay: float = 0.95, margin: float = 0.1):
        self.verify = DecayedLine(decay)  # seconds against tokens verified
        self.draft = DecayedLine(decay)  # seconds against rows drafted
        self.margin = margin
        self.overlapping = True

    def observe_verify(self, tokens: int, seconds: float) -> None:
        self.verify.observe(tokens, seconds)

    def observe_draft(self, rows: int, seconds: float) -> None:
        self.draft.observe(rows, seconds)

    def round_seconds(self, rows: int, tokens: int) -> tuple[float, float] | None:
        """Predicted (overlapped, merged) seconds of a round; None until both costs were observed."""
        if not (self.verify.w and self.draft.w):
            return None
        overlapped = 2 * max(self.verify(tokens / 2), self.draft(rows / 2))
        return overlapped, self.verify(tokens) + self.draft(rows)

    def overlap(self, rows: int, tokens: int) -> bool:
        """Whether the next step of `rows` running sequences, `tokens` to verify in all, overlaps."""
        times = self.round_seconds(rows, tokens)
        if times is not None:
            overlapped, merged = times
            if self.overlapping and merged < (1 - self.margin) * overlapped:
                self.overlapping = False
            elif not self.overlapping and overlapped < (1 - self.margin) * merged:
                self.overlapping = True
        return self.overlapping
