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


def test_trace_figures_mean_step_times_rows_and_prefill():
    from minedraft.bench.offline import trace_figures

    trace = [
        {"kind": "prefill", "group": -1, "size": 2, "start": 0.0, "end": 2.0},
        {"kind": "decode", "group": -1, "size": 2, "start": 2.0, "end": 3.0},
        {"kind": "decode", "group": -1, "size": 1, "start": 3.0, "end": 5.0},
    ]
    figures = trace_figures(trace, makespan=5.0)
    assert figures["prefill_s"] == 2.0 and figures["decode_s_mean"] == 1.5
    assert figures["rows_per_step"] == 1.5 and figures["verify_s_mean"] is None
    assert figures["target_idle_share"] == 0.0


def test_paper_figures_count_the_decode_phase_only():
    from minedraft.bench.offline import paper_figures

    # 5 + 16 tokens, of which the two first ones came from prefills that took 3 of the 10 s.
    figures = paper_figures([finished(0, 1, 5, 5), finished(2, 2.5, 10, 16)], makespan=10, prefill_s=3)
    assert figures["generation_tokens_per_s"] == pytest.approx(19 / 7)
    assert figures["seconds_per_request"] == 5


def test_model_prediction_beside_measurement():
    from minedraft.bench.offline import predict

    def trace(verify_s: float, draft_s: list[float], rows: list[tuple[int, int]]) -> list[dict]:
        events = []
        for t in draft_s:
            events.append({"kind": "draft", "start": 0.0, "end": t})
            events.append({"kind": "verify", "start": 0.0, "end": verify_s, "drafted": [], "accepted": []})
        events[-1].update(drafted=[d for d, _ in rows], accepted=[a for _, a in rows])
        return events

    ar = {"generation_tokens_per_s": 80.0, "decode_s_mean": 0.1, "rows_per_step": 8}  # 80 tok/s
    # Half the rows accept both drafts, half none: acceptance 0.5 at draft 1, 1.0 at draft 2.
    rows = [(2, 2), (2, 0)] * 4
    sd = {"generation_tokens_per_s": 70.0, "rows_per_step": 8}
    psd = {"generation_tokens_per_s": 56.0, "rows_per_step": 4}
    by = {("ar", None, 8): ar, ("sd", 2, 8): sd, ("psd", 2, 8): psd}
    results = {("ar", None, 8): [{"trace": []}],
               ("sd", 2, 8): [{"trace": trace(0.15, [0.05] * 3, rows), "overlapped_share": 0.0}],
               # psd: the first drafting step (not overlapped) is not part of any step's max;
               # then 0.05 and 0.3 beside verifications of 0.15: steps of 0.15 and 0.3.
               ("psd", 2, 8): [{"trace": trace(0.15, [0.5, 0.05, 0.3], rows), "overlapped_share": 1.0}]}
    assert predict(results, by) == pytest.approx([0.5, 1.0])
    assert sd["tokens_per_row"] == sd["predicted_tokens_per_row"] == pytest.approx(2.0)
    assert sd["predicted_speedup_vs_ar"] == pytest.approx(1.0)  # 8 rows x 2 tokens per 0.2 s
    assert sd["generation_speedup_vs_ar"] == pytest.approx(70 / 80)
    assert psd["predicted_speedup_vs_ar"] == pytest.approx(4 * 2 / 0.225 / 80)  # 4 rows x 2 tokens per 0.225 s
    # A repeat whose drafter failed before drafting: nothing to model there, the other repeat stands.
    results[("sd", 2, 8)].append({"trace": [], "overlapped_share": 0.0})
    predict(results, by)
    assert sd["predicted_speedup_vs_ar"] == pytest.approx(1.0)
