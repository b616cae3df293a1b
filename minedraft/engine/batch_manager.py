"""PSD's batch manager: which of the two sub-batches each running sequence belongs to."""

from minedraft.engine.sequence import Sequence


class BatchManager:
    """Two sub-batches, 0 and 1. While one is being drafted (in flight) the other is verified.

    New sequences join the sub-batch that is drafted next (the one not in flight), or the smaller
    one when neither is; after a verification the verified sub-batch hands its excess over to the
    other, so the two stay within one sequence of each other.
    """

    def __init__(self):
        self.group: dict[int, int] = {}  # seq_id -> sub-batch
        self.in_flight: int | None = None  # the sub-batch the drafter is working on

    def members(self, running: list[Sequence], group: int) -> list[Sequence]:
        return [s for s in running if self.group.get(s.seq_id) == group]  # prompts being prefilled have none

    def size(self, group: int) -> int:
        return sum(1 for g in self.group.values() if g == group)

    def assign(self, running: list[Sequence]) -> None:
        sizes = [self.size(0), self.size(1)]
        for seq in running:
            if seq.seq_id not in self.group:
                target = 1 - self.in_flight if self.in_flight is not None else int(sizes[1] < sizes[0])
                self.group[seq.seq_id] = target
                sizes[target] += 1

    def rebalance(self, running: list[Sequence], verified: int) -> None:
        mine, other = self.members(running, verified), self.members(running, 1 - verified)
        for seq in mine[: max(0, (len(mine) - len(other)) // 2)]:
            self.group[seq.seq_id] = 1 - verified

    def forget(self, seq: Sequence) -> None:
        self.group.pop(seq.seq_id, None)
