"""CUDA checks, run by scripts/gpu_check.sh when a GPU is lent; skipped elsewhere."""

import pytest
import torch

from minedraft import LLM, SamplingParams
from spec_decode.test_eagle3_proposer import save_head

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROMPTS = [{"prompt_token_ids": p} for p in ([5, 17, 3, 44, 9, 2, 61], [8], [90, 12, 33, 1, 7])]


def greedy(llm):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]


@pytest.mark.parametrize("mode", ["ar", "sd", "psd", "eagle3"])
def test_cuda_greedy_equals_cpu(tiny_llama, tiny_draft, tmp_path, mode):
    """On the GPU with CUDA graphs (decode and verification replayed) and eagerly, as on CPU."""
    draft = str(save_head(tiny_llama, tmp_path / "head", keep_every=2)) if mode == "eagle3" else str(tiny_draft)
    spec = {"ar": None, "sd": {}, "eagle3": {}, "psd": {"parallel": True, "draft_device": "cuda:0"}}[mode]
    config = None if spec is None else {"model": draft, "num_speculative_tokens": 3, **spec}
    kwargs = dict(dtype="float64", max_num_seqs=3, max_model_len=64, speculative_config=config)
    with LLM(str(tiny_llama), **kwargs) as cpu:
        expected = greedy(cpu)
    assert all(expected)
    for eager in (False, True):
        with LLM(str(tiny_llama), device="cuda:0", enforce_eager=eager, **kwargs) as gpu:
            assert greedy(gpu) == expected
            graphs = gpu.engine.runner.graphs
            assert graphs is None if eager else graphs.graphs and not graphs.failed
            if mode in ("sd", "eagle3") and not eager:  # the drafter in this process replays its own
                assert gpu.engine.proposer.runner.graphs.graphs


def step_by_step(runner_pairs, steps, **inputs):
    """Largest difference between each pair of runners' outputs over the same steps."""
    worst = 0.0
    for rows in steps:
        outs = [r.run(rows, **inputs) for r in runner_pairs]
        for a, b in zip(*outs):
            if a is not None:
                worst = max(worst, (a - b).abs().max().item())
    return worst


def test_cuda_graph_runners_match_eager_ones(tiny_llama, tmp_path):
    """The target with an EAGLE-3 head's auxiliary layers, and the head with its per-token features."""
    from minedraft.engine.model_runner import ModelRunner, Row
    from minedraft.models.eagle3 import load_eagle3
    from minedraft.models.loader import load_model

    cuda = torch.device("cuda:0")
    target = load_model(tiny_llama, torch.float64, cuda)
    runners = [ModelRunner(target, 4, 64, torch.float64, cuda, cuda_graphs=g) for g in (False, True)]
    for r in runners:
        for _ in range(3):
            r.cache.allocate()
        r.forward([Row(0, list(range(1, 21))), Row(1, list(range(30, 48))), Row(2, list(range(50, 69)))])
    steps = [[Row(0, [7]), Row(1, [3]), Row(2, [11])], [Row(0, [4, 5, 6], 3), Row(2, [9], 1), Row(1, [1, 2], 2)]]
    assert step_by_step(runners, steps, aux_layers=(0, 1, 1)) < 1e-10
    # One graph replayed over and over, every draft rejected (what found a tensor the graph read
    # after its memory had gone back to the allocator: wrong from the third replay on).
    for i in range(8):
        assert step_by_step(runners, [[Row(s, [i, i + 1, i + 2, i + 3], 4) for s in range(3)]]) < 1e-10, i
        for r in runners:
            for s in range(3):
                r.cache.truncate(s, r.cache.lengths[s] - 3)
    head = load_eagle3(save_head(tiny_llama, tmp_path / "head", keep_every=2), torch.float64, cuda,
                       target.input_embedding)
    runners = [ModelRunner(head, 4, 64, torch.float64, cuda, cuda_graphs=g) for g in (False, True)]
    for r in runners:
        for _ in range(3):
            r.cache.allocate()
    gen = torch.Generator(device="cuda").manual_seed(0)
    wide, narrow = 3 * head.config.target_hidden_size, head.hidden_size
    feats = lambda n, w: torch.randn(n, w, dtype=torch.float64, device=cuda, generator=gen)  # noqa: E731
    for rows, width in ([[Row(0, [5, 6, 7]), Row(1, [8, 9]), Row(2, [10])], wide], [[Row(0, [1]), Row(2, [2])], narrow],
                        [[Row(0, [3]), Row(1, [4]), Row(2, [5])], narrow]):
        features = feats(sum(len(r.tokens) for r in rows), width)
        assert step_by_step(runners, [rows], features=features) < 1e-10, width
