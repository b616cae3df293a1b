"""y = x @ W + b for products of a few rows on CPU, reading each weight once for all rows.

At decode and verification sizes (1 to 64 tokens) the weights are far bigger than the cache, and
oneDNN's and MKL's products cost well above one pass over them (1.2-1.6x this kernel's time on
SmolLM2's shapes, docs/BENCHMARKS.md, issue 15). `small_gemm.cpp` multiplies every row with one
panel of W before reading the next, in float32, and in bfloat16 where the CPU has AVX512-BF16
(float32 sums, rounded once). It is built with `-O3 -march=native` on first use (or by
scripts/install.sh) into the cache folder, for CPUs with AVX-512 only. `MINEDRAFT_SMALL_GEMM=0`
turns it off. Where it cannot be built (no compiler, a build error) one warning says so and the
models keep their other paths.
"""

import fcntl
import hashlib
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("small_gemm.cpp")
PANEL = 32  # columns per packed panel; small_gemm.cpp's kPanel
# Products of up to this many rows use the kernel; bigger ones (prefill) oneDNN's packed weights.
# Measured up to 64 rows, where the kernel was still 1.0-1.2x faster (docs/BENCHMARKS.md).
MAX_ROWS = 64
# In compiled graphs, Inductor's GEMM templates match the kernel up to 4 rows and fall far behind
# above (8 rows: 2.1x its time, docs/BENCHMARKS.md), so graphs call it from 5 rows on.
GRAPH_MIN_ROWS = 5

_state: dict[str, bool] = {}  # "ok": the op is loaded; missing: not tried yet


class Packed(NamedTuple):
    """A weight in the kernel's layout, [ceil(N / 32), K, 32] (zero-padded past column N), and the
    dense [K, N] weight it came from (the same tensor, not a copy), which other inputs multiply."""
    panels: torch.Tensor
    dense: torch.Tensor


def enabled() -> bool:
    return os.environ.get("MINEDRAFT_SMALL_GEMM", "1") != "0"


def _build_dir() -> Path:
    """One folder per source, torch and CPU (its feature flags where Linux lists them): a cache
    folder shared by several machines must not hand one's `-march=native` build to another."""
    from minedraft.models.loader import cache_root

    cpuinfo = Path("/proc/cpuinfo")
    flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "") \
        if cpuinfo.is_file() else torch.backends.cpu.get_cpu_capability()
    key = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode() + flags.encode()).hexdigest()[:16]
    return cache_root() / "kernels" / f"small_gemm-{key}"


def _compile() -> None:
    """Build (or load the cached build of) small_gemm.cpp, registering torch.ops.minedraft_kernels."""
    from torch.utils.cpp_extension import load

    if shutil.which("ninja") is None:  # the ninja wheel's binary is on PATH only in an activated venv
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    build_dir = _build_dir()
    build_dir.mkdir(parents=True, exist_ok=True)
    # torch's own build lock is a plain file: a build killed midway (Ctrl-C on a first start) would
    # leave it behind and every later start would wait for it forever. An flock dies with its
    # process, so whoever holds this one knows any lock file of torch's is stale.
    with open(build_dir / "build.flock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        (build_dir / "lock").unlink(missing_ok=True)
        load(name="minedraft_small_gemm", sources=[str(SOURCE)], extra_cflags=["-O3", "-march=native"],
             build_directory=str(build_dir), is_python_module=False, verbose=False)
    # The output's shape without running it: what lets Dynamo trace the op into a compiled graph,
    # where Inductor calls it as an external kernel and fuses the element-wise work around it.
    torch.library.register_fake("minedraft_kernels::small_gemm", _shape_of_product)


def _shape_of_product(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], n)


def build() -> bool:
    """Whether the kernel is usable here, building it the first time; a failure warns once."""
    if "ok" in _state:
        return _state["ok"]
    ok = False
    if not enabled():
        log.info("small-row GEMM kernel off (MINEDRAFT_SMALL_GEMM=0)")
    elif "AVX512" not in torch.backends.cpu.get_cpu_capability():
        log.info("small-row GEMM kernel skipped: this CPU has no AVX-512")
    else:
        try:
            _compile()
            ok = True
        except Exception as e:  # noqa: BLE001 (any build failure: keep the other paths)
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            warnings.warn(f"building the small-row GEMM kernel failed, using oneDNN / MKL products instead "
                          f"({type(e).__name__}: {first})", stacklevel=2)
    _state["ok"] = ok
    return ok


def bf16_supported() -> bool:
    """Whether the built kernel multiplies bfloat16 (its CPU has AVX512-BF16)."""
    return build() and torch.ops.minedraft_kernels.bf16_supported()


def pack(weight: torch.Tensor) -> Packed | None:
    """`weight` ([K, N], the models' [in, out] layout) packed for the kernel; None where the kernel
    does not apply (not on CPU, not built, a dtype it does not multiply here). bfloat16 panels hold
    each pair of adjacent k terms side by side ([P, K / 2, 32, 2], viewed as [P, K, 32]), the
    operand layout of the CPU's bfloat16 dot product."""
    if weight.device.type != "cpu" or not build():
        return None
    K, N = weight.shape
    padded = F.pad(weight.detach(), (0, -N % PANEL))
    P = padded.shape[1] // PANEL
    if weight.dtype == torch.float32:
        return Packed(padded.view(K, P, PANEL).transpose(0, 1).contiguous(), weight)
    if weight.dtype == torch.bfloat16 and K % 2 == 0 and bf16_supported():
        pairs = padded.view(K // 2, 2, P, PANEL).permute(2, 0, 3, 1).contiguous()
        return Packed(pairs.view(P, K, PANEL), weight)
    return None


def linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ W + bias through the kernel for 1..MAX_ROWS rows of the packed dtype, else
    `x @ dense`."""
    if x.dtype != packed.panels.dtype or not 0 < x.shape[0] <= MAX_ROWS:
        y = x @ packed.dense
        return y if bias is None else y + bias
    return torch.ops.minedraft_kernels.small_gemm(x, packed.panels, packed.dense.shape[1], bias)
