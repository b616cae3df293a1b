"""The compiled-graph cache stays bounded: stale versions go, what is in use stays."""

import logging
import os
import time

import torch

from minedraft.engine.compile_cache import MARK, STALE_AFTER_S, inductor_cache_dir, prune, version_key

DAY = 24 * 3600


def folder_used(path, when: float, size: int = 1000):
    """A version's folder last used at `when`, holding `size` bytes."""
    path.mkdir(parents=True)
    (path / "data").write_bytes(b"x" * size)
    (path / MARK).touch()
    os.utime(path / MARK, (when, when))
    return path


def graph_used(folder, name: str, when: float, size: int = 1000):
    """One of Inductor's graph entries in a version's folder, last read at `when`."""
    entry = folder / "fxgraph" / name[:2] / name
    entry.mkdir(parents=True)
    (entry / "graph").write_bytes(b"x" * size)
    os.utime(entry / "graph", (when, when))
    return entry


def test_a_stale_version_is_removed_and_a_fresh_one_kept(tmp_path, caplog):
    now = time.time()
    current = folder_used(tmp_path / "current", now)
    stale = folder_used(tmp_path / "torch-2.0-py3.11-old", now - STALE_AFTER_S - DAY)
    fresh = folder_used(tmp_path / "torch-2.1-py3.11-other", now - DAY)  # another environment's, in use
    with caplog.at_level(logging.INFO, logger="minedraft"):
        prune(tmp_path, current, 2**30, now)
    assert not stale.exists() and fresh.exists() and current.exists()
    assert "freed 0.0 MB" in caplog.text and "torch-2.0-py3.11-old" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="minedraft"):
        prune(tmp_path, current, 2**30, now)
    assert caplog.text == ""  # nothing to free, nothing said


def test_past_the_cap_the_least_recently_used_go_first(tmp_path):
    now = time.time()
    current = folder_used(tmp_path / "current", now)
    oldest = graph_used(current, "aaaa", now - 3 * 3600)  # another model's graph, unused for hours
    other = folder_used(tmp_path / "other", now - 2 * 3600)
    newest = graph_used(current, "bbbb", now - 3600)
    prune(tmp_path, current, 1500, now)
    assert not oldest.exists() and not other.exists() and newest.exists() and (current / MARK).exists()


def test_each_torch_and_source_version_has_its_folder(tmp_path):
    folder = inductor_cache_dir(tmp_path)
    assert folder.parent == tmp_path and (folder / MARK).is_file()
    assert folder.name == version_key() and folder.name.startswith(f"torch-{torch.__version__}-py")
