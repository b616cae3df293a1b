"""While "auto" plays k = 0 (no drafts verified), what a drafter that costs nothing (prompt lookup)
would have had accepted, so that the draft-length controller keeps measuring it.

A draft made with certainty (one-hot q) is accepted, position by position, with the probability
the target gives its token, and the accepted prefix then follows the target's distribution: the
very event of the target emitting that token itself. So the draft's accepted length is the length
of its agreement with the tokens the target goes on to emit, greedy or sampled; scoring it after
the fact measures the same thing a verification would, exactly for greedy rows and without bias
for sampled ones. This matters because such a drafter's value lies in long matches (a copied
phrase is kept whole), which the one-token explorations of k = 0 could not see.
"""

from minedraft.engine.sequence import Sequence
from minedraft.spec_decode.rejection import agreement


class Hindsight:
    def __init__(self, k: int):
        self.k = k  # the draft length asked for; what the drafter does not make counts as rejected
        self.pending: dict[int, tuple[int, list[int]]] = {}  # seq_id -> (tokens emitted then, draft)

    def undrafted(self, seqs: list[Sequence]) -> list[Sequence]:
        """Those of `seqs` without a draft waiting to be scored: the ones to draft for now."""
        return [seq for seq in seqs if seq.seq_id not in self.pending]

    def propose(self, seqs: list[Sequence], drafts: list[list[int]]) -> None:
        """Drafts the drafter would make now; a sequence whose last one is not yet scored keeps it."""
        for seq, draft in zip(seqs, drafts):
            self.pending.setdefault(seq.seq_id, (len(seq.output_token_ids), draft[: self.k]))

    def score(self, seqs: list[Sequence]) -> list[tuple[int, int]]:
        """(asked, accepted) for each pending draft the tokens emitted since settle: a mismatch, or
        as many tokens as it had. Drafts of sequences no longer running are dropped."""
        running = {seq.seq_id: seq for seq in seqs}
        rows = []
        for seq_id, (start, draft) in list(self.pending.items()):
            seq = running.get(seq_id)
            if seq is None:
                del self.pending[seq_id]
                continue
            emitted = seq.output_token_ids[start : start + len(draft)]
            agree = agreement(draft, emitted)
            if agree < len(emitted) or len(emitted) == len(draft):
                rows.append((self.k, agree))
                del self.pending[seq_id]
        return rows
