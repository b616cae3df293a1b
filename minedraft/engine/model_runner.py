"""Runs a model over rows of new tokens, each row appending to its own KV-cache slot."""

import itertools
from dataclasses import dataclass

import torch
from tqdm import tqdm

from minedraft.engine.compiled_forward import CompiledForward
from minedraft.engine.cuda_graphs import GraphForward
from minedraft.kernels import attention as attention_kernel
from minedraft.kv_cache import KVCache
from minedraft.cache_paths import cache_root
from minedraft.models.attention import BatchLayout, batch_layout
from minedraft.models.llama import Decoder, rope_tables, token_rope

# Where `cuda_graphs` applies. Tests add "cpu" to run the graphs' fixed layouts eagerly there.
GRAPH_DEVICES = ("cuda",)


def logits_pass(model: torch.nn.Module, input_ids: torch.Tensor, logit_index: torch.Tensor,
                rope: tuple[torch.Tensor, torch.Tensor], **inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One forward pass: logits of the tokens at `logit_index`, and the model's other states."""
    hidden, extra = model(input_ids, rope, **inputs)
    return model.compute_logits(hidden[logit_index]), extra


@dataclass
class Row:
    slot: int
    tokens: list[int]  # new tokens, appended after the slot's cached ones
    num_logits: int = 1  # return logits for this many of the last new tokens (0: a prompt chunk but the last)


class ModelRunner:
    def __init__(self, model: Decoder, num_slots: int, max_len: int, dtype: torch.dtype, device: torch.device,
                 compile_sizes: tuple[int, ...] = (), cuda_graphs: bool = False):
        """`compile_sizes`: token counts to run through a compiled forward pass (`CompiledForward`);
        empty: always eager. `cuda_graphs`: replay decode and verification steps from CUDA graphs
        (`GraphForward`) where `device` is a GPU."""
        args = model.args
        self.model = model
        self.device = device
        graphs = cuda_graphs and device.type in GRAPH_DEVICES
        self.cache = KVCache(args.num_layers, num_slots, max_len, args.num_kv_heads, args.head_dim, dtype, device,
                             spare=graphs)
        self.rope_tables = tuple(t.to(device) for t in rope_tables(args, max_len, dtype))
        self.compiled = None
        if compile_sizes:
            self.compiled = CompiledForward(logits_pass, compile_sizes, cache_root() / "inductor")
        self.graphs = None
        if graphs:
            self.graphs = GraphForward(model, self.cache, self.rope_tables, capture=device.type == "cuda")

    def warm_up(self, desc: str, **inputs) -> None:
        """Build every compiled graph now, with a progress bar, rather than on each size's first use.
        `inputs`: extra model inputs as [1, ...] tensors (repeated to each size) or plain values."""
        if self.compiled is None or not self.cache.num_free:
            return
        slot = self.cache.allocate()
        try:
            for size in tqdm(self.compiled.sizes, desc=desc, unit="graph", leave=False):
                self.run([Row(slot, [0] * size, size)],
                         **{k: v.expand(size, *v.shape[1:]) if isinstance(v, torch.Tensor) else v
                            for k, v in inputs.items()})
                self.cache.lengths[slot] = 0
        finally:
            self.cache.free(slot)

    def forward(self, rows: list[Row], **inputs) -> torch.Tensor:
        """Logits [sum of num_logits, vocab], row by row in order; advances each slot's length."""
        return self.run(rows, **inputs)[0]

    @torch.inference_mode()
    def run(self, rows: list[Row], **inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits as `forward`, and the states the model returns beside them for every new token,
        row after row (a target's auxiliary layers, an EAGLE-3 head's next features), or None.
        `inputs` go to the model as they are (e.g. `aux_layers`, `features`)."""
        self.check(rows)
        out = None
        if self.graphs is not None and self.graphs.applies([len(r.tokens) for r in rows]):
            out = self.graphs(rows, inputs)
        if out is None:
            layout, input_ids, rope, logit_index = self.prepare(rows)
            with batch_layout(layout):
                out = (self.compiled or logits_pass)(self.model, input_ids, logit_index, rope, **inputs)
        self._advance(rows)
        return out

    @torch.inference_mode()
    def hidden_states(self, rows: list[Row], **inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The model's final hidden state for every new token, and its states beside them (as `run`),
        without logits; advances each slot's length."""
        self.check(rows)
        layout, input_ids, rope, _ = self.prepare(rows)
        with batch_layout(layout):
            out = self.model(input_ids, rope, **inputs)
        self._advance(rows)
        return out

    def _advance(self, rows: list[Row]) -> None:
        for row in rows:
            self.cache.lengths[row.slot] += len(row.tokens)

    def check(self, rows: list[Row]) -> None:
        """ValueError for a row with no tokens, asking for more logits than tokens, or past max_len."""
        for row in rows:
            start, n = self.cache.lengths[row.slot], len(row.tokens)
            if n == 0 or not 0 <= row.num_logits <= n:
                raise ValueError(f"row for slot {row.slot} has {n} tokens and asks for {row.num_logits} logits")
            if start + n > self.cache.max_len:
                raise ValueError(f"slot {row.slot} would hold {start + n} tokens, over {self.cache.max_len}")

    def prepare(self, rows: list[Row]) -> tuple[BatchLayout, torch.Tensor, tuple[torch.Tensor, torch.Tensor],
                                                 torch.Tensor]:
        """The batch's cache layout, its tokens (packed, row after row) and their rotary (cos, sin),
        and the index of each token whose logits are asked for."""
        lengths = self.cache.lengths
        B, T = len(rows), max(len(r.tokens) for r in rows)
        starts = [lengths[r.slot] for r in rows]
        counts = [len(r.tokens) for r in rows]
        dev = self.device
        input_ids = torch.tensor([t for r in rows for t in r.tokens], device=dev)
        start_t = torch.tensor(starts, device=dev)
        count_t = torch.tensor(counts, device=dev)
        offsets = torch.arange(T, device=dev)
        positions = start_t[:, None] + offsets[None, :]  # [B, T], padding included
        real = offsets[None, :] < count_t[:, None]
        kv_lens = [start + n for start, n in zip(starts, counts)]
        kv_len = max(kv_lens)
        slots = [r.slot for r in rows]
        slot_t = torch.tensor(slots, device=dev)
        # Decode and verification rows: the attention kernel takes the whole batch in one call per
        # layer and needs no masks. Otherwise one PyTorch call over a view of evenly spaced slots
        # (consecutive, or every other one as psd's sub-batches start out) when padding rows to the
        # longest (in keys and in new tokens) wastes little, else one call per row over its own
        # prefix (no gather copy, no padding).
        kernel = T <= attention_kernel.MAX_QUERIES and attention_kernel.applies(
            self.cache.k.dtype, self.cache.k.shape[-1], dev)
        batched, mask, per_row = False, None, None
        if not kernel:
            keys = torch.arange(kv_len, device=dev)
            stride = slots[1] - slots[0] if B > 1 else 1
            spaced = stride > 0 and slots == list(range(slots[0], slots[0] + stride * B, stride))
            batched = spaced and sum(kv_lens) >= 0.8 * B * kv_len and sum(counts) >= 0.8 * B * T
            if batched and (T > 1 or len(set(starts)) > 1):
                mask = (keys[None, None, :] <= positions[:, :, None])[:, None]
            if not batched:
                firsts = itertools.accumulate(counts[:-1], initial=0)
                per_row = [(slot, kv, first, n,
                            None if n == 1 else (keys[None, :kv] <= positions[b, :n, None])[None, None])
                           for b, (slot, kv, first, n) in enumerate(zip(slots, kv_lens, firsts, counts))]
        token_pos = positions[real]
        layout = BatchLayout(
            k_cache=self.cache.k,
            v_cache=self.cache.v,
            num_tokens=len(input_ids),
            rows=slice(slots[0], slots[0] + stride * B, stride) if batched else None,
            per_row=per_row,
            write_slots=slot_t[:, None].expand(B, T)[real],
            write_pos=token_pos,
            padded_shape=(B, T),
            valid=None if all(n == T for n in counts) else real.flatten().nonzero().squeeze(1),
            kv_len=kv_len,
            mask=mask,
            row_table=torch.tensor([[s, start, n] for s, start, n in zip(slots, starts, counts)]) if kernel else None,
        )
        ends = itertools.accumulate(counts)
        logit_index = torch.tensor(
            [i for end, row in zip(ends, rows) for i in range(end - row.num_logits, end)], dtype=torch.long, device=dev
        )
        return layout, input_ids, token_rope(self.rope_tables, token_pos), logit_index
