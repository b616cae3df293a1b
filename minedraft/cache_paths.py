"""Where MineDraft caches what it builds (converted checkpoints, compiled graphs, kernels): one
module below both `kernels` and `models`, so neither imports the other for a folder name."""

import functools
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger("minedraft")


def cache_root() -> Path:
    """$MINEDRAFT_CACHE, by default ~/.cache/minedraft; a temporary folder if it is not writable."""
    return _writable(Path(os.environ.get("MINEDRAFT_CACHE", Path.home() / ".cache" / "minedraft")))


@functools.cache  # one check, and at most one warning, per folder and process
def _writable(root: Path) -> Path:
    try:
        root.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=root).close()
        return root
    except OSError as e:
        fallback = Path(tempfile.gettempdir()) / f"minedraft-cache-{os.getuid()}"
        log.warning("the cache folder %s is not writable (%s); caching in %s instead", root, e, fallback)
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback
