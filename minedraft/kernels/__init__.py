"""C++ kernels for CPU (`small_gemm.cpp`, `attention.cpp`), built into one extension with
torch.utils.cpp_extension (`-O3 -march=native`) into the cache folder on first use or by
scripts/install.sh: 10-20 s on a fresh cache, well under a second to load afterwards. Only for
CPUs with AVX-512. Where they cannot be built (no compiler, a build error) one warning says so and
the models keep PyTorch's own products and attention."""

import fcntl
import hashlib
import logging
import os
import shutil
import warnings
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(name) for name in ("small_gemm.cpp", "attention.cpp"))

_state: dict[str, bool] = {}  # "ok": the ops are loaded; missing: not tried yet


def _build_dir() -> Path:
    """One folder per source, torch and CPU (its feature flags where Linux lists them): a cache
    folder shared by several machines must not hand one's `-march=native` build to another."""
    from minedraft.models.loader import cache_root

    cpuinfo = Path("/proc/cpuinfo")
    flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "") \
        if cpuinfo.is_file() else torch.backends.cpu.get_cpu_capability()
    digest = hashlib.sha256(torch.__version__.encode() + flags.encode())
    for source in SOURCES:
        digest.update(source.read_bytes())
    return cache_root() / "kernels" / f"minedraft_kernels-{digest.hexdigest()[:16]}"


def _compile() -> None:
    """Build (or load the cached build of) the sources, registering torch.ops.minedraft_kernels."""
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
        load(name="minedraft_kernels", sources=[str(s) for s in SOURCES], extra_cflags=["-O3", "-march=native"],
             build_directory=str(build_dir), is_python_module=False, verbose=False)


def build() -> bool:
    """Whether the kernels are loaded here, building them the first time; a failure warns once."""
    if "ok" in _state:
        return _state["ok"]
    ok = False
    if "AVX512" not in torch.backends.cpu.get_cpu_capability():
        log.info("C++ kernels skipped: this CPU has no AVX-512")
    else:
        try:
            _compile()
            ok = True
        except Exception as e:  # noqa: BLE001 (any build failure: keep the other paths)
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            warnings.warn(f"building the C++ kernels failed, using PyTorch's own products and attention instead "
                          f"({type(e).__name__}: {first})", stacklevel=2)
    _state["ok"] = ok
    return ok
