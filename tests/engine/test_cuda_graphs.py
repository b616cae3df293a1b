"""CUDA graphs' fixed layouts (engine.cuda_graphs), run eagerly on CPU: padded rows, short rows'
padding tokens, the spare slot and the kv window give the logits and states of the plain runner.
The capture itself is checked on a GPU (tests/engine/test_cuda.py)."""

import pytest
import torch

from minedraft import LLM
from minedraft.engine import cuda_graphs
from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.models.loader import load_model
from engine.test_speculative import PROMPTS, greedy_params, token_ids
from spec_decode.test_eagle3_proposer import save_head

CPU = torch.device("cpu")


@pytest.fixture
def graphs_on_cpu(monkeypatch):
    monkeypatch.setattr("minedraft.engine.model_runner.GRAPH_DEVICES", ("cuda", "cpu"))


def runners(folder, max_len):
    model = load_model(folder, torch.float64, CPU)
    return ModelRunner(model, 4, max_len, torch.float64, CPU), ModelRunner(model, 4, max_len, torch.float64, CPU,
                                                                          cuda_graphs=True)


def test_fixed_layouts_give_the_plain_runners_logits_and_states(tiny_llama, graphs_on_cpu):
    plain, fixed = runners(tiny_llama, 40)
    assert fixed.graphs is not None and fixed.cache.spare_slot == 4 and fixed.cache.num_free == 4
    prompts = {0: [5, 17, 3, 44, 9], 2: [8, 9], 3: list(range(30, 50))}
    for r in (plain, fixed):
        for s in (0, 1, 2, 3):
            r.cache.allocate()
        r.forward([Row(s, p) for s, p in prompts.items()])  # over MAX_TOKENS_PER_ROW: eager in both
    steps = [
        [Row(0, [7]), Row(2, [3]), Row(3, [11])],  # decode: 3 rows padded to 4
        [Row(0, [4, 5, 6], 3), Row(3, [9], 1), Row(2, [1, 2], 2)],  # verification, short rows padded
        [Row(3, [2, 3, 4, 5], 2)],  # one row, logits of its last two tokens only
    ]
    for rows in steps:
        out_plain = plain.run(rows, aux_layers=(0, 1))
        out_fixed = fixed.run(rows, aux_layers=(0, 1))
        for a, b in zip(out_plain, out_fixed):
            torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-10)
        for r in (plain, fixed):  # a rejection: the next step overwrites the dropped entries
            r.cache.truncate(0, r.cache.lengths[0] - 1)
    assert plain.cache.lengths[:4] == fixed.cache.lengths[:4]
    for s in (0, 2, 3):
        n = plain.cache.lengths[s]
        torch.testing.assert_close(fixed.cache.k[:, s, :, :n], plain.cache.k[:, s, :, :n], rtol=1e-10, atol=1e-10)
    assert {key[:3] for key in fixed.graphs.graphs} == {(4, 1, 40), (4, 3, 40), (1, 4, 40)}


def test_rows_at_the_end_of_the_cache_and_kv_windows(tiny_llama, graphs_on_cpu, monkeypatch):
    """A short row's padding positions past max_len stay inside the cache; a small kv window is
    used while the rows are short and a larger one once they grow."""
    monkeypatch.setattr(cuda_graphs, "MIN_KV", 8)
    plain, fixed = runners(tiny_llama, 24)
    for r in (plain, fixed):
        a, b = r.cache.allocate(), r.cache.allocate()
        r.forward([Row(a, list(range(1, 21))), Row(b, [3, 4])])
    for rows in ([Row(0, [5, 6, 7, 8], 4), Row(1, [9], 1)], [Row(1, [9, 10], 2)]):
        torch.testing.assert_close(fixed.forward(rows), plain.forward(rows), rtol=1e-10, atol=1e-10)
    assert {key[2] for key in fixed.graphs.graphs} == {24, 8}  # clamped to max_len, then a window of 8


def test_greedy_with_fixed_layouts_equals_ar(tiny_llama, tiny_draft, tmp_path, graphs_on_cpu):
    """Whole engines: ar, sd with a draft model and with an EAGLE-3 head (the head's features are
    a per-token input its graphs copy in), prompts in chunks beside the other rows."""
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    kwargs = dict(dtype="float64", max_num_seqs=4, max_model_len=96, max_num_batched_tokens=8)
    with LLM(str(tiny_llama), enforce_eager=True, **kwargs) as ar:
        expected = token_ids(ar.generate(prompts, greedy_params(), use_tqdm=False))
    head = save_head(tiny_llama, tmp_path / "head", keep_every=2)
    for spec in (None, {"model": str(tiny_draft), "num_speculative_tokens": 3},
                 {"model": str(head), "num_speculative_tokens": 3}):
        with LLM(str(tiny_llama), speculative_config=spec, **kwargs) as llm:
            assert token_ids(llm.generate(prompts, greedy_params(), use_tqdm=False)) == expected
            runners_ = [llm.engine.runner] + ([] if spec is None else [llm.engine.proposer.runner])
            assert all(r.graphs.graphs and not r.graphs.failed for r in runners_)


def test_a_failed_capture_warns_and_runs_eagerly(tiny_llama, graphs_on_cpu, monkeypatch):
    def fail(*args):
        raise RuntimeError("operation not permitted when stream is capturing")

    plain, fixed = runners(tiny_llama, 40)
    monkeypatch.setattr(fixed.graphs, "_build", fail)
    for r in (plain, fixed):
        r.forward([Row(r.cache.allocate(), list(range(5, 25)))])  # over MAX_TOKENS_PER_ROW: eager
    with pytest.warns(UserWarning, match="capturing a CUDA graph failed"):
        torch.testing.assert_close(fixed.forward([Row(0, [7])]), plain.forward([Row(0, [7])]))
    assert fixed.graphs.failed and fixed.forward([Row(0, [8])]).shape == plain.forward([Row(0, [8])]).shape


def test_enforce_eager_turns_graphs_off(tiny_llama, graphs_on_cpu):
    with LLM(str(tiny_llama), dtype="float64", max_num_seqs=2, max_model_len=32, enforce_eager=True) as llm:
        assert llm.engine.runner.graphs is None and llm.engine.runner.cache.spare_slot is None
