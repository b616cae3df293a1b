"""Decode and verification steps replayed from CUDA graphs.

On a GPU a small model's step is bound by launching its kernels (hundreds per step, each costing
microseconds of CPU time), not by reading its weights. A CUDA graph records a step's kernels once
and replays them with one launch. A graph fixes shapes and addresses, so a step runs here when
every row brings at most MAX_TOKENS_PER_ROW new tokens (decode, verification; prompt chunks stay
eager), in fixed buffers:
- rows are padded up to a power of two; padding rows, and the padding tokens of short rows, write
  into a spare KV slot that no sequence owns;
- each row attends over the first `kv` positions of its slot (the batched attention call of
  `models.attention`, its rows a tensor of slots, keys masked by position), `kv` a power of two
  >= the longest row, so a short context does not pay for max_model_len.
One graph per (rows, tokens per row, kv, extra inputs) is captured at its first use, as vLLM
captures its sizes; all share one memory pool, since they never run at once. A graph ends at the
final hidden states: the LM head (a fifth of SmolLM2's weights, one kernel) runs after it on the
tokens whose logits are asked for only, so no graph holds a [tokens, vocabulary] buffer of its own
and padding is never scored. On another device
(tests on CPU) the same layout runs eagerly, without capture. A capture that fails warns once and
leaves every later step eager.
"""

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from minedraft.kv_cache import KVCache
from minedraft.models.attention import BatchLayout, batch_layout
from minedraft.models.llama import token_rope

MAX_TOKENS_PER_ROW = 17  # a verification at the largest k (16)
MIN_KV = 256


def power_of_two(n: int) -> int:
    """The smallest power of two >= n."""
    return 1 << (n - 1).bit_length()


@dataclass
class _Graph:
    meta: torch.Tensor  # int64: ids [B*T], positions [B*T], write slots [B*T], read slots [B]
    inputs: dict[str, torch.Tensor]  # padded per-token inputs, [B*T, ...]
    run: Callable[[], tuple[torch.Tensor, torch.Tensor | None]]  # replays (or runs) the step: hidden, states


class GraphForward:
    """Runs `model` over rows of few new tokens each in fixed layouts: captured CUDA graphs when
    `capture`, else the same code eagerly."""

    def __init__(self, model: torch.nn.Module, cache: KVCache, rope_tables: tuple[torch.Tensor, torch.Tensor],
                 capture: bool):
        if cache.spare_slot is None:
            raise ValueError("CUDA graphs need a KV cache with a spare slot for padding")
        self.model, self.cache, self.rope_tables = model, cache, rope_tables
        self.capture = capture
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.graphs: dict[tuple, _Graph] = {}
        self.failed = False

    def applies(self, num_tokens: list[int]) -> bool:
        return not self.failed and max(num_tokens) <= MAX_TOKENS_PER_ROW

    def __call__(self, rows: list, inputs: dict) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Logits of each row's last `num_logits` tokens, row after row, and the model's other
        states for every new token (as `ModelRunner.run`); the caller advances the slots. None:
        capturing failed (warned), run this step and every later one eagerly."""
        lengths, spare = self.cache.lengths, self.cache.spare_slot
        B, T = power_of_two(len(rows)), max(len(r.tokens) for r in rows)
        longest = max(lengths[r.slot] + len(r.tokens) for r in rows)
        kv = min(max(power_of_two(longest), MIN_KV), self.cache.max_len)
        tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        key = (B, T, kv, tuple(sorted((k, v) for k, v in inputs.items() if k not in tensors)),
               tuple(sorted((k, tuple(v.shape[1:]), v.dtype) for k, v in tensors.items())))
        graph = self.graphs.get(key)
        if graph is None:
            try:
                graph = self.graphs[key] = self._build(B, T, kv, inputs, tensors)
            except Exception as e:  # noqa: BLE001 (any capture failure means: run eagerly)
                self.failed = True
                warnings.warn(f"capturing a CUDA graph failed, running eagerly from now on "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})", stacklevel=3)
                return None
        # Padding: tokens 0 at positions 0.. of the spare slot; a short row's padding tokens sit
        # after its own (within kv, so their queries see keys) but write into the spare slot.
        ids, writes = [0] * (B * T), [spare] * (B * T)
        positions, reads = [t for _ in range(B) for t in range(T)], [spare] * B
        dest, logit_index = [], []
        for b, row in enumerate(rows):
            start, n = lengths[row.slot], len(row.tokens)
            reads[b] = row.slot
            for t in range(T):
                i = b * T + t
                positions[i] = min(start + t, kv - 1)
                if t < n:
                    ids[i], writes[i] = row.tokens[t], row.slot
                    dest.append(i)
            logit_index.extend(range(b * T + n - row.num_logits, b * T + n))
        graph.meta.copy_(torch.tensor(ids + positions + writes + reads))
        dest_t = torch.tensor(dest, device=graph.meta.device)
        for name, t in tensors.items():
            graph.inputs[name].index_copy_(0, dest_t, t)
        hidden, states = graph.run()
        logits = self.model.compute_logits(hidden[torch.tensor(logit_index, device=hidden.device)])
        return logits, None if states is None else states[dest_t]

    def _build(self, B: int, T: int, kv: int, inputs: dict, tensors: dict[str, torch.Tensor]) -> _Graph:
        device = self.cache.k.device
        spare = self.cache.spare_slot
        N = B * T
        positions = torch.arange(T, device=device).repeat(B)
        meta = torch.cat((torch.zeros(N, dtype=torch.long, device=device), positions,
                          torch.full((N + B,), spare, dtype=torch.long, device=device)))
        static = {k: torch.zeros(N, *v.shape[1:], dtype=v.dtype, device=device) for k, v in tensors.items()}

        # Every tensor a graph reads must outlive it: made inside the step (as `keys` is), it lives
        # in the graph's pool; made outside, `_Graph` holds it (`meta`, `static`). A tensor made
        # outside and then dropped gives its memory back for reuse while replays still read it.
        def step() -> tuple[torch.Tensor, torch.Tensor | None]:
            ids, pos, writes, reads = meta[:N], meta[N : 2 * N], meta[2 * N : 3 * N], meta[3 * N :]
            keys = torch.arange(kv, device=device)
            layout = BatchLayout(k_cache=self.cache.k, v_cache=self.cache.v, num_tokens=N, rows=reads, per_row=None,
                                 write_slots=writes, write_pos=pos, padded_shape=(B, T), valid=None, kv_len=kv,
                                 mask=(keys[None, None, :] <= pos.view(B, T, 1))[:, None])
            with batch_layout(layout):
                return self.model(ids, token_rope(self.rope_tables, pos), **{**inputs, **static})

        if not self.capture:
            return _Graph(meta, static, step)
        # Warm up on a side stream (library handles, workspaces) before capturing, as CUDA asks;
        # the spare layout above writes only the spare slot.
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = step()

        def replay() -> tuple[torch.Tensor, torch.Tensor | None]:
            graph.replay()
            return outputs

        return _Graph(meta, static, replay)
