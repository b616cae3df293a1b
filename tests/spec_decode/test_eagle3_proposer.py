"""EAGLE-3 heads: the public checkpoint layout, greedy equality with AR and the target's
distribution at temperature 1, in every placement."""

import json

import pytest
import torch
from safetensors.torch import save_file

from minedraft import LLM
from minedraft.models.eagle3 import load_eagle3, save_eagle3
from minedraft.models.loader import load_model, read_config
from minedraft.training.eagle3 import new_head
from engine.test_speculative import LOOKUP_PROMPT, PROMPTS, exact_second_token_distribution, greedy_params, second_token_histogram, token_ids

CPU = torch.device("cpu")


def save_head(target_folder, out, keep_every=1, seed=0):
    """A random EAGLE-3 head for a target (its vocabulary, or every `keep_every`-th token of it)."""
    target = load_model(target_folder, torch.float64, CPU)
    ids = torch.arange(0, target.args.vocab_size, keep_every)
    n = target.args.num_layers
    head = new_head(target, ids, (0, n // 2, n - 1), seed)
    with torch.no_grad():  # weights large enough that the head's guesses vary with its input
        for name, p in head.named_parameters():
            if not name.endswith("norm.weight") and name != "lm_head.weight":
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(seed))
    return save_eagle3(head, out, (0, n // 2, n - 1), dtype=torch.float64)


@pytest.fixture(scope="module")
def tiny_eagle3(tiny_llama, tmp_path_factory):
    return save_head(tiny_llama, tmp_path_factory.mktemp("tiny_eagle3"), keep_every=2)


@pytest.fixture(scope="module")
def ar(tiny_llama):
    return LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=96)


def test_a_head_in_the_public_layout_loads_and_drafts(tmp_path):
    """Tensor names and config as vLLM and the EAGLE reference write them (q/k/v and gate/up
    separate, [out, in] weights, d2t offsets, t2d mask, no target_hidden_size or layer ids: the
    default layers 2, n // 2, n - 3)."""
    from conftest import save_tiny_checkpoint

    target_folder = save_tiny_checkpoint(tmp_path / "target", "llama", num_hidden_layers=6)
    tmp_path = tmp_path / "head"
    tmp_path.mkdir()
    cfg = read_config(target_folder)
    H, V, dv, inter = cfg["hidden_size"], cfg["vocab_size"], 40, 80
    heads, kv_heads, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    g = torch.Generator().manual_seed(0)

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.3

    target_ids = torch.randperm(V, generator=g)[:dv].sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[target_ids] = True
    m = "midlayer."
    tensors = {"fc.weight": w(H, 3 * H), m + "input_layernorm.weight": 1 + w(H) / 10,
               m + "hidden_norm.weight": 1 + w(H) / 10, m + "post_attention_layernorm.weight": 1 + w(H) / 10,
               m + "self_attn.q_proj.weight": w(heads * hd, 2 * H), m + "self_attn.k_proj.weight": w(kv_heads * hd, 2 * H),
               m + "self_attn.v_proj.weight": w(kv_heads * hd, 2 * H), m + "self_attn.o_proj.weight": w(H, heads * hd),
               m + "mlp.gate_proj.weight": w(inter, H), m + "mlp.up_proj.weight": w(inter, H),
               m + "mlp.down_proj.weight": w(H, inter), "norm.weight": 1 + w(H) / 10, "lm_head.weight": w(dv, H),
               "d2t": target_ids - torch.arange(dv), "t2d": t2d}
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "model.safetensors")
    config = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": H, "intermediate_size": inter,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": hd, "num_hidden_layers": 1,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 256, "vocab_size": V,
              "draft_vocab_size": dv, "hidden_act": "silu", "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    target = load_model(target_folder, torch.float64, CPU)
    head = load_eagle3(tmp_path, torch.float64, CPU, target.input_embedding)
    assert torch.equal(head.draft_to_target, target_ids)
    assert head.config.aux_layers(6) == (2, 3, 3)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    kwargs = dict(dtype="float64", max_num_seqs=4, max_model_len=96)
    expected = token_ids(LLM(str(target_folder), **kwargs).generate(prompts, greedy_params(), use_tqdm=False))
    with LLM(str(target_folder), **kwargs,
             speculative_config={"method": "eagle3", "model": str(tmp_path), "num_speculative_tokens": 3}) as sd:
        assert token_ids(sd.generate(prompts, greedy_params(), use_tqdm=False)) == expected
        assert sd.get_metrics()["num_draft_tokens"] > 0


PLACEMENTS = [{}, {"draft_device": "cpu"}, {"parallel": True}, {"num_speculative_tokens": "auto"},
              {"tetris": True, "tetris_extra_proposals": 2}, {"parallel": True, "tetris": True},
              {"prompt_lookup_first": True, "prompt_lookup_min": 1},
              {"parallel": True, "prompt_lookup_first": True, "prompt_lookup_min": 1},
              {"prompt_lookup_first": True, "prompt_lookup_min": 1, "num_speculative_tokens": "auto"},
              {"parallel": True, "prompt_lookup_first": True, "prompt_lookup_min": 1, "num_speculative_tokens": "auto"},
              {"parallel": True, "prefill_on_drafter": True}]
IDS = ["sd", "sd-remote", "psd", "sd-auto", "sd-tetris", "psd-tetris", "sd-lookup-first", "psd-lookup-first",
       "sd-lookup-first-auto", "psd-lookup-first-auto", "psd-prefill-on-drafter"]


@pytest.mark.parametrize("chunk", [None, 4], ids=["whole-prompts", "chunks-of-4"])
@pytest.mark.parametrize("placement", PLACEMENTS, ids=IDS)
def test_greedy_eagle3_equals_ar(ar, tiny_llama, tiny_eagle3, placement, chunk):
    """Also with prompts prefilled 4 tokens a step beside the other rows: the head then receives
    the target's states of a prompt chunk by chunk."""
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    expected = token_ids(ar.generate(prompts, greedy_params(), use_tqdm=False))
    spec = {"model": str(tiny_eagle3), "num_speculative_tokens": 3, **placement}
    with LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=96, speculative_config=spec,
             max_num_batched_tokens=chunk) as sd:
        assert sd.engine.config.speculative.method == "eagle3"  # inferred from the checkpoint
        assert token_ids(sd.generate(prompts, greedy_params(), use_tqdm=False)) == expected
        m = sd.get_metrics()
        assert m["num_draft_tokens"] > 0 and m["drafter_failures"] == 0
        if placement.get("num_speculative_tokens") != "auto":
            assert 0 < m["acceptance_rate"] < 1  # both acceptance and rejection exercised
        if placement.get("prompt_lookup_first") and placement.get("num_speculative_tokens") == "auto":
            assert "model_gate" in m["draft_length"]  # the head drafts only while it pays
        if placement.get("prefill_on_drafter"):  # 6 prompts, 4 slots: later ones arrive beside streams
            assert m["num_prompts_prefilled_by_drafter"] >= 1
        assert sd.engine.runner.cache.num_free == 4


