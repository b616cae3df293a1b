"""C++ kernels for CPU (`small_gemm.cpp`, `attention.cpp`), built into one extension with
torch.utils.cpp_extension (`-O3 -march=native`) into the cache folder on first use or by
scripts/install.sh: 10-30 s on a fresh cache, well under a second to load afterwards. They are
written once in `vec.h`'s sixteen-lane vectors, which the build maps to the instruction set this CPU
reports: AVX-512 (with its bfloat16 dot products where present), AVX2 + FMA + F16C, or portable
C++ for anything else (ARM included). `MINEDRAFT_KERNEL_ISA=avx2` or `portable` forces a narrower
path for the engine (to measure it on a wider CPU). Where they cannot be built (no compiler, a
build error) one warning says so and the models keep PyTorch's own products and attention.

Tests load the other paths this CPU can execute beside the engine's (`build(variant)`, each
registering its ops under its own namespace, `ops(variant)`), so no path goes untested because of
where they ran."""

import fcntl
import hashlib
import logging
import os
import shutil
import warnings
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(name) for name in ("small_gemm.cpp", "attention.cpp", "vec.h", "ops.h"))
ENGINE = "minedraft_kernels"  # the namespace of the engine's build: torch.ops.minedraft_kernels
# What each path adds to `-O3 -march=native`: AVX2 is a wider CPU's native set less AVX-512.
FLAGS = {"native": [], "avx2": ["-mno-avx512f"], "portable": ["-DMINEDRAFT_PORTABLE"]}

_state: dict[str, bool] = {}  # per namespace: whether its ops are loaded; missing: not tried yet


def _cpu_flags() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        return next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "")
    return torch.backends.cpu.get_cpu_capability()


def engine_variant() -> str:
    """The path the engine's build takes: the CPU's own, unless MINEDRAFT_KERNEL_ISA forces one."""
    variant = os.environ.get("MINEDRAFT_KERNEL_ISA", "native")
    if variant not in FLAGS:
        raise ValueError(f"MINEDRAFT_KERNEL_ISA must be one of {', '.join(FLAGS)}, not {variant!r}")
    return variant


def namespace(variant: str | None = None) -> str:
    """torch.ops' namespace of a build: the engine's (None), or a variant's loaded beside it."""
    return ENGINE if variant is None else f"{ENGINE}_{variant}"


def _flags(variant: str | None) -> list[str]:
    own = engine_variant() if variant is None else variant
    return ["-O3", "-march=native", f"-DMINEDRAFT_OPS={namespace(variant)}", *FLAGS[own]]


def _build_dir(variant: str | None = None) -> Path:
    """One folder per source, torch, flags and CPU (its feature flags where Linux lists them): a
    cache folder shared by several machines must not hand one's `-march=native` build to another."""
    from minedraft.cache_paths import cache_root

    digest = hashlib.sha256(torch.__version__.encode() + _cpu_flags().encode() + " ".join(_flags(variant)).encode())
    for source in SOURCES:
        digest.update(source.read_bytes())
    return cache_root() / "kernels" / f"{namespace(variant)}-{digest.hexdigest()[:16]}"


def _compile(variant: str | None = None) -> None:
    """Build (or load the cached build of) the sources, registering torch.ops.<namespace(variant)>."""
    from torch.utils.cpp_extension import load

    if shutil.which("ninja") is None:  # the ninja wheel's binary is on PATH only in an activated venv
        import ninja

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    build_dir = _build_dir(variant)
    build_dir.mkdir(parents=True, exist_ok=True)
    # torch's own build lock is a plain file: a build killed midway (Ctrl-C on a first start) would
    # leave it behind and every later start would wait for it forever. An flock dies with its
    # process, so whoever holds this one knows any lock file of torch's is stale.
    with open(build_dir / "build.flock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        (build_dir / "lock").unlink(missing_ok=True)
        load(name=namespace(variant), sources=[str(s) for s in SOURCES if s.suffix == ".cpp"],
             extra_cflags=_flags(variant), build_directory=str(build_dir), is_python_module=False, verbose=False)


def build(variant: str | None = None) -> bool:
    """Whether a build's ops are loaded here (the engine's, or a variant's beside it), building
    them the first time; a failure warns once."""
    name = namespace(variant)
    if name not in _state:
        try:
            _compile(variant)
            _state[name] = True
        except Exception as e:  # noqa: BLE001 (any build failure: keep the other paths)
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            warnings.warn(f"building the C++ kernels failed, using PyTorch's own products and attention instead "
                          f"({name}: {type(e).__name__}: {first})", stacklevel=2)
            _state[name] = False
    return _state[name]


def ops(variant: str | None = None):  # -> torch._ops._OpNamespace
    """A build's ops (`build(variant)` first)."""
    return getattr(torch.ops, namespace(variant))


def isa(variant: str | None = None) -> str:
    """The instruction set a build's kernels use: "avx512", "avx2" or "portable"."""
    return ops(variant).isa() if build(variant) else "none"


def other_variants() -> list[str]:
    """The paths this CPU executes besides the engine's, for the tests to run too."""
    if not build():
        return []
    own = isa()
    return [v for v in ("avx2", "portable") if v != own and not (v == "avx2" and own == "portable")]
