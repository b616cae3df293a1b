from minedraft.bench.plots import plot_itl, plot_latency_cdf, plot_throughput_vs_k, plot_timeline


def test_plots_write_pngs(tmp_path):
    rows = [{"mode": "ar", "k": None, "concurrency": 8, "output_tokens_per_s": 40.0}]
    rows += [{"mode": m, "k": k, "concurrency": c, "output_tokens_per_s": 30.0 + i}
             for m in ("sd", "psd") for c in (8, 16) for i, k in enumerate((1, 2, "auto"))]
    plot_throughput_vs_k(rows, tmp_path / "k.png")
    results = {("ar", None, 8): [{"e2e_s": [1.0, 2.0]}], ("psd", 2, 8): [{"e2e_s": [0.5, 3.0]}]}
    plot_latency_cdf(results, tmp_path / "cdf.png")
    trace = [{"kind": "prefill", "group": -1, "size": 2, "start": 0.0, "end": 1.0},
             {"kind": "draft", "group": 0, "size": 1, "start": 1.0, "end": 1.2},
             {"kind": "verify", "group": 1, "size": 1, "start": 1.0, "end": 1.5}]
    plot_timeline(trace, tmp_path / "t.png", "psd")
    for name in ("k.png", "cdf.png", "t.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_itl_writes_a_png(tmp_path):
    path = tmp_path / "plots" / "itl.png"  # a folder that does not exist yet
    plot_itl([0.0, 0.4, 1.0], [[0.2, 0.25, 0.4], [0.6, 0.61, 0.9, 1.5]], path, "rate 2/s")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
