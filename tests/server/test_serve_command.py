"""`minedraft serve` builds its engine for streaming clients."""

import pytest

from minedraft import cli
from minedraft.config import CPU_MAX_NUM_BATCHED_TOKENS, CPU_SERVING_TOKENS_BESIDE_STREAMS
from minedraft.engine import llm_engine


def test_serve_defaults_to_the_serving_prompt_budget(tiny_llama, monkeypatch):
    built = []

    class Stop(Exception):
        pass

    def capture(config):
        built.append(config)
        raise Stop

    monkeypatch.setattr(llm_engine, "LLMEngine", capture)
    with pytest.raises(Stop):
        cli.main(["serve", "--model", str(tiny_llama)])
    assert built[0].serving and built[0].max_num_batched_tokens == CPU_MAX_NUM_BATCHED_TOKENS
    assert built[0].max_prompt_tokens_beside_streams == CPU_SERVING_TOKENS_BESIDE_STREAMS
