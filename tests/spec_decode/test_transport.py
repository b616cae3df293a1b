"""The engine-drafter channel: JSON headers and raw tensors, nothing that runs code on decode."""

import pathlib
import pickle
import threading

import pytest
import torch

from minedraft.spec_decode.remote import _received_dists, free_port
from minedraft.spec_decode.transport import DRAFTER, ENGINE, Channel, DrafterError
from minedraft.sampling import SamplingParams


@pytest.fixture(scope="module")
def pair():
    """Both ends of one channel, in this process."""
    address = f"tcp://127.0.0.1:{free_port()}"
    ends = {}
    thread = threading.Thread(target=lambda: ends.setdefault(DRAFTER, Channel(address, DRAFTER, 30)))
    thread.start()
    engine = Channel(address, ENGINE, 30)
    thread.join()
    return engine, ends[DRAFTER]


def exchange(send, receiver: Channel):
    """What `receiver` makes of the message `send()` sends."""
    got = {}

    def receive():
        try:
            got["message"] = receiver.recv(10)
        except DrafterError as e:
            got["error"] = e

    thread = threading.Thread(target=receive)
    thread.start()
    send()
    thread.join()
    if "error" in got:
        raise got["error"]
    return got["message"]


def send_raw(channel: Channel, payload: bytes) -> None:
    """A message whose header is whatever bytes a peer chooses to send."""
    meta = [len(payload), 0]
    channel._send(torch.tensor([len(meta)], dtype=torch.int64))
    channel._send(torch.tensor(meta, dtype=torch.int64))
    channel._send(torch.frombuffer(bytearray(payload), dtype=torch.uint8))


def test_headers_and_tensors_round_trip(pair):
    engine, drafter = pair
    params = SamplingParams(n=2, temperature=0.7, top_k=5, stop=["x"], seed=3, logprobs=1)
    header = {"op": "draft", "seqs": [[7, [1, 2, 3], 4, params.as_dict(), None]], "capacity": None, "ok": True}
    tensors = [torch.rand(3, 5, dtype=torch.float64), torch.arange(4)]
    got, got_tensors = exchange(lambda: engine.send(header, tensors), drafter)
    assert got == header and SamplingParams(**got["seqs"][0][3]) == params
    assert all(torch.equal(a, b) for a, b in zip(got_tensors, tensors))


def test_a_send_returns_before_the_peer_receives_and_keeps_its_own_copy(pair):
    engine, drafter = pair
    tensor = torch.arange(6.0)
    sender = threading.Thread(target=lambda: engine.send({"op": "draft"}, [tensor]))
    sender.start()
    sender.join(5)
    assert not sender.is_alive()  # a gloo send alone completes only once the peer receives
    tensor.zero_()  # the caller may reuse its buffer at once
    header, tensors = drafter.recv(10)
    assert header == {"op": "draft"} and tensors[0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    drafter.send({"ok": True})
    assert engine.recv(10)[0] == {"ok": True} and engine.sending == []  # taken before receiving


def test_a_pickle_is_refused_without_running_it(pair, tmp_path):
    engine, drafter = pair
    marker = tmp_path / "ran"

    class Exploit:
        def __reduce__(self):
            return pathlib.Path.touch, (marker,)

    with pytest.raises(DrafterError, match="malformed"):
        exchange(lambda: send_raw(engine, pickle.dumps(Exploit())), drafter)
    assert not marker.exists()


@pytest.mark.parametrize("payload", [b"[1, 2]", b"NaN", b"\xff\xfe", b"[" * 100000])
def test_malformed_headers_are_drafter_errors(pair, payload):
    engine, drafter = pair
    with pytest.raises(DrafterError, match="malformed"):
        exchange(lambda: send_raw(engine, payload), drafter)


@pytest.mark.parametrize("tensors,vocab", [
    ([torch.ones(2, 3)], 5),  # dense rows narrower than the vocabulary
    ([torch.ones(2, 3), torch.tensor([0, 1, 5])], 5),  # a token id outside the vocabulary
    ([torch.ones(2, 3), torch.tensor([[0, 1, 2]])], 5),  # one row of ids for two rows of probabilities
    ([torch.ones(2, 3), torch.ones(3)], 5),  # ids that are not integers
    ([torch.ones(2, 3), torch.tensor([0, 1, 2])], "5"),
    ([torch.ones(3, dtype=torch.int64)], 3),
])
def test_draft_distributions_that_do_not_fit_are_refused(tensors, vocab):
    with pytest.raises((ValueError, IndexError)):
        _received_dists({"vocab": vocab}, tensors)


def test_compact_draft_distributions_are_read_back():
    shared = _received_dists({"vocab": 5}, [torch.ones(2, 3) / 3, torch.tensor([4, 0, 2])])
    own = _received_dists({"vocab": 5}, [torch.ones(2, 2) / 2, torch.tensor([[4, 0], [1, 2]])])
    assert shared.dense(1).tolist() == pytest.approx([1 / 3, 0, 1 / 3, 0, 1 / 3]) and own.prob(1, 2) == 0.5
    assert _received_dists({"vocab": None}, []) is None
