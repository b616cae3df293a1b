"""minedraft.vllm's arguments for vLLM: made and checked without vLLM installed."""

import json
import sys
import types

import pytest

from minedraft.cli import main
from minedraft.vllm import DEFAULT_DRAFT_MODEL, PROPOSER, SCHEDULER, check_version, engine_args, serve_flags


def test_engine_args_name_the_plugin_and_carry_its_settings(tmp_path):
    args = engine_args(num_speculative_tokens=3, draft_cpus=[1], parallel=False, trace=tmp_path / "t.jsonl")
    assert args["scheduler_cls"] == SCHEDULER
    assert args["speculative_config"] == {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 3}
    settings = args["additional_config"]["minedraft"]
    assert settings["draft_model"] == str(DEFAULT_DRAFT_MODEL)
    assert settings["draft_cpus"] == [1] and settings["parallel"] is False
    assert settings["trace"] == str(tmp_path / "t.jsonl")
    json.dumps(args)  # vLLM hashes additional_config as JSON


@pytest.mark.parametrize("kwargs, message", [
    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"num_speculative_tokens": True}, "num_speculative_tokens"),
    ({"draft_model": "/nonexistent"}, "not a checkpoint folder"),
    ({"draft_model": str(DEFAULT_DRAFT_MODEL.parent / "smollm2-135m-instruct-eagle3")}, "EAGLE-3"),
    ({"draft_cpus": []}, "draft_cpus"),
    ({"timeout_s": 0}, "timeout_s"),
])
def test_engine_args_refuse_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        engine_args(**kwargs)


def test_vllm_args_prints_serve_flags(capsys):
    main(["vllm-args", "--num-speculative-tokens", "2", "--sequential", "--draft-cpus", "1"])
    printed = capsys.readouterr().out.strip()
    flags = serve_flags(num_speculative_tokens=2, parallel=False, draft_cpus=[1])
    assert printed.split(" ", 1)[0] == "--scheduler-cls"
    assert json.loads(flags[3]) == {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 2}
    import shlex
    assert shlex.split(printed) == flags


def test_vllm_args_with_a_model_prints_the_serve_command(capsys):
    main(["vllm-args", "--model", "/models/target"])
    assert capsys.readouterr().out.startswith("vllm serve /models/target --scheduler-cls ")


def test_other_vllm_versions_are_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.31.0"))
    with pytest.raises(RuntimeError, match="supports vLLM 0.32.0 only, this is vLLM 0.31.0"):
        check_version()
