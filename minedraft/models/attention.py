"""Attention of a batch of rows over the KV cache, as one opaque operator.

The runner describes where each row sits in the cache (`BatchLayout`, the cache included) once per
step and sets it for the forward pass (`batch_layout`); every attention layer reads it from there.
A compiled forward pass therefore sees attention as a single custom op whose inputs are the new
tokens' queries, keys and values, and neither the cache layout (slots, lengths, masks: different
every step) nor the cache's shape (slots, max_model_len) becomes part of a compiled graph, which
one graph then serves for every engine configuration (the split vLLM makes with its forward
context).
"""

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F

from minedraft.kernels import attention as attention_kernel


@dataclass
class BatchLayout:
    """Where a batch of B rows of up to T new tokens (N in all) sits in the KV cache."""

    k_cache: torch.Tensor  # [layer, slot, kv_head, position, head_dim]
    v_cache: torch.Tensor
    num_tokens: int  # N; a compiled pass may carry padding tokens after these
    # The cache slots attended in one call over padded rows: evenly spaced ones (a slice: a view,
    # no copy), or any, gathered (a [B] tensor: a CUDA graph's fixed layout, engine.cuda_graphs) ...
    rows: slice | torch.Tensor | None
    # ... or one call per row over its own packed tokens: (slot, kv length, first token, tokens, mask)
    per_row: list[tuple[int, int, int, int, torch.Tensor | None]] | None
    write_slots: torch.Tensor  # [N] slot of each token
    write_pos: torch.Tensor  # [N] cache position of each token
    padded_shape: tuple[int, int]  # (B, T) for the batched call
    valid: torch.Tensor | None  # [N] each token's index in the padded B * T layout; None: no padding
    kv_len: int  # keys to attend over in the batched call: max over rows of cached + new tokens
    mask: torch.Tensor | None  # [B, 1, T, kv_len] True where a query may attend; None: attend all (batched)
    # [B, 3] (slot, tokens cached before, new tokens): the attention kernel takes the whole batch
    # (rows, per_row and mask are then unset); None: PyTorch's attention, as the fields above say
    row_table: torch.Tensor | None = None


# Per thread (the server's engine thread, a test's own engine): each forward pass sets its own.
_layout: contextvars.ContextVar[BatchLayout] = contextvars.ContextVar("minedraft_batch_layout")


@contextmanager
def batch_layout(layout: BatchLayout) -> Iterator[None]:
    token = _layout.set(layout)
    try:
        yield
    finally:
        _layout.reset(token)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """Write the new keys and values of layer `layer` into the step's cache and attend each new
    token's query over its row's prefix. q: [N', H, D], k and v: [N', Hkv, D] with N' >= the
    layout's N (rows past N are padding); returns [N', H * D]."""
    if torch.compiler.is_compiling():
        return torch.ops.minedraft.cached_attention(q, k, v, layer)
    return _attend(q, k, v, layer)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    meta = _layout.get()
    padded, n, H, D = q.shape[0], meta.num_tokens, q.shape[1], q.shape[2]
    k_cache, v_cache = meta.k_cache[layer], meta.v_cache[layer]
    if meta.row_table is not None:
        return attention_kernel.cached_attention(q, k, v, k_cache, v_cache, meta.row_table)
    k_cache[meta.write_slots, :, meta.write_pos] = k[:n]
    v_cache[meta.write_slots, :, meta.write_pos] = v[:n]
    q = q[:n]
    if meta.rows is not None:
        B, T = meta.padded_shape
        if meta.valid is not None:  # queries into the padded layout (padding queries are zeros, unused)
            q = q.new_zeros(B * T, H, D).index_copy_(0, meta.valid, q)
        q = q.view(B, T, H, D).transpose(1, 2)
        keys, values = k_cache[meta.rows, :, : meta.kv_len], v_cache[meta.rows, :, : meta.kv_len]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=meta.mask, enable_gqa=True)
        out = out.transpose(1, 2).reshape(B * T, H * D)
        out = out if meta.valid is None else out[meta.valid]
    else:  # each row's own queries: a one-token decode row beside a prompt chunk computes one query
        out = torch.cat([
            F.scaled_dot_product_attention(q[first : first + count].transpose(0, 1)[None],
                                           k_cache[slot : slot + 1, :, :kv], v_cache[slot : slot + 1, :, :kv],
                                           attn_mask=mask, enable_gqa=True)[0].transpose(0, 1).reshape(count, H * D)
            for slot, kv, first, count, mask in meta.per_row
        ])
    return out if padded == n else torch.cat((out, out.new_zeros(padded - n, H * D)))


# The cache it writes is no input of the graph: to the compiler the op is a function of q, k, v and
# the layer, which is all it must know to keep each layer's call in order (its output feeds the next).
@torch.library.custom_op("minedraft::cached_attention", mutates_args=())
def _cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    return _attend(q, k, v, layer)


@_cached_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
