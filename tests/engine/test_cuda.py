"""CUDA checks, run by scripts/gpu_check.sh when a GPU is lent; skipped elsewhere."""

import pytest
import torch

from minedraft import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROMPTS = [{"prompt_token_ids": p} for p in ([5, 17, 3, 44, 9, 2, 61], [8], [90, 12, 33, 1, 7])]


def greedy(llm):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]


@pytest.mark.parametrize("spec", [None, {"num_speculative_tokens": 3},
                                  {"num_speculative_tokens": 3, "parallel": True, "draft_device": "cuda:0"}],
                         ids=["ar", "sd", "psd"])
def test_cuda_greedy_equals_cpu(tiny_llama, tiny_draft, spec):
    config = None if spec is None else {"model": str(tiny_draft), **spec}
    kwargs = dict(dtype="float64", max_num_seqs=3, max_model_len=64, speculative_config=config)
    with LLM(str(tiny_llama), **kwargs) as cpu, LLM(str(tiny_llama), device="cuda:0", **kwargs) as gpu:
        expected = greedy(cpu)
        assert greedy(gpu) == expected and all(expected)
