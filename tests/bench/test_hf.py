import argparse

import pytest
import torch

from conftest import keep_float64
from minedraft.bench.hf import assistant_model
from minedraft.bench.offline import run
from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.models.loader import load_model


def test_assistant_model_scores_the_draft_vocabulary_like_our_decoder(tiny_llama, tiny_distilled):
    hf = keep_float64(assistant_model(tiny_distilled, tiny_llama, torch.float64))
    target = load_model(tiny_llama, torch.float64, torch.device("cpu"))
    ours = load_model(tiny_distilled, torch.float64, torch.device("cpu"), embedding=target.input_embedding)
    prompt = [5, 17, 3, 44, 9, 2, 61]
    runner = ModelRunner(ours, 1, 64, torch.float64, torch.device("cpu"))
    got = runner.forward([Row(runner.cache.allocate(), prompt, len(prompt))])
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    vocab = ours.draft_vocab  # ours scores only these tokens
    assert got.shape[-1] == len(vocab) and (got - ref[:, vocab]).abs().max() < 1e-9
    outside = torch.ones(ref.shape[-1], dtype=torch.bool)
    outside[vocab] = False
    assert torch.all(ref[:, outside] == 0)


def bench_args(tmp_path, **overrides) -> argparse.Namespace:
    args = dict(model=None, dtype="float64", draft_model=None, speculative_config=None, modes="ar,sd,hf",
                num_speculative_tokens="2,auto", concurrency="1", dataset=None, num_prompts=2, output_len=6,
                ignore_eos=True, temperature=0.0, max_model_len=256, repeats=1, output_json=None,
                plot_dir=str(tmp_path / "plots"), seed=0, enforce_eager=True, max_num_batched_tokens=None,
                max_prompt_tokens_beside_streams=None, enable_chunked_prefill=True, prefill_stall_ratio=None,
                scheduling_policy=None)
    return argparse.Namespace(**{**args, **overrides})


@pytest.mark.parametrize("spec", [{"draft_model": "self"}, {"speculative_config": '{"method": "ngram"}'}])
def test_bench_offline_runs_transformers_assisted_generation_as_a_peer(tiny_chat, tmp_path, spec):
    report = run(bench_args(tmp_path, model=str(tiny_chat), **spec))
    hf = [r for r in report["rows"] if r["mode"] == "hf"]
    assert [r["k"] for r in hf] == [2, "auto"] and all(r["concurrency"] == 1 for r in hf)
    assert hf[0]["output_tokens_per_s"] > 0 and hf[0]["ttft_mean_s"] > 0
    assert all(r["identical_to_ar"] == 1.0 for r in hf)  # greedy, float64: the same tokens as our engine
    sd = [r for r in report["rows"] if r["mode"] == "sd"]
    assert [r["k"] for r in sd] == [2, "auto"]
    assert sd[0]["draft_length"] == [None] and 0 <= sd[1]["draft_length"][0]["k"] <= 8  # what "auto" settled on
    assert (tmp_path / "plots" / "throughput_vs_k.png").stat().st_size > 0
    assert (tmp_path / "plots" / "latency_cdf.png").stat().st_size > 0


def test_bench_offline_rejects_placement_in_the_shared_speculative_config(tiny_chat, tmp_path):
    with pytest.raises(ValueError, match="'parallel' is set by the benchmark"):
        run(bench_args(tmp_path, model=str(tiny_chat), speculative_config='{"parallel": true}'))