@pytest.mark.parametrize("parallel", [False, True], ids=["sd-remote", "psd"])
def test_greedy_eagle3_equals_ar_when_auto_alternates_drafted_and_plain_steps(ar, tiny_llama, tiny_eagle3, parallel):
    """Plain steps (k = 0) between drafted ones, with prompts in chunks: the drafter process must
    get the target's states only with the tokens they belong to, however the two were queued (a
    prompt's last chunk queued while drafts were in flight, then a plain step decoding it)."""
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    expected = token_ids(ar.generate(prompts, greedy_params(), use_tqdm=False))
    spec = {"model": str(tiny_eagle3), "num_speculative_tokens": "auto", "parallel": parallel}
    if not parallel:
        spec["draft_device"] = "cpu"
    with LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=96, speculative_config=spec,
             max_num_batched_tokens=4) as sd:
        controller, steps = sd.engine.draft_length, iter(range(10**6))

        def alternate(running, learn=True):
            controller.k = 3 if next(steps) % 2 else 0
            return controller.k

        controller.plan = alternate
        assert token_ids(sd.generate(prompts, greedy_params(), use_tqdm=False)) == expected
        m = sd.get_metrics()
        assert m["drafter_failures"] == 0 and m["num_draft_tokens"] > 0


def graphs_built() -> int:
    """Graphs Inductor has built or loaded in this process."""
    from torch._dynamo.utils import counters

    return sum(counters["inductor"][k] for k in ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass"))


@pytest.mark.parametrize("placement", [{}, {"parallel": True}], ids=["sd", "psd"])
def test_compiled_eagle3_equals_ar(ar, tiny_llama, tiny_eagle3, placement):
    # Target and head compiled (the drafter process compiles its own): verification passes carry
    # the auxiliary layers, prefill does not, and the head reads two feature widths.
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    expected = token_ids(ar.generate(prompts, greedy_params(), use_tqdm=False))
    spec = {"model": str(tiny_eagle3), "num_speculative_tokens": 3, **placement}
    with LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=96, speculative_config=spec,
             compile_sizes=[1, 4]) as sd:
        built = graphs_built()
        assert token_ids(sd.generate(prompts, greedy_params(), use_tqdm=False)) == expected
        # Warm-up built every graph the passes use: none is built again on first use (features
        # made outside inference mode once failed the warm graphs' guards: 0.3-0.9 s a size).
        assert graphs_built() == built
        assert not sd.engine.runner.compiled.failed and sd.get_metrics()["drafter_failures"] == 0
        if not placement:
            assert not sd.engine.proposer.runner.compiled.failed


