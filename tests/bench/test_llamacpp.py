"""bench llamacpp without building llama.cpp: the parsing of its tools' output (samples captured
from the 11434.0.0 build on 2026-12-08), the skip where it can't be built, and the table."""

import argparse

import pytest

from minedraft.bench import llamacpp
from minedraft.bench.llamacpp import ROWS, parse_batched_bench, parse_llama_bench, parse_lookup, table

# `llama-bench -m SmolLM2-135M-Instruct.Q4_1.gguf -t 1 -n 0 -p 512 -r 1 -o jsonl`
LLAMA_BENCH = (
    '{"build_commit": "unknown", "build_number": 0, "cpu_info": "AMD EPYC", "gpu_info": "", "backends": "CPU", '
    '"model_filename": "SmolLM2-135M-Instruct.Q4_1.gguf", "model_type": "llama 256M Q4_1", "model_size": 96576768, '
    '"model_n_params": 134515008, "n_batch": 2048, "n_ubatch": 512, "n_threads": 1, "cpu_mask": "0x0", '
    '"cpu_strict": false, "poll": 50, "type_k": "f16", "type_v": "f16", "n_gpu_layers": -1, "n_cpu_moe": 0, '
    '"split_mode": "layer", "main_gpu": 0, "no_kv_offload": false, "flash_attn": -1, "devices": "auto", '
    '"tensor_split": "0.00", "tensor_buft_overrides": "none", "load_mode": "auto", "lazy_mode": "auto", '
    '"embeddings": false, "no_op_offload": 0, "no_host": false, "repack": true, "fit_target": 0, "fit_min_ctx": 0, '
    '"n_prompt": 512, "n_gen": 0, "n_depth": 0, "test_time": "2026-12-08T00:48:14Z", "avg_ns": 3821167005, '
    '"stddev_ns": 0, "avg_ts": 133.990480, "stddev_ts": 0.000000, "samples_ns": [ 3821167005 ],'
    '"samples_ts": [ 133.99 ]}\n')

# `llama-batched-bench -m ... -t 1 -c 512 -npp 16 -ntg 16 -npl 8 --output-format jsonl`
BATCHED_BENCH = (
    '{"n_kv_max": 2048, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1, "is_pp_shared": 0, "n_gpu_layers": -1, '
    '"n_threads": 1, "n_threads_batch": 1, "pp": 16, "tg": 16, "pl": 8, "n_kv": 256, "t_pp": 1.051974, '
    '"speed_pp": 121.676003, "t_tg": 1.723816, "speed_tg": 74.253860, "t": 2.775790, "speed": 92.225990}\n\n')

# The end of `llama-lookup -m ... -t 1 -f prompt.txt -n 64 --spec-draft-n-max 3 --temp 0 --ignore-eos`'s stderr
LOOKUP = """0.02.188.767 I encoded   76 tokens in    0.939 seconds, speed:  153.382 t/s
0.02.188.788 I decoded   68 tokens in    0.863 seconds, speed:   78.786 t/s
0.02.188.789 I
0.02.188.817 I n_draft      = 3
0.02.188.845 I n_drafted    = 45
0.02.188.905 I accept       = 82.222%
"""


def test_the_tools_outputs_give_their_tokens_per_second():
    assert parse_llama_bench(LLAMA_BENCH) == pytest.approx(133.99048)
    assert parse_batched_bench(BATCHED_BENCH) == pytest.approx(74.25386)  # S_TG, not S_PP nor S
    assert parse_lookup(LOOKUP) == pytest.approx(68 / 0.863)  # decoded, not encoded
    with pytest.raises(ValueError, match="decoded"):
        parse_lookup("error: failed to load model\n")


def test_a_missing_compiler_skips_with_a_message(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("MINEDRAFT_CACHE", str(tmp_path))
    monkeypatch.setattr(llamacpp.shutil, "which", lambda name: "/usr/bin/cmake" if name == "cmake" else None)
    monkeypatch.setattr(llamacpp, "cache_root", lambda: tmp_path)
    with pytest.raises(llamacpp.Unavailable, match="C\\+\\+ compiler"):
        llamacpp.build()
    args = argparse.Namespace(threads="1", repeats=1, output_len=8, prompt_len=8, model=None, enforce_eager=True)
    assert llamacpp.run(args) is None
    err = capsys.readouterr().err
    assert err.startswith("bench llamacpp skipped: building llama.cpp needs a C++ compiler and a C compiler")
    assert not list(tmp_path.rglob("llama-bench"))


def test_table_has_medians_and_ratio_per_row_and_threads():
    runs = {(ROWS[0], 1, "llama.cpp"): [70.0, 80.0, 75.0], (ROWS[0], 1, "minedraft"): [30.0, 20.0, 25.0],
            (ROWS[0], 2, "llama.cpp"): [100.0], (ROWS[0], 2, "minedraft"): [150.0]}
    assert table(runs).splitlines() == [
        "| tokens/s | threads | llama.cpp | MineDraft | ratio |",
        "| --- | --- | --- | --- | --- |",
        f"| {ROWS[0]} | 1 | 75.0 | 25.0 | 0.33x |",
        f"| {ROWS[0]} | 2 | 100.0 | 150.0 | 1.50x |",
    ]
