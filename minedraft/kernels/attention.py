"""Attention of a few new tokens per row over the KV cache through `attention.cpp`: a decode step
or a verification attends each row's queries over its prefix in one call for the whole batch,
where PyTorch's attention costs 0.2-0.7 ms per call and layer (docs/BENCHMARKS.md, issue 15).
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


def applies(q: torch.Tensor) -> bool:
    """Whether the kernel takes these queries ([N, H, D])."""
    return (q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16) and q.shape[-1] % 16 == 0
            and q.shape[-1] <= 256 and enabled() and kernels.build())


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     rows: torch.Tensor) -> torch.Tensor:
    """Write k and v ([N', Hkv, D]) into one layer's caches ([slots, Hkv, max_len, D]) and attend
    q ([N', H, D]) causally; `rows` [B, 3]: slot, tokens cached before, new tokens, in q's order.
    Returns [N', H * D], zero past the rows' tokens."""
    return torch.ops.minedraft_kernels.cached_attention(q, k, v, k_cache, v_cache, rows)
