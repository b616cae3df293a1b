import argparse
import json
import re

import pytest

from conftest import KEY, LiveServer
from minedraft.bench.serve import Record, parse_goodput, run, serve_figures


def test_serve_figures_on_a_known_timeline():
    records = [
        Record(ok=True, start=0.0, chunk_times=[0.5, 0.7, 1.5], end=1.5, output_tokens=5, prompt_tokens=10),
        Record(ok=True, start=1.0, chunk_times=[1.2, 1.4], end=1.4, output_tokens=2, prompt_tokens=4),
        Record(ok=False, start=2.0, end=2.1, error="HTTP 503"),
    ]
    f = serve_figures(records, duration=2.0)
    assert (f["completed"], f["failed"]) == (2, 1)
    assert f["requests_per_s"] == 1.0 and f["output_tokens_per_s"] == 3.5 and f["total_tokens_per_s"] == 10.5
    assert f["ttft_s"]["mean"] == pytest.approx((0.5 + 0.2) / 2)
    assert f["tpot_s"]["mean"] == pytest.approx(((1.5 - 0.5) / 4 + (1.4 - 1.2) / 1) / 2)
    assert f["itl_s"]["mean"] == pytest.approx((0.2 + 0.8 + 0.2) / 3)
    assert f["e2e_s"]["p50"] == pytest.approx((1.5 + 0.4) / 2)
    assert f["ttft_p50_ms"] == pytest.approx(350) and f["ttft_p99_ms"] == pytest.approx(200 + 300 * 0.99)
    assert f["itl_p50_ms"] == pytest.approx(200) and f["itl_p99_ms"] == pytest.approx(200 + 600 * 0.98)
    assert f["itl_max_ms"] == pytest.approx(800)
    assert f["token_gap_p50_ms"] is None  # the server reported no usage per chunk
    assert "goodput_requests_per_s" not in f  # no SLO given


def test_token_gaps_time_every_arrival_of_tokens_and_itl_only_those_with_text():
    # tokens at .5, .6 and .7 s, the one at .6 not a whole character yet: one chunk of text at .7
    record = Record(ok=True, start=0.0, chunk_times=[0.5, 0.7], token_times=[0.5, 0.6, 0.7], end=0.7,
                    output_tokens=3)
    f = serve_figures([record], duration=1.0)
    assert f["itl_max_ms"] == pytest.approx(200)
    assert f["token_gap_max_ms"] == pytest.approx(100) and f["token_gap_p50_ms"] == pytest.approx(100)


def test_goodput_counts_completed_requests_meeting_every_bound():
    records = [
        Record(ok=True, start=0.0, chunk_times=[0.5, 0.7, 1.5], end=1.5, output_tokens=5),  # TTFT .5, TPOT .25, E2E 1.5
        Record(ok=True, start=1.0, chunk_times=[1.2, 1.4], end=1.4, output_tokens=2),  # TTFT .2, TPOT .2, E2E .4
        Record(ok=True, start=2.0, chunk_times=[2.3], end=2.3, output_tokens=1),  # TTFT .3, no TPOT, E2E .3
        Record(ok=False, start=2.0, chunk_times=[2.05], end=2.1, error="ReadError"),  # fast, but failed mid-stream
    ]

    def goodput(slo_ms):
        f = serve_figures(records, duration=2.0, slo_ms=slo_ms)
        assert f["goodput_slo_ms"] == slo_ms
        return f["goodput_requests_per_s"], f["goodput_share"]

    assert goodput({"ttft": 400}) == (1.0, 0.5)  # the first is late
    assert goodput({"tpot": 220}) == (1.0, 0.5)  # the first is slow; one token has no TPOT to miss
    assert goodput({"e2el": 1500}) == (1.5, 0.75)  # a bound is inclusive, as vLLM's
    assert goodput({"ttft": 250, "e2el": 2000}) == (0.5, 0.25)  # all bounds must hold: only the second


def test_parse_goodput():
    assert parse_goodput(["ttft:2000", "tpot:300", "e2el:1e4"]) == {"ttft": 2000, "tpot": 300, "e2el": 10000}
    assert parse_goodput([]) == {}


@pytest.mark.parametrize("specs, bad", [
    (["ttft2000"], "'ttft2000' is not KEY:VALUE"),
    (["itl:50"], "unknown key 'itl'"),
    ([":50"], "unknown key ''"),
    (["ttft:fast"], "'fast' in 'ttft:fast' is not a number"),
    (["ttft:"], "'' in 'ttft:' is not a number"),
    (["ttft:1:2"], "'1:2' in 'ttft:1:2' is not a number"),
    (["tpot:0"], "'0' in 'tpot:0' must be"),
    (["e2el:-5"], "'-5' in 'e2el:-5' must be"),
    (["e2el:nan"], "'nan' in 'e2el:nan' must be"),
    (["ttft:100", "ttft:200"], "'ttft' given twice"),
])
def test_parse_goodput_names_the_bad_part(specs, bad):
    with pytest.raises(ValueError, match="--goodput: " + re.escape(bad)):
        parse_goodput(specs)


def test_bench_serve_drives_our_server(tiny_chat, tmp_path):
    live = LiveServer(tiny_chat, max_num_seqs=4)
    try:
        args = argparse.Namespace(base_url=live.url, served_model=None, api_key=KEY, dataset=None, num_prompts=6,
                                  request_rate=20.0, max_concurrency=3, output_len=5, temperature=0.0,
                                  ignore_eos=True, seed=0, output_json=str(tmp_path / "run.json"),
                                  goodput=["e2el:600000"], plot_itl=str(tmp_path / "itl.png"), label=None)
        f = run(args)
    finally:
        live.close()
    assert (f["completed"], f["failed"]) == (6, 0)
    assert f["output_tokens_per_s"] * f["duration_s"] == pytest.approx(30)
    assert f["ttft_s"]["mean"] > 0 and f["e2e_s"]["p99"] >= f["e2e_s"]["p50"]
    assert f["token_gap_s"]["max"] > 0  # the server reported usage in every chunk: 4 gaps a request
    assert f["goodput_share"] == 1.0 and f["goodput_requests_per_s"] == f["requests_per_s"]
    assert (tmp_path / "itl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((tmp_path / "run.json").read_text())
    assert all(len(r["token_times"]) == 5 for r in saved["records"])
    assert saved["label"] == "request rate 20/s, max concurrency 3" and saved["figures"]["goodput_share"] == 1.0
