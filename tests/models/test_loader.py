"""A GGUF checkpoint is converted when it is loaded, never when a configuration is built."""

import logging
import tempfile

import pytest

from minedraft.config import EngineConfig
from minedraft import cache_paths
from minedraft.models import loader
from minedraft.models.hf_format import ModelArgs
from minedraft.models.loader import default_model_path, locate_model, read_config


def test_a_config_reads_a_gguf_file_without_converting_it(smollm2_path, tmp_path, monkeypatch):
    monkeypatch.setenv("MINEDRAFT_CACHE", str(tmp_path))  # an empty cache: nothing converted yet
    config = EngineConfig(max_model_len=256)
    assert config.model_path == default_model_path() and not any(tmp_path.iterdir())
    # The file's metadata gives what its converted config.json gives.
    assert config.model_args == ModelArgs.from_hf(read_config(smollm2_path))


def test_resolving_the_checkpoints_gives_the_converted_folder(smollm2_path):
    config = EngineConfig(max_model_len=256, speculative_config={"model": "self", "num_speculative_tokens": 2})
    config.resolve_checkpoints()
    assert config.model_path == smollm2_path and config.speculative.model_path == smollm2_path


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="is a file but not a .gguf file"):
        locate_model(tmp_path / "model.bin")


def test_a_cache_folder_that_is_not_writable_falls_back_to_a_temporary_one(tmp_path, monkeypatch, caplog):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("MINEDRAFT_CACHE", str(tmp_path / "a_file" / "cache"))  # under a file: never writable
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    cache_paths._writable.cache_clear()
    with caplog.at_level(logging.WARNING, logger="minedraft"):
        roots = [cache_paths.cache_root(), cache_paths.cache_root()]
    cache_paths._writable.cache_clear()
    assert roots[0] == roots[1] and roots[0].parent == tmp_path / "tmp" and roots[0].is_dir()
    assert caplog.text.count("is not writable") == 1


def test_converting_an_edited_gguf_file_removes_its_older_conversion(tmp_path, monkeypatch):
    monkeypatch.setenv("MINEDRAFT_CACHE", str(tmp_path / "cache"))
    gguf, elsewhere = tmp_path / "model.gguf", tmp_path / "other" / "model.gguf"
    older, current, other = (tmp_path / "cache" / f"model-{key}" for key in ("older", "current", "other"))
    for folder, source in ((older, gguf), (current, gguf), (other, elsewhere)):
        folder.mkdir(parents=True)
        (folder / loader.SOURCE).write_text(str(source.resolve()))
    loader.drop_older_conversions(gguf, current)
    assert not older.exists() and current.exists() and other.exists()  # another file's stays
