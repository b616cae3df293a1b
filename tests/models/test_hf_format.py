import pytest

from conftest import save_tiny_checkpoint
from minedraft.models.hf_format import ModelArgs
from minedraft.models.loader import read_config


def test_unsupported_architecture_is_named(tmp_path):
    folder = save_tiny_checkpoint(tmp_path, "llama")
    cfg = read_config(folder)
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        ModelArgs.from_hf({**cfg, "architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        ModelArgs.from_hf({**cfg, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})
