"""`minedraft serve` builds its engine for streaming clients."""

import pytest

from minedraft import cli
from minedraft.config import CPU_MAX_NUM_BATCHED_TOKENS, CPU_SERVING_STALL_RATIO
from minedraft.engine import llm_engine


class Stop(Exception):
    pass


def built_config(monkeypatch, argv: list[str]):
    """The EngineConfig `minedraft serve ARGV` builds (the engine itself is never made)."""
    built = []

    def capture(config):
        built.append(config)
        raise Stop

    monkeypatch.setattr(llm_engine, "LLMEngine", capture)
    with pytest.raises(Stop):
        cli.main(["serve", *argv])
    return built[0]


def test_serve_defaults_to_the_serving_prompt_budget(tiny_llama, monkeypatch):
    config = built_config(monkeypatch, ["--model", str(tiny_llama)])
    assert config.serving and config.max_num_batched_tokens == CPU_MAX_NUM_BATCHED_TOKENS
    assert config.max_prompt_tokens_beside_streams == CPU_MAX_NUM_BATCHED_TOKENS
    assert config.prefill_stall_ratio == CPU_SERVING_STALL_RATIO  # chunks beside streams are paced
    assert config.scheduling_policy == "shortest_prompt"
    for given, ratio in (("none", None), ("4", 4.0), ("AUTO", CPU_SERVING_STALL_RATIO)):
        chosen = built_config(monkeypatch, ["--model", str(tiny_llama), "--prefill-stall-ratio", given])
        assert chosen.prefill_stall_ratio == ratio
    with pytest.raises(SystemExit):
        cli.main(["serve", "--model", str(tiny_llama), "--prefill-stall-ratio", "fast"])
    chosen = built_config(monkeypatch, ["--model", str(tiny_llama), "--scheduling-policy", "fcfs"])
    assert chosen.scheduling_policy == "fcfs"


def test_serve_traces_steps_only_when_asked(tiny_llama, monkeypatch, tmp_path):
    assert not built_config(monkeypatch, ["--model", str(tiny_llama)]).trace
    assert built_config(monkeypatch, ["--model", str(tiny_llama), "--trace", str(tmp_path / "t.jsonl")]).trace
