"""Messages between the engine and a drafter process over a torch.distributed gloo group.

Each engine-drafter pair has its own two-process group (a TCPStore rendezvous plus a gloo group,
not torch.distributed's global default), so one process can hold several drafters. A message is a
small JSON header (numbers, strings, lists, dicts, true / false / null) plus tensors sent as raw
buffers. Decoding one builds only plain values and tensors of a known dtype, so whoever reaches
the rendezvous address can at worst send a malformed message (a DrafterError), never code.
"""

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

ENGINE, DRAFTER = 0, 1
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.uint8]
JOINED = "drafter_joined"  # store key the drafter sets once it has reached the rendezvous
MAX_TENSORS, MAX_NDIM = 16, 8  # bounds on what a message may announce


class DrafterError(RuntimeError):
    """The drafter process died, closed the channel or did not answer in time."""


class Channel:
    def __init__(self, address: str, rank: int, timeout_s: float, peer_alive: Callable[[], bool] | None = None):
        """Join the pair at `address` ("tcp://host:port"); the engine (rank 0) hosts the store.
        Blocks until the other side joins or `timeout_s` passes; the engine gives up at once when
        `peer_alive` says the drafter process is gone."""
        host, port = address.removeprefix("tcp://").rsplit(":", 1)
        timeout = timedelta(seconds=timeout_s)
        try:
            self.store = dist.TCPStore(host, int(port), 2, rank == ENGINE, timeout, wait_for_workers=False)
            if rank == ENGINE:
                self._wait_for_drafter(timeout_s, peer_alive)
            else:
                self.store.set(JOINED, "1")
            self.group = dist.ProcessGroupGloo(self.store, rank, 2, timeout)
        except (RuntimeError, ValueError) as e:
            raise DrafterError(f"could not join the drafter channel at {address}: {e}") from None
        self.peer = 1 - rank
        self.broken = False  # a message was cut off midway (an error, Ctrl-C): the two sides are out of step
        self.sending: list[tuple[dist.Work, torch.Tensor]] = []  # posted sends not yet taken, with their buffers

    def _wait_for_drafter(self, timeout_s: float, peer_alive: Callable[[], bool] | None) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.store.check([JOINED]):
            if peer_alive is not None and not peer_alive():
                raise DrafterError("the drafter process exited before joining the channel")
            if time.monotonic() > deadline:
                raise DrafterError(f"the drafter did not join the channel within {timeout_s} s")
            time.sleep(0.05)

    def send(self, header: dict, tensors: list[torch.Tensor] = ()) -> None:
        """Post a message and return at once: a gloo send completes only when the peer posts the
        matching receive, and waiting for that would keep the drafter from working while the
        engine verifies (and the engine from verifying while the drafter works). The next `recv`
        waits for it to be taken first; the two sides take turns, so that wait is short."""
        with self._whole_message():
            self._post(header, tensors)

    def _post(self, header: dict, tensors: list[torch.Tensor]) -> None:
        payload = torch.frombuffer(bytearray(json.dumps(header, allow_nan=False).encode()), dtype=torch.uint8)
        meta = [payload.numel(), len(tensors)]
        for t in tensors:
            meta += [DTYPES.index(t.dtype), t.dim(), *t.shape]
        self._send(torch.tensor([len(meta)], dtype=torch.int64))
        self._send(torch.tensor(meta, dtype=torch.int64))
        self._send(payload)
        for t in tensors:
            buf = t.detach().cpu().contiguous()
            # The send reads the buffer when the peer receives: a copy, so the caller may reuse it.
            self._send(buf.clone() if buf.data_ptr() == t.data_ptr() else buf)

    def recv(self, timeout: float | None = None) -> tuple[dict, list[torch.Tensor]]:
        """The next message; raises DrafterError on a broken channel, a malformed message or after
        `timeout` seconds."""
        with self._whole_message():
            return self._take(timeout)

    def _take(self, timeout: float | None) -> tuple[dict, list[torch.Tensor]]:
        for work, _ in self.sending:  # what we sent has been taken (its buffers are kept until then)
            self._wait(lambda: work, timeout)
        self.sending.clear()
        n = int(self._recv([1], torch.int64, timeout))
        if not 2 <= n <= 2 + MAX_TENSORS * (2 + MAX_NDIM):
            raise DrafterError(f"malformed message: {n} metadata entries")
        meta = self._recv([n], torch.int64, timeout).tolist()
        if meta[0] < 0:
            raise DrafterError("malformed message: negative header size")
        payload = self._recv([meta[0]], torch.uint8, timeout)
        try:
            header = json.loads(payload.numpy().tobytes(), parse_constant=_no_constant)
        except (ValueError, RecursionError) as e:
            raise DrafterError(f"malformed message header: {e}") from None
        if not isinstance(header, dict):
            raise DrafterError(f"malformed message header: {type(header).__name__}, not an object")
        return header, [self._recv(shape, dtype, timeout) for dtype, shape in _tensor_specs(meta)]

    @contextmanager
    def _whole_message(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self.broken = True
            raise

    def _send(self, t: torch.Tensor) -> None:
        try:
            self.sending.append((self.group.send([t], self.peer, 0), t))
        except RuntimeError as e:
            raise DrafterError(f"drafter channel failed: {e}") from None

    def _recv(self, shape: list[int], dtype: torch.dtype, timeout: float | None) -> torch.Tensor:
        try:
            t = torch.empty(shape, dtype=dtype)
        except RuntimeError as e:  # a size no message of ours has
            raise DrafterError(f"malformed message: {e}") from None
        self._wait(lambda: self.group.recv([t], self.peer, 0), timeout)
        return t

    @staticmethod
    def _wait(post: Callable, timeout: float | None) -> None:
        try:  # posting can fail too (a peer that has closed its end)
            work = post()
            ok = work.wait(timedelta(seconds=timeout)) if timeout is not None else work.wait()
        except RuntimeError as e:
            raise DrafterError(f"drafter channel failed: {e}") from None
        if ok is False:
            raise DrafterError(f"drafter did not answer within {timeout} s")


def _tensor_specs(meta: list[int]) -> list[tuple[torch.dtype, list[int]]]:
    """The dtype and shape of each tensor a message's metadata announces."""
    specs, pos = [], 2
    for _ in range(meta[1]):
        if pos + 2 > len(meta) or not 0 <= meta[pos] < len(DTYPES) or not 0 <= meta[pos + 1] <= MAX_NDIM:
            raise DrafterError("malformed message: bad tensor description")
        ndim = meta[pos + 1]
        shape = meta[pos + 2 : pos + 2 + ndim]
        if len(shape) < ndim or any(d < 0 for d in shape):
            raise DrafterError("malformed message: bad tensor shape")
        specs.append((DTYPES[meta[pos]], shape))
        pos += 2 + ndim
    return specs


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")
