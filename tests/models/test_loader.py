"""A GGUF checkpoint is converted when it is loaded, never when a configuration is built."""

import pytest

from minedraft.config import EngineConfig
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
