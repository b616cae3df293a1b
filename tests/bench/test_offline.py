import pytest

from minedraft.bench.datasets import load_prompts, select
from minedraft.bench.offline import outputs_figures
from minedraft.engine.sequence import CompletionOutput, RequestOutput


def finished(arrival, first, finish, num_tokens):
    out = CompletionOutput(0, "", list(range(num_tokens)), "length")
    return RequestOutput("r", None, [1, 2], [out], True, arrival, first, finish)


def test_request_figures_on_a_known_timeline():
    # Two requests over a 10 s run: (arrive 0, first token 1, done 5, 5 tokens), (2, 2.5, 10, 16 tokens).
    figures = outputs_figures([finished(0, 1, 5, 5), finished(2, 2.5, 10, 16)], makespan=10)
    assert figures["output_tokens_per_s"] == pytest.approx(2.1)
    assert figures["requests_per_s"] == pytest.approx(0.2)
    assert figures["latency_mean_s"] == pytest.approx(6.5)  # (5 + 8) / 2
    assert figures["latency_p50_s"] == pytest.approx(6.5)
    assert figures["ttft_mean_s"] == pytest.approx(0.75)  # (1 + 0.5) / 2
    assert figures["tpot_mean_s"] == pytest.approx((4 / 4 + 7.5 / 15) / 2)  # (E2E - TTFT) / (tokens - 1)
    assert figures["e2e_s"] == [5, 8]


def test_prompt_sets(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"turns": ["first", "second"]}\n{"prompt": "plain"}\n')
    assert sorted(load_prompts(str(jsonl), None)) == ["first", "plain"]
    sharegpt = tmp_path / "s.json"
    sharegpt.write_text('[{"conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "x"}]}]')
    assert load_prompts(str(sharegpt), 3) == ["hello"] * 3
    assert len(load_prompts(None, 5)) == 5
    assert select([1, 2, 3], 2, seed=1) == select([1, 2, 3], 2, seed=1)
    with pytest.raises(FileNotFoundError):
        load_prompts(str(tmp_path / "missing.jsonl"), 2)


def test_trace_figures_on_a_known_timeline():
    from minedraft.bench.offline import trace_figures

    trace = [
        {"kind": "decode", "group": -1, "size": 4, "start": 0.0, "end": 1.0},
        {"kind": "draft", "group": 0, "size": 2, "start": 1.0, "end": 2.0},
        {"kind": "draft", "group": 1, "size": 2, "start": 2.0, "end": 2.5},
        {"kind": "verify", "group": 0, "size": 2, "start": 2.0, "end": 4.0},
        {"kind": "verify", "group": 1, "size": 2, "start": 4.0, "end": 5.0},
    ]
    figures = trace_figures(trace, makespan=10.0)
    assert figures["verify_s_median"] == 1.5 and figures["draft_s_median"] == 0.75
    assert figures["target_idle_share"] == 0.6  # busy 1 + 2 + 1 of 10 s
    assert figures["drafter_idle_share"] == 0.85  # busy 1.5 of 10 s
