import torch

from minedraft.engine.sequence import Sequence
from minedraft.sampling import SamplingParams
from minedraft.spec_decode.ngram import NgramProposer
from minedraft.spec_decode.remote import RemoteDrafter


def test_the_drafters_lookup_runs_here_while_its_last_answer_said_its_drafts_were_free():
    """"auto" at k = 0 scores free drafts in hindsight; in psd the lookup sits in the drafter's
    process, so the engine runs the same lookup itself, only while the drafter's gate keeps its
    model off (its answers say so). No process is started: only this method is under test."""
    drafter = RemoteDrafter.__new__(RemoteDrafter)
    drafter.lookup, drafter.free = NgramProposer(2, 3, 100, torch.float32), False
    seq = Sequence(0, "", 0, None, [1, 2, 3], SamplingParams(), None, None, [1, 2])
    assert drafter.free_drafts([seq], 4) is None
    drafter.free = True
    assert drafter.free_drafts([seq], 4) == [[3, 1, 2]]
    drafter.lookup = None  # a drafter without a lookup in front of its model
    assert drafter.free_drafts([seq], 4) is None
