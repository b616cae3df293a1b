"""Preallocated KV cache: one slot per request in flight, each with its own length."""

import torch


class KVCache:
    """Keys and values for `num_slots` sequences of up to `max_len` tokens.

    Layout [layer, slot, kv_head, position, head_dim]. A slot's length is the number of positions
    holding valid entries; truncating after rejected draft tokens only lowers that number. With
    `spare`, one more slot (`spare_slot`) is never handed out: CUDA graphs write padding there.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        spare: bool = False,
    ):
        self.spare_slot = num_slots if spare else None
        shape = (num_layers, num_slots + spare, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.lengths = [0] * (num_slots + spare)
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out low slots first

    @staticmethod
    def bytes_per_slot(num_layers: int, max_len: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * max_len * num_kv_heads * head_dim * dtype.itemsize

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("no free KV-cache slot")
        slot = self._free.pop()
        self.lengths[slot] = 0
        return slot

    def free(self, slot: int) -> None:
        if slot in self._free:
            raise RuntimeError(f"KV-cache slot {slot} freed twice")
        self._free.append(slot)
        self._free.sort(reverse=True)

    def truncate(self, slot: int, length: int) -> None:
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.lengths[slot]} to {length}")
        self.lengths[slot] = length
