"""Attention of a few new tokens per row over the KV cache through `attention.cpp`: a decode step
or a verification attends each row's queries over its prefix in one call for the whole batch,
in 0.4-0.8x the time of PyTorch's attention (docs/BENCHMARKS.md, issue 15).
float32 and bfloat16, head sizes that are multiples of 16; `MINEDRAFT_ATTENTION_KERNEL=0` turns
it off."""

import os

import torch

from minedraft import kernels

# A row bringing more queries than this (a prompt chunk) is worth PyTorch's flash attention, whose
# blocked products win once there are many queries per key.
MAX_QUERIES = 16


def enabled() -> bool:
    return os.environ.get("MINEDRAFT_ATTENTION_KERNEL", "1") != "0"


def applies(dtype: torch.dtype, head_dim: int, device: torch.device) -> bool:
    """Whether the kernel takes a model's attention (asked once per forward pass, so that the
    switch holds from the next step)."""
    return (device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and head_dim % 16 == 0
            and head_dim <= 256 and enabled() and kernels.build())


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     rows: torch.Tensor) -> torch.Tensor:
    """Write k and v ([N', Hkv, D]) into one layer's caches ([slots, Hkv, max_len, D]) and attend
    q ([N', H, D]) causally; `rows` [B, 3]: slot, tokens cached before, new tokens, in q's order.
    Returns [N', H * D], zero past the rows' tokens."""
    return kernels.ops().cached_attention(q, k, v, k_cache, v_cache, rows)
