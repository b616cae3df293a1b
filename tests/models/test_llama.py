import pytest
import torch

from conftest import keep_float64, save_tiny_checkpoint
from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.kernels import small_gemm
from minedraft.models.hf_format import ModelArgs
from minedraft.models.llama import Linear, cpu_packing_supported, rope_inv_freq
from minedraft.models.loader import load_model


def hf_reference_logits(folder, dtype, prompts, steps):
    """Logits per prompt for its prefill and `steps` greedy continuations, one prompt at a time."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    if dtype == torch.float64:
        keep_float64(hf)
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            rows = []
            for _ in range(steps + 1):
                logits = hf(ids).logits[0, -1]
                rows.append(logits)
                ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
            out.append(torch.stack(rows))
    return out


def our_logits(folder, dtype, prompts, steps, follow=None):
    """The same, all prompts batched together: one mixed-length prefill, then decode steps; with
    `follow` (reference logits per prompt), each step feeds the reference's greedy token rather than
    its own, so that a near-tie resolved the other way in bfloat16 cannot send the two apart."""
    model = load_model(folder, dtype, torch.device("cpu"))
    runner = ModelRunner(model, len(prompts), 128, dtype, torch.device("cpu"))
    slots = [runner.cache.allocate() for _ in prompts]
    rows = [Row(slot, list(p)) for slot, p in zip(slots, prompts)]
    got = [[] for _ in prompts]
    for step in range(steps + 1):
        logits = runner.forward(rows)
        for i, row_logits in enumerate(logits):
            got[i].append(row_logits)
        chosen = logits if follow is None else [f[step] for f in follow]
        rows = [Row(slot, [int(l.argmax())]) for slot, l in zip(slots, chosen)]
    return [torch.stack(g) for g in got]


PROMPTS = [[5, 17, 3, 44, 9, 2, 61], [8], [90, 12, 33, 33, 1, 7, 7, 7, 70, 4, 11, 2, 3]]


@pytest.mark.parametrize("arch,extra", [
    ("llama", {}),
    ("llama", {"tie_word_embeddings": True, "attention_bias": True}),
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}),
    ("qwen2", {}),
    ("qwen3", {}),
])
def test_float64_logits_match_transformers(tmp_path, arch, extra):
    folder = save_tiny_checkpoint(tmp_path, arch, **extra)
    ref = hf_reference_logits(folder, torch.float64, PROMPTS, steps=4)
    got = our_logits(folder, torch.float64, PROMPTS, steps=4)
    for r, g in zip(ref, got):
        assert (r - g).abs().max() < 1e-9


def test_float32_logits_match_transformers_on_smollm2(smollm2_path):
    prompts = [[1, 504, 3575, 282, 4649, 314], [42, 9000, 17] * 9, [7]]
    ref = hf_reference_logits(smollm2_path, torch.float32, prompts, steps=3)
    got = our_logits(smollm2_path, torch.float32, prompts, steps=3)
    for r, g in zip(ref, got):
        assert (r - g).abs().max() < 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("extra", [{}, {"tie_word_embeddings": True, "attention_bias": True}])
def test_packed_logits_match_transformers(tmp_path, dtype, extra):
    """On CPU the loader packs every linear weight for oneDNN (bfloat16 only where the CPU has it)
    and for the small-row kernel where it builds (bfloat16 only with AVX512-BF16); the [in, out]
    copy stays for float32 and for the kernel. Every path, several rows (prefill: oneDNN or the
    kernel; decode: the kernel) and one row, must compute what transformers computes, up to the
    dtype's rounding."""
    folder = save_tiny_checkpoint(tmp_path, "llama", **extra)
    model = load_model(folder, dtype, torch.device("cpu"))
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    if cpu_packing_supported(dtype):
        kernel = small_gemm.build() and (dtype == torch.float32 or small_gemm.bf16_supported())
        assert all((m.small is not None) == kernel for m in linears)
        assert all(m.packed is not None and (m.weight is not None) == (dtype == torch.float32 or kernel)
                   for m in linears)
    else:
        assert not any(m.packed is not None for m in linears)
    tolerance = 1e-5 if dtype == torch.float32 else 0.05
    for prompts in (PROMPTS, PROMPTS[1:2]):
        ref = hf_reference_logits(folder, dtype, prompts, steps=3)
        got = our_logits(folder, dtype, prompts, steps=3, follow=ref)
        for r, g in zip(ref, got):
            assert (r.float() - g.float()).abs().max() < tolerance * r.float().abs().max()


def test_llama3_rope_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    cfg = LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_theta=500000.0, rope_scaling=scaling)
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    args = ModelArgs.from_hf({**cfg.to_dict(), "architectures": ["LlamaForCausalLM"]})
    assert torch.equal(rope_inv_freq(args), ref)