@pytest.fixture(scope="module")
def small_vocab_target(tmp_path_factory):
    from conftest import save_tiny_checkpoint

    return save_tiny_checkpoint(tmp_path_factory.mktemp("small_vocab_e3"), "llama", vocab_size=12)


@pytest.mark.parametrize("placement", [{}, {"draft_device": "cpu"}, {"parallel": True},
                                       {"parallel": True, "prompt_lookup_first": True, "prompt_lookup_min": 1},
                                       {"parallel": True, "prefill_on_drafter": True}],
                         ids=["sd", "sd-remote", "psd", "psd-lookup-first", "psd-prefill-on-drafter"])
def test_eagle3_samples_the_targets_distribution(small_vocab_target, tmp_path, placement):
    """Temperature 1: the second token follows the target exactly, with a head over part of the
    vocabulary (tokens outside it come only from the residual)."""
    head = save_head(small_vocab_target, tmp_path, keep_every=1, seed=5)
    prompt = LOOKUP_PROMPT if placement.get("prompt_lookup_first") else [1, 5, 7, 2]
    exact = exact_second_token_distribution(small_vocab_target, prompt)
    with LLM(str(small_vocab_target), dtype="float64", max_num_seqs=64, max_model_len=32,
             speculative_config={"model": str(head), "num_speculative_tokens": 2, **placement}) as sd:
        n = 6000
        empirical = second_token_histogram(sd, prompt, n, exact.numel())
        assert sd.get_metrics()["num_accepted_tokens"] > 0
        if placement.get("prefill_on_drafter"):
            assert sd.get_metrics()["num_prompts_prefilled_by_drafter"] > 0
    # Pearson's chi-square with 11 degrees of freedom; 31.26 is its 0.999 quantile.
    chi2 = (n * (empirical - exact) ** 2 / exact).sum().item()
    assert chi2 < 31.26, chi2


def test_eagle3_config_errors_are_named(tiny_llama, tiny_draft, tiny_eagle3):
    with pytest.raises(ValueError, match="not an EAGLE-3 head"):
        LLM(str(tiny_llama), dtype="float64",
            speculative_config={"method": "eagle3", "model": str(tiny_draft), "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="is an EAGLE-3 head"):
        LLM(str(tiny_llama), dtype="float64",
            speculative_config={"method": "draft_model", "model": str(tiny_eagle3), "num_speculative_tokens": 2})
