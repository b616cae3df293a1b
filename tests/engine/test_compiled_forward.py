import pytest
import torch

from minedraft import LLM, SamplingParams
from minedraft.config import EngineConfig
from minedraft.engine import compiled_forward
from minedraft.models import attention

PROMPTS = [{"prompt_token_ids": p} for p in ([5, 17, 3, 44, 9, 2, 61], [8], [90, 12, 33, 1, 7], [40, 41])]


def generate(llm, max_tokens=(9, 14, 5, 11)):
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def eager_tokens(tiny_llama):
    with LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=64, enforce_eager=True) as llm:
        return generate(llm)


def test_compiled_forward_matches_eager_and_pads_to_the_next_size(tiny_llama, eager_tokens):
    # Sizes 1 and 4: the prefill runs eagerly; decode steps of 4 rows run in the size-4 graph, and
    # once rows finish, steps of 3 and 2 rows run in it padded, a step of one row in the size-1 graph.
    with LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=64, compile_sizes=[4, 1]) as llm:
        compiled = llm.engine.runner.compiled
        assert compiled.sizes == (1, 4) and not compiled.failed
        calls = []  # (graph size, real tokens) of every compiled call
        graph = compiled._graph

        def recording(*args, **kwargs):
            calls.append((len(args[1]), attention._layout.get().num_tokens))
            return graph(*args, **kwargs)

        compiled._graph = recording
        assert generate(llm) == eager_tokens
        assert {size for size, _ in calls} == {1, 4}
        assert {n for size, n in calls if size == 4} >= {2, 3, 4}  # padded, and not
        assert sum(len(t) for t in eager_tokens) > 0
        # One request at a time: every decode step is one token through the size-1 graph.
        calls.clear()
        one = llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=9, ignore_eos=True), use_tqdm=False)
        assert one[0].outputs[0].token_ids == eager_tokens[0] and calls.count((1, 1)) >= 8


def test_compiled_logits_equal_eager_logits(tiny_llama):
    with LLM(str(tiny_llama), dtype="float64", max_num_seqs=2, max_model_len=64, compile_sizes=[4]) as llm:
        runner = llm.engine.runner
        from minedraft.engine.model_runner import Row

        slot = runner.cache.allocate()
        runner.forward([Row(slot, [3, 1, 4, 1, 5, 9, 2, 6])])  # 8 tokens: eager prefill
        compiled = runner.forward([Row(slot, [5, 3, 5], 3)])  # 3 tokens, padded to 4
        runner.cache.truncate(slot, 8)
        runner.compiled.failed = True  # the same step eagerly
        eager = runner.forward([Row(slot, [5, 3, 5], 3)])
        torch.testing.assert_close(compiled, eager, rtol=1e-9, atol=1e-9)


def test_a_failing_compiler_warns_once_and_runs_eagerly(tiny_llama, eager_tokens, monkeypatch):
    def broken(fn, **kwargs):
        def call(*args, **kw):
            raise RuntimeError("no C++ compiler found")
        return call

    monkeypatch.setattr(compiled_forward.torch, "compile", broken)
    with pytest.warns(UserWarning, match="compiling the forward pass failed.*no C\\+\\+ compiler") as record:
        llm = LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=64, compile_sizes=[1, 2])
    with llm:
        assert len([w for w in record if "compiling" in str(w.message)]) == 1
        assert llm.engine.runner.compiled.failed
        assert generate(llm) == eager_tokens


def test_compile_settings_are_validated(tiny_llama):
    assert EngineConfig(str(tiny_llama), compile_sizes=[4, 1, 4]).compile_sizes == (1, 4)
    assert EngineConfig(str(tiny_llama), compile_sizes=[4], enforce_eager=True).compile_sizes == ()
    for bad in ([0], [1.5], "1,2", [True]):
        with pytest.raises(ValueError, match="compile_sizes"):
            EngineConfig(str(tiny_llama), compile_sizes=bad)
    with pytest.raises(ValueError, match="enforce_eager"):
        EngineConfig(str(tiny_llama), enforce_eager="yes")


def test_graphs_are_cached_on_disk_and_shared_across_cache_shapes(tiny_llama, tmp_path, monkeypatch):
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    kwargs = dict(dtype="float64", compile_sizes=[1])
    with LLM(str(tiny_llama), max_num_seqs=4, max_model_len=64, **kwargs):
        pass
    assert any(tmp_path.glob("fxgraph/*/*")), "the frozen graph was not written to the cache"
    hits = counters["inductor"]["fxgraph_cache_hit"]
    # Another engine with other slots and another max_model_len: the same graph, from the cache.
    with LLM(str(tiny_llama), max_num_seqs=2, max_model_len=96, **kwargs) as llm:
        assert not llm.engine.runner.compiled.failed
    assert counters["inductor"]["fxgraph_cache_hit"] == hits + 1
