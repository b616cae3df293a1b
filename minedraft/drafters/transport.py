"""Messages between the engine and a drafter process over a torch.distributed gloo group.

Each engine-drafter pair has its own two-process group (a TCPStore rendezvous plus a gloo group,
not torch.distributed's global default), so one process can hold several drafters. A message is a
small picklable header plus tensors sent as raw buffers; only our own two processes, joined
through the rendezvous the engine set up, talk on a channel.
"""

import pickle
from datetime import timedelta

import torch
import torch.distributed as dist

ENGINE, DRAFTER = 0, 1
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.uint8]


class DrafterError(RuntimeError):
    """The drafter process died, closed the channel or did not answer in time."""


class Channel:
    def __init__(self, address: str, rank: int, timeout_s: float):
        """Join the pair at `address` ("tcp://host:port"); the engine (rank 0) hosts the store.
        Blocks until the other side joins or `timeout_s` passes."""
        host, port = address.removeprefix("tcp://").rsplit(":", 1)
        timeout = timedelta(seconds=timeout_s)
        try:
            self.store = dist.TCPStore(host, int(port), 2, rank == ENGINE, timeout)
            self.group = dist.ProcessGroupGloo(self.store, rank, 2, timeout)
        except RuntimeError as e:
            raise DrafterError(f"could not join the drafter channel at {address}: {e}") from None
        self.peer = 1 - rank

    def send(self, header: object, tensors: list[torch.Tensor] = ()) -> None:
        payload = torch.frombuffer(bytearray(pickle.dumps(header)), dtype=torch.uint8)
        meta = [payload.numel(), len(tensors)]
        for t in tensors:
            meta += [DTYPES.index(t.dtype), t.dim(), *t.shape]
        self._send(torch.tensor([len(meta)], dtype=torch.int64))
        self._send(torch.tensor(meta, dtype=torch.int64))
        self._send(payload)
        for t in tensors:
            self._send(t.detach().cpu().contiguous())

    def recv(self, timeout: float | None = None) -> tuple[object, list[torch.Tensor]]:
        """The next message; raises DrafterError on a broken channel or after `timeout` seconds."""
        n = int(self._recv(torch.empty(1, dtype=torch.int64), timeout))
        meta = self._recv(torch.empty(n, dtype=torch.int64), timeout).tolist()
        payload = self._recv(torch.empty(meta[0], dtype=torch.uint8), timeout)
        header = pickle.loads(payload.numpy().tobytes())
        tensors, pos = [], 2
        for _ in range(meta[1]):
            dtype, ndim = DTYPES[meta[pos]], meta[pos + 1]
            shape = meta[pos + 2 : pos + 2 + ndim]
            pos += 2 + ndim
            tensors.append(self._recv(torch.empty(shape, dtype=dtype), timeout))
        return header, tensors

    def _send(self, t: torch.Tensor) -> None:
        self._wait(self.group.send([t], self.peer, 0), None)

    def _recv(self, t: torch.Tensor, timeout: float | None) -> torch.Tensor:
        self._wait(self.group.recv([t], self.peer, 0), timeout)
        return t

    @staticmethod
    def _wait(work, timeout: float | None) -> None:
        try:
            ok = work.wait(timedelta(seconds=timeout)) if timeout is not None else work.wait()
        except RuntimeError as e:
            raise DrafterError(f"drafter channel failed: {e}") from None
        if ok is False:
            raise DrafterError(f"drafter did not answer within {timeout} s")
