"""y = x @ W + b for products of a few rows on CPU, reading each weight once for all rows.

At decode and verification sizes (1 to 64 tokens) the weights are far bigger than the cache, and
oneDNN's and MKL's products cost well above one pass over them (1.2-1.6x this kernel's time on
SmolLM2's shapes, docs/BENCHMARKS.md, issue 15). `small_gemm.cpp` multiplies every row with one
panel of W before reading the next, in float32, and in bfloat16 where the CPU has AVX512-BF16
(float32 sums, rounded once). `MINEDRAFT_SMALL_GEMM=0` turns it off; where the kernels cannot be
built (`kernels.build`) the models keep their other paths.

Float32 weights that a GGUF file's quantization produced (the bundled SmolLM2's: Q4_1 layers, a
Q8_0 embedding) are exactly d * q + m in blocks of 32, with float16 d and m and small integers q.
`pack` finds those codes (`block_codes`) and the kernel then decodes each panel chunk into L1
(`coded_gemm`): the same float32 weights bit for bit and the same float32 products, from 0.625 or
1.125 bytes a weight instead of 4. A bfloat16 model rounded from such float32 weights multiplies
a few rows from the Q4_1 codes of the weights it came from (their exact values; `pack`'s `source`),
in the CPU's bfloat16 dot product. `MINEDRAFT_BLOCK_CODES=0` keeps the panels only.
"""

import ctypes
import functools
import itertools
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
import torch.nn.functional as F

from minedraft import kernels

log = logging.getLogger(__name__)

PANEL = 32  # columns per packed panel; small_gemm.cpp's kPanel
# Products of up to this many rows use the kernel; bigger ones (prefill) oneDNN's packed weights.
# On SmolLM2's shapes the kernel took 0.94-0.97x oneDNN's time at 96 rows and 0.98-1.04x at 128
# (`scripts/small_gemm_probe.py float32 64,80,96,128`, docs/BENCHMARKS.md, 2026-12-03): a served
# step of prompt tokens beside a few streams' rows stays with it.
MAX_ROWS = 96
# Except eager bfloat16 products on a CPU with AMX: there oneDNN's packed weights go through the
# tile unit and stream once for any number of rows, while the kernel's dot products turn
# compute-bound: from 5 rows oneDNN is quicker (0.6x the kernel's time at 8 rows, 0.2-0.3x at 40,
# docs/BENCHMARKS.md 2026-12-03).
MAX_ROWS_BF16_AMX = 4
# In compiled graphs Inductor's GEMM templates win at one row (the kernel took 1.05-1.07x their
# step time) and lose from two (0.96x), far at four (0.69x: a 4-token step 62 -> 42 ms on the Xeon,
# docs/BENCHMARKS.md), so graphs call the kernel from 2 rows on.
GRAPH_MIN_ROWS = 2
# Block codes cost a sixth of the float32 bytes but work to decode, in registers for every row
# block: over the bundled model's 121 products they took 0.42x the time of the model's float32
# panels at 1 row, 0.87-0.90x at 4-5, 1.08-1.22x at 6 and 1.24-1.29x at 8 on a 32 GB/s AMD EPYC core
# (`scripts/coded_gemm_probe.py`, docs/BENCHMARKS.md, 2026-12-05). More rows read the panels.
CODED_MAX_ROWS = 5

MADV_HUGEPAGE = 14  # Linux's madvise advice

_state: dict[str, bool] = {}  # "ok": usable; missing: not asked yet


class Codes(NamedTuple):
    """A weight's block codes in the kernel's layout (`block_codes`)."""
    codes: torch.Tensor
    scales: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.codes.numel() * self.codes.element_size() + self.scales.numel() * self.scales.element_size()


class Packed(NamedTuple):
    """A weight in the kernel's layout, [ceil(N / 32), K, 32] (zero-padded past column N), the
    dense [K, N] weight it came from (the same tensor, not a copy), which other inputs multiply,
    and its block codes where it has them, which products of up to CODED_MAX_ROWS rows read."""
    panels: torch.Tensor
    dense: torch.Tensor
    codes: Codes | None = None


