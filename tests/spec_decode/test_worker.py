"""The drafter process's handling of the engine's messages (minedraft.spec_decode.worker.Drafter)."""

import torch

from minedraft.sampling import SamplingParams
from minedraft.spec_decode.base import Proposer
from minedraft.spec_decode.worker import MAX_CATCH_UP, Drafter


class Recorder(Proposer):
    """Drafts token 7 for every row and notes what it was asked, in order, in a shared log; it
    catches up on a sequence's tokens whenever it drafts for it or prefills it."""

    def __init__(self, log: list):
        self.log = log
        self.seen: dict[int, int] = {}

    def propose(self, seqs, num_tokens, generators, capacity=None):
        self.log.append(("propose", [s.seq_id for s in seqs], list(num_tokens)))
        self.seen.update({s.seq_id: len(s) for s, n in zip(seqs, num_tokens) if n})
        return [[7] * n for n in num_tokens], [None] * len(seqs)

    def prefill(self, seqs, ends):
        self.log.append(("prefill", [s.seq_id for s in seqs], ends))
        self.seen.update({s.seq_id: end for s, end in zip(seqs, ends)})

    def backlog(self, seq):
        return len(seq) - self.seen.get(seq.seq_id, 0)

    def release(self, seq):
        self.log.append(("release", seq.seq_id))


def item(seq_id: int, tokens: list[int]) -> list:
    return [seq_id, tokens, SamplingParams(temperature=0).as_dict(), None, None]


def drafter() -> tuple[Drafter, list]:
    log = []
    return Drafter(Recorder(log), torch.Generator(), lambda header, tensors=(): log.append(("send", header))), log


def test_drafts_are_answered_before_prompts_are_prefilled():
    d, log = drafter()
    # Sequence 1's prompt chunk, sequence 2's last chunk and sequence 4's whole prompt arrive with
    # a draft request for 2, 3 and 4; only 4 brings more than MAX_CATCH_UP tokens.
    long_prompt = list(range(MAX_CATCH_UP + 1))
    assert d.handle({"op": "draft", "prefill": [item(1, [5, 6, 7]), item(2, [1, 2])],
                     "seqs": [item(2, [3]), item(3, [4, 4]), item(4, long_prompt)], "num_tokens": [2, 1, 3]}, [])
    assert [entry[0] for entry in log] == ["propose", "send", "prefill"]
    assert log[0] == ("propose", [2, 3, 4], [2, 1, 0])  # 2 catches up on its 3 tokens while drafting
    assert log[1][1]["drafts"] == [[7, 7], [7], []]
    # After the answer, while the target verifies: the other prompt's chunk and the late sequence.
    assert log[2] == ("prefill", [1, 4], [3, MAX_CATCH_UP + 1])


def test_a_sequence_is_late_by_what_it_has_to_catch_up_on():
    d, log = drafter()
    assert d.handle({"op": "update", "prefill": [item(1, list(range(40)))]}, [])
    assert d.handle({"op": "draft", "seqs": [item(1, [9])], "num_tokens": [3]}, [])
    assert log[1] == ("propose", [1], [3])  # its prompt came earlier: drafted at once
    assert log[2][1]["drafts"] == [[7, 7, 7]]
    # Rounds the drafter did not draft for it (say, a prompt lookup did) add up.
    assert d.handle({"op": "draft", "seqs": [item(1, list(range(MAX_CATCH_UP + 1)))], "num_tokens": [0]}, [])
    assert log[-1] == ("prefill", [1], [41 + MAX_CATCH_UP + 1])  # caught up after answering, none the less
    assert d.handle({"op": "draft", "seqs": [item(1, [1, 2])], "num_tokens": [2]}, [])
    assert log[-2] == ("propose", [1], [2]) and log[-1][0] == "send"  # nothing left to prefill


def test_updates_prefill_at_once_and_stop_ends_the_loop():
    d, log = drafter()
    assert d.handle({"op": "update", "prefill": [item(1, [5, 6])]}, [])
    assert log == [("prefill", [1], [2])]
    assert d.handle({"op": "stats"}, [])
    assert log[-1] == ("send", {"free_slots": None, "sequences": 1, "tokens": 2})
    assert not d.handle({"op": "stop", "release": [1]}, [])
    assert log[-1] == ("release", 1)
