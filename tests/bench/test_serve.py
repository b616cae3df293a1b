import argparse

import pytest

from conftest import KEY, LiveServer
from minedraft.bench.serve import Record, run, serve_figures


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


def test_bench_serve_drives_our_server(tiny_chat):
    live = LiveServer(tiny_chat, max_num_seqs=4)
    try:
        args = argparse.Namespace(base_url=live.url, served_model=None, api_key=KEY, dataset=None, num_prompts=6,
                                  request_rate=20.0, max_concurrency=3, output_len=5, temperature=0.0,
                                  ignore_eos=True, seed=0, output_json=None)
        f = run(args)
    finally:
        live.close()
    assert (f["completed"], f["failed"]) == (6, 0)
    assert f["output_tokens_per_s"] * f["duration_s"] == pytest.approx(30)
    assert f["ttft_s"]["mean"] > 0 and f["e2e_s"]["p99"] >= f["e2e_s"]["p50"]