def enabled() -> bool:
    return os.environ.get("MINEDRAFT_SMALL_GEMM", "1") != "0"


def codes_enabled() -> bool:
    return os.environ.get("MINEDRAFT_BLOCK_CODES", "1") != "0"


def _shape_of_product(x: torch.Tensor, *weights_n_bias) -> torch.Tensor:
    """(x, panels, n, bias) or (x, codes, scales, n, bias): [rows of x, n]."""
    return x.new_empty(x.shape[0], weights_n_bias[-2])


def build() -> bool:
    """Whether the kernel is usable here (switched on, and the C++ kernels built: `kernels.build`)."""
    if "ok" in _state:
        return _state["ok"]
    ok = False
    if not enabled():
        log.info("small-row GEMM kernel off (MINEDRAFT_SMALL_GEMM=0)")
    elif kernels.build():
        # The output's shape without running it: what lets Dynamo trace the op into a compiled
        # graph, where Inductor calls it as an external kernel and fuses the element-wise work.
        for op in ("small_gemm", "coded_gemm"):
            torch.library.register_fake(f"minedraft_kernels::{op}", _shape_of_product)
        ok = True
    _state["ok"] = ok
    return ok


def bf16_supported() -> bool:
    """Whether the built kernel multiplies bfloat16 (its CPU has AVX512-BF16)."""
    return build() and kernels.ops().bf16_supported()


@functools.cache
def _has_amx() -> bool:
    return getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()


def applies(rows: int, dtype: torch.dtype, compiling: bool, coded: bool = False) -> bool:
    """Whether a product of `rows` rows of `dtype` goes through the kernel: in a compiled graph from
    GRAPH_MIN_ROWS (Inductor's own bfloat16 products are slower still above 4 rows), eagerly from
    one row, up to MAX_ROWS, or MAX_ROWS_BF16_AMX for bfloat16 where oneDNN has AMX. Block-coded
    weights from one row everywhere: anything else would stream the float32 weights."""
    if compiling:
        return (1 if coded else GRAPH_MIN_ROWS) <= rows <= MAX_ROWS
    return 1 <= rows <= (MAX_ROWS_BF16_AMX if dtype == torch.bfloat16 and _has_amx() else MAX_ROWS)


def packable(weight: torch.Tensor) -> bool:
    """Whether the kernel multiplies `weight` ([K, N]) here: on CPU, built, float32, or bfloat16
    with an even K where the CPU has AVX512-BF16."""
    if weight.device.type != "cpu" or not build():
        return False
    return weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16 and weight.shape[0] % 2 == 0
                                             and bf16_supported())


