"""When a live choice (the draft length, whether the model drafts) tries something other than its
best: soon at first, then, while each try leaves the best where it was, twice as long each time, so
a settled choice (no drafting above all, where every try costs the drafter's catch-up) is not paid
for every few rounds; a try that moves the best, or looks promising, starts over."""


class Exploration:
    def __init__(self, every: int = 8, max_interval: int = 64):
        self.every, self.max_interval = every, max_interval
        self.interval = self.next = every
        self.settled: object = None  # the best at the last try
        self.tries = 0

    def due(self, rounds: int, best: object) -> bool:
        """Whether round number `rounds` (counting those the choice is measured over) tries the
        alternative; `best` is what the choice would play otherwise."""
        if rounds < self.next:
            return False
        self.interval = min(2 * self.interval, self.max_interval) if best == self.settled else self.every
        self.settled, self.tries = best, self.tries + 1
        self.next = rounds + self.interval
        return True

    def soon(self, rounds: int) -> None:
        """The last try did better than the best so far without overturning it yet (its average
        carries older rounds): try again after `every` rounds."""
        self.interval = self.every
        self.next = min(self.next, rounds + self.every)
