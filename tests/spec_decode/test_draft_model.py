"""A draft model over its own KV cache (minedraft.spec_decode.draft_model): what it catches up on."""

import torch

from minedraft.engine.sequence import Sequence
from minedraft.models.loader import load_model
from minedraft.sampling import SamplingParams
from minedraft.spec_decode.draft_model import DraftModelProposer

CPU = torch.device("cpu")


def proposer(path) -> DraftModelProposer:
    return DraftModelProposer(load_model(path, torch.float64, CPU), 2, 96, torch.float64, CPU)


def sequence(prompt: list[int]) -> Sequence:
    return Sequence(0, "", 0, None, list(prompt), SamplingParams(temperature=0), None, None)


def test_a_prefill_after_drafting_drops_rejected_drafts_first(tiny_draft):
    """A sequence drafted for, then extended by tokens the model never saw (rounds a prompt lookup
    drafted), is caught up by a prefill; its next drafts are those of a drafter that sees the
    whole sequence at once."""
    drafter = proposer(tiny_draft)
    seq = sequence([5, 17, 3, 44, 9, 2, 61])
    assert drafter.backlog(seq) == len(seq)
    (drafts,), _ = drafter.propose([seq], [3], [None])
    assert len(drafts) == 3 and drafter.backlog(seq) == 0
    seq.output_token_ids += [drafts[0], (drafts[1] + 1) % 97] + [11, 12, 13]  # the second draft rejected
    assert drafter.backlog(seq) == 4  # the kept draft's entry stays valid
    drafter.prefill([seq], [len(seq)])
    assert drafter.backlog(seq) == 0
    fresh = proposer(tiny_draft)
    assert drafter.propose([seq], [4], [None])[0] == fresh.propose([seq], [4], [None])[0]
