"""The on-disk cache of compiled forward passes (Inductor's), kept bounded.

Inductor keys its entries by everything that shapes a graph, but never removes one, and a frozen
graph holds the model's weights (about 540 MB for SmolLM2 at one batch size). So each torch, Python
and traced-source version gets a folder of its own, and at start another version's folder unused
for a week is removed; past a size cap the least recently used folders, and graphs of the current
folder (other models'), go first. A graph's last use is its files' access time (on a filesystem
mounted noatime, their creation).
"""

import hashlib
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import torch

log = logging.getLogger("minedraft")

STALE_AFTER_S = 7 * 24 * 3600
CAP_GB = 8.0  # default of MINEDRAFT_INDUCTOR_CACHE_GB
MARK = "last_used"  # touched in a version's folder by every process that uses it
# The package's code that Dynamo traces into graphs: an edit to it makes new graphs.
TRACED = ("models", "kernels", "engine/compiled_forward.py", "engine/model_runner.py")


def inductor_cache_dir(root: Path) -> Path:
    """This process's folder under `root`, marked as used, after pruning `root`."""
    folder = root / version_key()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARK).touch()
    try:
        prune(root, folder, int(float(os.environ.get("MINEDRAFT_INDUCTOR_CACHE_GB", CAP_GB)) * 2**30), time.time())
    except OSError as e:  # another process pruning too, say: a cache is never worth failing for
        log.warning("pruning the compiled-graph cache %s failed: %s", root, e)
    return folder


def version_key() -> str:
    package = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for name in TRACED:
        path = package / name
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(file.relative_to(package).as_posix().encode() + b"\0" + file.read_bytes())
    return f"torch-{torch.__version__}-py{sys.version_info[0]}.{sys.version_info[1]}-{digest.hexdigest()[:12]}"


def prune(root: Path, current: Path, cap_bytes: int, now: float) -> None:
    """Remove the other folders of `root` unused for STALE_AFTER_S; then, while what may be
    removed exceeds `cap_bytes`, the least recently used of the others and of `current`'s graphs."""
    others = [(_last_used(f), _size(f), f) for f in root.iterdir() if f.is_dir() and f != current]
    stale = [u for u in others if now - u[0] > STALE_AFTER_S]
    kept = sorted([u for u in others if u not in stale] + [(_accessed(g), _size(g), g) for g in _graphs(current)],
                  key=lambda u: u[0])
    over = sum(size for _, size, _ in kept) - cap_bytes
    removed = list(stale)
    while over > 0 and kept:
        unit = kept.pop(0)
        removed.append(unit)
        over -= unit[1]
    for _, _, path in removed:
        shutil.rmtree(path, ignore_errors=True)
    if removed:
        log.info("freed %.1f MB of compiled-graph cache in %s: %s", sum(s for _, s, _ in removed) / 2**20, root,
                 ", ".join(str(p.relative_to(root)) for _, _, p in removed))


def _graphs(folder: Path) -> list[Path]:
    """Inductor's FX-graph entries (fxgraph/<prefix>/<key>/), each the code and constants of a graph."""
    return [entry for prefix in (folder / "fxgraph").glob("*") for entry in prefix.glob("*") if entry.is_dir()]


def _files(path: Path) -> list[os.stat_result]:
    stats = []
    for file in path.rglob("*"):
        try:
            if file.is_file():
                stats.append(file.stat())
        except OSError:  # removed meanwhile by another process
            pass
    return stats


def _size(path: Path) -> int:
    return sum(s.st_size for s in _files(path))


def _accessed(path: Path) -> float:
    return max((max(s.st_atime, s.st_mtime) for s in _files(path)), default=0.0)


def _last_used(folder: Path) -> float:
    """When a process last used a version's folder (an older layout's folder: when it last changed)."""
    mark = folder / MARK
    return (mark if mark.exists() else folder).stat().st_mtime
