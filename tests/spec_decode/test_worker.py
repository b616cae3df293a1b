"""The drafter process's handling of the engine's messages (minedraft.spec_decode.worker.Drafter)."""

import pytest
import torch

from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.models.loader import load_model
from minedraft.sampling import SamplingParams
from minedraft.spec_decode.base import Proposer
from minedraft.spec_decode.target_prefill import TargetPrefill
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
    assert log[1][1]["free"] is False  # a model's drafts are not free
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
    assert log[-1] == ("send", {"free_slots": None, "sequences": 1, "tokens": 2, "choices": {}})
    assert not d.handle({"op": "stop", "release": [1]}, [])
    assert log[-1] == ("release", 1)


@pytest.fixture(scope="module")
def target(tiny_llama):
    return load_model(tiny_llama, torch.float64, torch.device("cpu"))


def drafter_with_target(target) -> tuple[Drafter, list, list]:
    """A drafter whose copy of the target prefills handed-over prompts; answers go to `sent`."""
    log, sent = [], []
    prefill = TargetPrefill(target, 64, torch.float64, torch.device("cpu"))
    return Drafter(Recorder(log), torch.Generator(), lambda h, t=(): sent.append((h, t)), prefill), log, sent


def reference(target, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The KV entries and last logits of the whole prompt in one pass."""
    runner = ModelRunner(target, 1, 64, torch.float64, torch.device("cpu"))
    slot = runner.cache.allocate()
    logits = runner.forward([Row(slot, prompt)])
    n = len(prompt)
    return runner.cache.k[:, slot, :, :n], runner.cache.v[:, slot, :, :n], logits


def test_handed_over_prompts_are_prefilled_after_the_drafts_and_come_back_with_the_next(target):
    d, log, sent = drafter_with_target(target)
    prompts = {5: list(range(3, 23)), 6: [9, 8, 7, 6, 5, 4]}
    assert d.handle({"op": "draft", "prefill": [item(5, prompts[5]), item(6, prompts[6])], "on_target": [5, 6],
                     "seqs": [item(1, [1, 2])], "num_tokens": [2], "idle_s": 30.0}, [])
    assert "prefilled" not in sent[0][0]  # the drafts went out first
    # Both prompts ran after the answer, chunk by chunk; the drafter's model saw every chunk.
    assert [entry[0] for entry in log] == ["propose"] + ["prefill"] * (len(log) - 1)
    assert {entry[1][0] for entry in log[1:]} == {5, 6} and log[-1] == ("prefill", [6], [6])
    assert d.handle({"op": "draft", "seqs": [item(1, [3])], "num_tokens": [1], "idle_s": 0.0}, [])
    header, tensors = sent[1]
    assert header["drafts"] == [[7]] and header["prefilled"] == [[5, 20], [6, 6]]
    keys, values, logits = tensors
    for (seq_id, n), k, v, row in zip(header["prefilled"], keys.split([20, 6], 2), values.split([20, 6], 2), logits):
        k_ref, v_ref, logits_ref = reference(target, prompts[seq_id])
        assert torch.allclose(k, k_ref) and torch.allclose(v, v_ref) and torch.allclose(row, logits_ref[0])


def test_without_idle_time_prompts_wait_until_the_engine_asks(target):
    d, log, sent = drafter_with_target(target)
    assert d.handle({"op": "update", "prefill": [item(5, list(range(30))), item(6, [4, 5])], "on_target": [5, 6]}, [])
    assert d.handle({"op": "draft", "seqs": [item(1, [1])], "num_tokens": [1], "idle_s": 0.0}, [])
    assert log[-1] == ("propose", [1], [1]) and "prefilled" not in sent[0][0]
    assert len(d.target.queue) == 2 and d.target.runner.cache.lengths[d.target.slot] == 0
    # The engine has nothing else to do: one prompt is done and answered at once.
    assert d.handle({"op": "prefilled"}, [])
    assert sent[1][0] == {"prefilled": [[5, 30]]}
    d.handle({"op": "update", "release": [6]}, [])  # aborted: its prompt is never run
    assert d.handle({"op": "prefilled"}, [])
    assert sent[2] == ({}, [])


def test_the_answer_says_when_the_drafts_cost_nothing():
    """A lookup whose model its gate keeps off: the engine may then score the lookup's drafts."""

    class LookupAlone(Recorder):
        def free_drafts(self, seqs, k):
            return [[] for _ in seqs]

    log = []
    d = Drafter(LookupAlone(log), torch.Generator(), lambda header, tensors=(): log.append(("send", header)))
    assert d.handle({"op": "draft", "seqs": [item(1, [1, 2, 3])], "num_tokens": [2]}, [])
    assert log[1][1]["free"] is True
