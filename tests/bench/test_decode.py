import argparse

import pytest
import torch

from minedraft.bench.decode import decode_step_times, held_bytes, layout_check, run, weight_bytes
from minedraft.kernels import small_gemm
from minedraft.models.llama import Linear, cpu_packing_supported
from minedraft.engine.model_runner import ModelRunner
from minedraft.models.loader import load_model


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_layout_check_times_the_layouts_the_model_holds(tiny_llama, dtype):
    model = load_model(tiny_llama, dtype, torch.device("cpu"))
    times = layout_check(model, repeats=1)
    dense = ["x @ W[in, out], 1 row", "F.linear with W[out, in], 1 row", "x @ W[in, out], 8 rows"]
    expected = {
        torch.float64: dense,
        torch.float32: dense + ["oneDNN packed, 8 rows"] * cpu_packing_supported(torch.float32)
        + ["small-row kernel, 8 rows"] * (cpu_packing_supported(torch.float32) and small_gemm.build()),
        torch.bfloat16: (dense + ["oneDNN packed, 8 rows", "small-row kernel, 8 rows"] if small_gemm.bf16_supported()
                         else ["oneDNN packed, 8 rows"]) if cpu_packing_supported(torch.bfloat16) else dense,
    }[dtype]
    assert list(times) == expected and all(t > 0 for t in times.values())
    # A step reads each linear weight once: the dense copy where one is kept, never both copies.
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    one_copy = sum((m.weight if m.weight is not None else m.packed).numel() for m in linears)
    biases_and_norms = sum(p.numel() for n, p in model.named_parameters() if n.endswith(("bias", "norm.weight")))
    assert weight_bytes(model) == (one_copy + biases_and_norms) * torch.finfo(dtype).bits // 8
    # It holds both copies where it keeps the dense one beside the packed one (float32 on CPU, and
    # bfloat16 with the kernel), and the kernel's panels (each weight's columns padded to a
    # multiple of 32).
    both = sum(m.weight.numel() for m in linears if m.weight is not None and m.packed is not None)
    panels = sum(m.in_features * -(-m.weight.shape[1] // 32) * 32 for m in linears if m.small is not None)
    embedding = model.embed.numel() if model.embed is not None else 0
    expected = (one_copy + both + panels + biases_and_norms + embedding) * torch.finfo(dtype).bits // 8
    assert held_bytes(model) == expected


def test_a_one_token_run_is_refused_before_anything_loads():
    args = argparse.Namespace(num_threads=None, batch_sizes="1", output_len=1, model="/nonexistent")
    with pytest.raises(ValueError, match="--output-len must be >= 2"):
        run(args)


def test_decode_steps_can_carry_a_prompt_chunk_and_leave_the_cache_as_found(tiny_llama):
    model = load_model(tiny_llama, torch.float32, torch.device("cpu"))
    runner = ModelRunner(model, 4, 64, torch.float32, torch.device("cpu"))
    carried = []
    forward = runner.forward
    runner.forward = lambda rows: carried.append([len(r.tokens) for r in rows]) or forward(rows)
    free = runner.cache.num_free
    times = decode_step_times(runner, [[5] * 10], 3, chunk=6)
    assert len(times) == 3 and all(t > 0 for t in times)
    assert carried == [[10], [1, 6], [1, 6], [1, 6]]  # the prefill, then each step: the decode row and the chunk
    assert runner.cache.num_free == free
