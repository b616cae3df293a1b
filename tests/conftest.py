"""Shared fixtures: tiny random-weight checkpoints (float64) and the bundled SmolLM2 model."""

import types

import pytest
import torch

TINY = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    eos_token_id=None,
    bos_token_id=None,
    pad_token_id=None,
)


def save_tiny_checkpoint(path, arch: str = "llama", seed: int = 0, **overrides):
    """A random-weight Hugging Face checkpoint, float64, weights large enough to be peaked."""
    import transformers

    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[arch]
    config = config_cls(**{**TINY, **overrides})
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.25)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama"), "llama")


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory):
    """Another random model with the target's vocabulary: it agrees with it only sometimes."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_draft"), "llama", seed=1, num_hidden_layers=1)


@pytest.fixture(scope="session")
def smollm2_path():
    """The bundled default model as a converted checkpoint folder (converts once per machine)."""
    from minedraft.models.loader import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    from minedraft import LLM

    return LLM(str(smollm2_path), max_num_seqs=8, max_model_len=512)


def save_distilled_draft(path, target, init_layers=(1,), keep_every: int = 3):
    """A drafter in the format `minedraft train-draft` exports: some of the target's layers, the
    target's embedding (shared, not stored), a head over part of the vocabulary (float16)."""
    from minedraft.models.loader import read_config
    from minedraft.training.distill import Student

    vocab = read_config(target)["vocab_size"]
    ids = torch.tensor([i for i in range(vocab) if i % keep_every])
    return Student(target, init_layers, ids).export(path, {})


@pytest.fixture(scope="session")
def tiny_distilled(tiny_llama, tmp_path_factory):
    return save_distilled_draft(tmp_path_factory.mktemp("tiny_distilled"), tiny_llama)


def keep_float64(hf_model):
    """transformers computes RMSNorm and RoPE in float32 even in a float64 model; make those two
    float64 so a 1e-9 comparison measures our decoder, not transformers' downcasts."""

    def norm_forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rope_forward(self, x, position_ids):
        freqs = position_ids[..., None].double() * self.inv_freq.double()
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    for module in hf_model.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm"):
            module.forward = types.MethodType(norm_forward, module)
        elif name.endswith("RotaryEmbedding"):
            module.forward = types.MethodType(rope_forward, module)
    return hf_model
