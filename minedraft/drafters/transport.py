"""Messages between the engine and a drafter process over torch.distributed point-to-point.

A message is a small picklable header plus a list of tensors sent as raw buffers. Only our own two
processes, joined through a rendezvous the engine set up, ever talk on this channel.
"""

import pickle
from datetime import timedelta

import torch
import torch.distributed as dist

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.uint8]


class DrafterError(RuntimeError):
    """The drafter process died, closed the channel or did not answer in time."""


def _wait(work, timeout: float | None) -> None:
    try:
        ok = work.wait(timedelta(seconds=timeout)) if timeout is not None else work.wait()
    except RuntimeError as e:
        raise DrafterError(f"drafter channel failed: {e}") from None
    if ok is False:
        raise DrafterError(f"drafter did not answer within {timeout} s")


def _send(t: torch.Tensor, peer: int) -> None:
    try:
        dist.send(t, peer)
    except RuntimeError as e:
        raise DrafterError(f"drafter channel failed: {e}") from None


def send_message(header: object, tensors: list[torch.Tensor], peer: int) -> None:
    payload = torch.frombuffer(bytearray(pickle.dumps(header)), dtype=torch.uint8)
    meta = [payload.numel(), len(tensors)]
    for t in tensors:
        meta += [DTYPES.index(t.dtype), t.dim(), *t.shape]
    _send(torch.tensor([len(meta)], dtype=torch.int64), peer)
    _send(torch.tensor(meta, dtype=torch.int64), peer)
    _send(payload, peer)
    for t in tensors:
        _send(t.detach().cpu().contiguous(), peer)


def _recv(t: torch.Tensor, peer: int, timeout: float | None) -> torch.Tensor:
    _wait(dist.irecv(t, peer), timeout)
    return t


def recv_message(peer: int, timeout: float | None = None) -> tuple[object, list[torch.Tensor]]:
    """The next message from `peer`; raises DrafterError on a broken channel or after `timeout` s."""
    n = int(_recv(torch.empty(1, dtype=torch.int64), peer, timeout))
    meta = _recv(torch.empty(n, dtype=torch.int64), peer, timeout).tolist()
    payload = _recv(torch.empty(meta[0], dtype=torch.uint8), peer, timeout)
    header = pickle.loads(payload.numpy().tobytes())
    tensors, pos = [], 2
    for _ in range(meta[1]):
        dtype, ndim = DTYPES[meta[pos]], meta[pos + 1]
        shape = meta[pos + 2 : pos + 2 + ndim]
        pos += 2 + ndim
        tensors.append(_recv(torch.empty(shape, dtype=dtype), peer, timeout))
    return header, tensors
