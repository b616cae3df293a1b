"""y = x @ W + b for products of a few rows on CPU, reading each weight once for all rows.

At decode and verification sizes (1 to 64 tokens) the weights are far bigger than the cache, and
oneDNN's and MKL's products cost well above one pass over them (1.2-1.6x this kernel's time on
SmolLM2's shapes, docs/BENCHMARKS.md, issue 15). `small_gemm.cpp` multiplies every row with one
panel of W before reading the next, in float32, and in bfloat16 where the CPU has AVX512-BF16
(float32 sums, rounded once). `MINEDRAFT_SMALL_GEMM=0` turns it off; where the kernels cannot be
built (`kernels.build`) the models keep their other paths.
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

MADV_HUGEPAGE = 14  # Linux's madvise advice

_state: dict[str, bool] = {}  # "ok": usable; missing: not asked yet


class Packed(NamedTuple):
    """A weight in the kernel's layout, [ceil(N / 32), K, 32] (zero-padded past column N), and the
    dense [K, N] weight it came from (the same tensor, not a copy), which other inputs multiply."""
    panels: torch.Tensor
    dense: torch.Tensor


def enabled() -> bool:
    return os.environ.get("MINEDRAFT_SMALL_GEMM", "1") != "0"


def _shape_of_product(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], n)


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
        torch.library.register_fake("minedraft_kernels::small_gemm", _shape_of_product)
        ok = True
    _state["ok"] = ok
    return ok


def bf16_supported() -> bool:
    """Whether the built kernel multiplies bfloat16 (its CPU has AVX512-BF16)."""
    return build() and torch.ops.minedraft_kernels.bf16_supported()


@functools.cache
def _has_amx() -> bool:
    return getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()


def applies(rows: int, dtype: torch.dtype, compiling: bool) -> bool:
    """Whether a product of `rows` rows of `dtype` goes through the kernel: in a compiled graph from
    GRAPH_MIN_ROWS (Inductor's own bfloat16 products are slower still above 4 rows), eagerly from
    one row, up to MAX_ROWS, or MAX_ROWS_BF16_AMX for bfloat16 where oneDNN has AMX."""
    if compiling:
        return GRAPH_MIN_ROWS <= rows <= MAX_ROWS
    return 1 <= rows <= (MAX_ROWS_BF16_AMX if dtype == torch.bfloat16 and _has_amx() else MAX_ROWS)


def packable(weight: torch.Tensor) -> bool:
    """Whether the kernel multiplies `weight` ([K, N]) here: on CPU, built, float32, or bfloat16
    with an even K where the CPU has AVX512-BF16."""
    if weight.device.type != "cpu" or not build():
        return False
    return weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16 and weight.shape[0] % 2 == 0
                                             and bf16_supported())


def pack(weight: torch.Tensor, out: torch.Tensor | None = None) -> Packed | None:
    """`weight` ([K, N], the models' [in, out] layout) packed for the kernel, into `out` (flat, of
    its size) if given; None where the kernel does not apply (`packable`). bfloat16 panels hold
    each pair of adjacent k terms side by side ([P, K / 2, 32, 2], viewed as [P, K, 32]), the
    operand layout of the CPU's bfloat16 dot product."""
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
    return Packed(panels.view(P, K, PANEL), weight)


def pack_in_order(weights: list[torch.Tensor]) -> list[Packed | None]:
    """`pack` for each weight, their panels in one buffer per dtype, one after another in the
    order given (the order a forward pass multiplies them). The kernel's requests ahead then run
    on from one product into the next, and the memory sees one long stream rather than 121 short
    ones: 0.986-0.987x the time of a one-row pass over the products, 0.975-0.977x where the buffer
    also got huge pages (`scripts/panel_layout_probe.py`, docs/BENCHMARKS.md, 2026-12-03)."""
    # Panels hold ceil(N / 32) * 32 * K elements, a multiple of 32: each stays 64-byte aligned.
    sizes = [-(-w.shape[1] // PANEL) * PANEL * w.shape[0] if packable(w) else 0 for w in weights]
    packs: list[Packed | None] = [None] * len(weights)
    for dtype in {w.dtype for n, w in zip(sizes, weights) if n}:
        mine = [i for i, w in enumerate(weights) if sizes[i] and w.dtype == dtype]
        buffer = _huge_page_buffer(sum(sizes[i] for i in mine), dtype)
        for i, start in zip(mine, itertools.accumulate((sizes[i] for i in mine), initial=0)):
            packs[i] = pack(weights[i], buffer[start : start + sizes[i]])
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
    torch.ops.minedraft_kernels.set_row_limit(rows)
    try:
        yield
    finally:
        torch.ops.minedraft_kernels.set_row_limit(-1)


def linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ W + bias through the kernel for 1..MAX_ROWS rows of the packed dtype, else
    `x @ dense`."""
    if x.dtype != packed.panels.dtype or not 0 < x.shape[0] <= MAX_ROWS:
        y = x @ packed.dense
        return y if bias is None else y + bias
    return torch.ops.minedraft_kernels.small_gemm(x, packed.panels, packed.dense.shape[1], bias)