def pack(weight: torch.Tensor, out: torch.Tensor | None = None, source: torch.Tensor | None = None) -> Packed | None:
    """`weight` ([K, N], the models' [in, out] layout) packed for the kernel, into `out` (flat, of
    its size) if given; None where the kernel does not apply (`packable`). bfloat16 panels hold
    each pair of adjacent k terms side by side ([P, K / 2, 32, 2], viewed as [P, K, 32]), the
    operand layout of the CPU's bfloat16 dot product. Float32 weights that are block codes
    (`block_codes`) carry those too; a bfloat16 weight carries the Q4_1 codes of `source`, the
    float32 (or float64) weight it was rounded from, where that has them."""
    if not packable(weight):
        return None
    K, N = weight.shape
    padded = F.pad(weight.detach(), (0, -N % PANEL))
    P = padded.shape[1] // PANEL
    if weight.dtype == torch.float32:
        layout = padded.view(K, P, PANEL).transpose(0, 1)
    else:
        layout = padded.view(K // 2, 2, P, PANEL).permute(2, 0, 3, 1)
    panels = layout.contiguous() if out is None else out.view(layout.shape).copy_(layout)
    codes = None
    if codes_enabled():
        if weight.dtype == torch.float32:
            codes = block_codes(weight)
        elif source is not None:
            codes = block_codes(source.detach().float(), pairs=True)
    return Packed(panels.view(P, K, PANEL), weight, codes)


def pack_in_order(weights: list[torch.Tensor], sources: list[torch.Tensor | None] | None = None) -> list[Packed | None]:
    """`pack` for each weight (with its `source`, if given), their panels in one buffer per dtype,
    one after another in the order given (the order a forward pass multiplies them). The kernel's
    requests ahead then run on from one product into the next, and the memory sees one long stream
    rather than 121 short ones: 0.986-0.987x the time of a one-row pass over the products,
    0.975-0.977x where the buffer also got huge pages (`scripts/panel_layout_probe.py`,
    docs/BENCHMARKS.md, 2026-12-03)."""
    sources = sources or [None] * len(weights)
    # Panels hold ceil(N / 32) * 32 * K elements, a multiple of 32: each stays 64-byte aligned.
    # Block codes, where a weight has them, lie apart.
    sizes = [-(-w.shape[1] // PANEL) * PANEL * w.shape[0] if packable(w) else 0 for w in weights]
    packs: list[Packed | None] = [None] * len(weights)
    for dtype in {w.dtype for n, w in zip(sizes, weights) if n}:
        mine = [i for i, w in enumerate(weights) if sizes[i] and w.dtype == dtype]
        buffer = _huge_page_buffer(sum(sizes[i] for i in mine), dtype)
        for i, start in zip(mine, itertools.accumulate((sizes[i] for i in mine), initial=0)):
            packs[i] = pack(weights[i], buffer[start : start + sizes[i]], sources[i])
    return packs


def _huge_page_buffer(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An untouched buffer of `numel` elements whose whole 2 MB pages are advised as huge pages
    (Linux's madvise; elsewhere, or refused, a plain buffer: the advice only speeds streaming up)."""
    buffer = torch.empty(numel, dtype=dtype)
    if not sys.platform.startswith("linux"):
        return buffer
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        huge, address = 2 << 20, buffer.data_ptr()
        first = -(-address // huge) * huge
        length = (address + buffer.numel() * buffer.element_size() - first) // huge * huge
        if length > 0:
            libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(length), MADV_HUGEPAGE)
    except (OSError, AttributeError):
        pass
    return buffer


@contextmanager
def padding_after(rows: int) -> Iterator[None]:
    """Within this block, on this thread, the kernel multiplies only the first `rows` rows of its
    input and returns zeros for the others: a compiled graph's padding (its caller knows how many
    tokens are real; the graph does not). A verification of 5 tokens in the 8-token graph then
    costs what 5 rows cost."""
    if not build():
        yield
        return
    kernels.ops().set_row_limit(rows)
    try:
        yield
    finally:
        kernels.ops().set_row_limit(-1)


def linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ W + bias through the kernel for 1..MAX_ROWS rows of the packed dtype (from the
    block codes up to CODED_MAX_ROWS rows), else `x @ dense`."""
    if x.dtype != packed.dense.dtype or not 0 < x.shape[0] <= MAX_ROWS:
        y = x @ packed.dense
        return y if bias is None else y + bias
    if packed.codes is not None and x.shape[0] <= CODED_MAX_ROWS:
        return kernels.ops().coded_gemm(x, *packed.codes, packed.dense.shape[1], bias)
    return kernels.ops().small_gemm(x, packed.panels, packed.dense.shape[1], bias)


def block_codes(weight: torch.Tensor, pairs: bool = False) -> Codes | None:
    """`weight` ([K, N] float32) as the kernel's block codes where every value is exactly one of
    GGUF's: per column, in blocks of 32 k terms, d * q + m with float16 d, m and q in 0..15 (Q4_1),
    or d * q with q in -128..127 (Q8_0). Returns (codes, scales), [P, K, 16] uint8 or [P, K, 32]
    int8 and [P, K / 32, 2 or 1, 32] float16 (small_gemm.cpp); None where any value is not, which a
    sample of columns tells at once for weights that were never quantized. `pairs`: the layout
    bfloat16 rows read, k terms side by side in pairs (Q4_1 only; Q8_0 weights give None)."""
    K, N = weight.shape
    if K % 32 or N == 0:
        return None
    sample = weight[:, :PANEL]
    for levels in (16,) if pairs else (16, 256):
        if _fit(sample, levels) is not None and (fit := _fit(weight, levels)) is not None:
            codes, scales = _layout(*fit, levels)
            if pairs:  # [P, K, 16] -> [P, K / 2, 16, 2]: byte 2j + t of pair h is k = 2h + t
                P = codes.shape[0]
                codes = codes.view(P, K // 2, 2, 16).transpose(2, 3).contiguous().view(P, K, 16)
            return Codes(codes, scales)
    return None


def _fit(weight: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """(q [N, K], d [N, K / 32], m [N, K / 32] or None) with d * q + m == weight.T exactly, in
    float32 as the kernel decodes (d * q is exact there): Q4_1 for 16 levels, Q8_0 for 256."""
    blocks = weight.t().reshape(-1, 32)
    if levels == 16:  # the smallest value of a block is m (q = 0); the largest is near d * 15 + m
        low = blocks.amin(-1, keepdim=True)
        if not torch.equal(low.half().float(), low):
            return None
        step, top, bottom = (blocks.amax(-1, keepdim=True) - low) / 15, 15, 0
    else:  # the value of largest magnitude is d * +-127 (llama.cpp never writes -128)
        low, step, top, bottom = None, blocks.abs().amax(-1, keepdim=True) / 127, 127, -128
    # The float16 d nearest the estimate, else a neighbour for the blocks it misses (the estimate
    # was itself rounded).
    d = step.half()
    shifted = blocks if low is None else blocks - low
    q = _codes_for(shifted, d, bottom, top)
    missed = (~_exact(blocks, d, q, low)).nonzero()[:, 0].unique()
    for nudge in (1, -1):
        if len(missed) == 0:
            break
        d_try = (d[missed].view(torch.int16) + nudge).clamp(min=0).view(torch.float16)
        q_try = _codes_for(shifted[missed], d_try, bottom, top)
        hit = _exact(blocks[missed], d_try, q_try, None if low is None else low[missed]).all(-1)
        d[missed[hit]], q[missed[hit]] = d_try[hit], q_try[hit]
        missed = missed[~hit]
    if len(missed):
        return None
    n = weight.shape[1]
    return q.reshape(n, -1), d.float().reshape(n, -1), None if low is None else low.reshape(n, -1)


def _codes_for(shifted: torch.Tensor, d: torch.Tensor, bottom: int, top: int) -> torch.Tensor:
    """The nearest q per value of a block less its m (zero d: q = 0)."""
    return (shifted / d.float()).nan_to_num_(0).round_().clamp_(bottom, top)


def _exact(blocks: torch.Tensor, d: torch.Tensor, q: torch.Tensor, low: torch.Tensor | None) -> torch.Tensor:
    """Per value: does d * q (+ m) give it back bit for bit, as the kernel computes it?"""
    value = d.float() * q
    return value == blocks if low is None else value + low == blocks


def _layout(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's layout of a fit: per panel of 32 columns, codes k-major and scales per block."""
    N, K = q.shape
    pad = -N % PANEL
    P = (N + pad) // PANEL
    q = F.pad(q, (0, 0, 0, pad)).view(P, PANEL, K).transpose(1, 2)  # [P, K, 32]
    if levels == 16:  # byte j: column j's code low, column j + 16's high
        u = q.to(torch.uint8)
        codes = (u[..., :16] | (u[..., 16:] << 4)).contiguous()
    else:
        codes = q.to(torch.int8).contiguous()
    scales = [F.pad(s, (0, 0, 0, pad)).view(P, PANEL, K // 32).transpose(1, 2) for s in (d, m) if s is not None]
    return codes, torch.stack(scales, dim=2).half().contiguous()
