"""The drafter process's handling of the engine's messages (minedraft.spec_decode.worker.Drafter)."""

import torch

from minedraft.sampling import SamplingParams
from minedraft.spec_decode.base import Proposer
from minedraft.spec_decode.worker import Drafter


class Recorder(Proposer):
    """Drafts token 7 for every row and notes what it was asked, in order, in a shared log."""

    def __init__(self, log: list):
        self.log = log

    def propose(self, seqs, num_tokens, generators, capacity=None):
        self.log.append(("propose", [s.seq_id for s in seqs]))
        return [[7] * n for n in num_tokens], [None] * len(seqs)

    def prefill(self, seqs, ends):
        self.log.append(("prefill", [s.seq_id for s in seqs], ends))

    def release(self, seq):
        self.log.append(("release", seq.seq_id))


def item(seq_id: int, tokens: list[int]) -> list:
    return [seq_id, tokens, SamplingParams(temperature=0).as_dict(), None, None]


def drafter() -> tuple[Drafter, list]:
    log = []
    return Drafter(Recorder(log), torch.Generator(), lambda header, tensors=(): log.append(("send", header))), log


def test_drafts_are_answered_before_other_prompts_are_prefilled():
    d, log = drafter()
    # Sequence 1's prompt chunk and sequence 2's last chunk arrive with a draft request for 2 and 3.
    assert d.handle({"op": "draft", "prefill": [item(1, [5, 6, 7]), item(2, [1, 2])],
                     "seqs": [item(2, [3]), item(3, [4, 4])], "num_tokens": [2, 1]}, [])
    kinds = [entry[0] for entry in log]
    assert kinds == ["prefill", "propose", "send", "prefill"]
    assert log[0] == ("prefill", [2], [3])  # drafted now: its prompt first
    assert log[1] == ("propose", [2, 3])
    assert log[2][1]["drafts"] == [[7, 7], [7]]
    assert log[3] == ("prefill", [1], [3])  # after the answer, while the target verifies


def test_updates_prefill_at_once_and_stop_ends_the_loop():
    d, log = drafter()
    assert d.handle({"op": "update", "prefill": [item(1, [5, 6])]}, [])
    assert log == [("prefill", [1], [2])]
    assert d.handle({"op": "stats"}, [])
    assert log[-1] == ("send", {"free_slots": None, "sequences": 1, "tokens": 2})
    assert not d.handle({"op": "stop", "release": [1]}, [])
    assert log[-1] == ("release", 1)
