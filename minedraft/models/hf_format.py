"""Hugging Face checkpoints as our decoder reads them: config.json parsed into `ModelArgs` (with what
the decoder does not implement rejected), and parameter names mapped onto the decoder's."""

from dataclasses import dataclass

import torch

from minedraft.models.draft_format import VOCAB_TENSOR, draft_vocab_size, uses_target_embedding

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: tuple[tuple[str, float], ...] | None  # llama3-style parameters, hashable
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    # A drafter made for a target (format: minedraft.models.draft_format): its head covers only
    # these many tokens, and it reads the target's input embedding.
    draft_vocab_size: int | None = None
    shared_embedding: bool = False

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelArgs":
        """Read a Hugging Face config.json; reject what this decoder does not implement."""
        archs = cfg.get("architectures") or ["?"]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {cfg['hidden_act']!r}; only 'silu' is implemented")
        if cfg.get("mlp_bias", False):
            raise ValueError("unsupported mlp_bias=true")
        if cfg.get("use_sliding_window", False):
            raise ValueError("unsupported use_sliding_window=true")
        rope = dict(cfg.get("rope_parameters") or {})
        rope.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
        rope.update(cfg.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "llama3"):
            raise ValueError(f"unsupported rope_type {rope_type!r}; supported: 'default', 'llama3'")
        scaling = None
        if rope_type == "llama3":
            keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            scaling = tuple((k, float(rope[k])) for k in keys)
        bias = bool(cfg.get("attention_bias", False))
        num_heads = cfg["num_attention_heads"]
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope["rope_theta"]),
            rope_scaling=scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bias or arch == "Qwen2ForCausalLM",
            o_bias=bias,
            qk_norm=arch == "Qwen3ForCausalLM",
            draft_vocab_size=draft_vocab_size(cfg),
            shared_embedding=uses_target_embedding(cfg),
        )


def fuse_hf_state_dict(args: ModelArgs, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map Hugging Face parameter names onto ours: q/k/v and gate/up concatenated, linear weights
    transposed to [in, out]. A drafter sharing its target's embedding finds it in `hf` too."""
    embed = hf["model.embed_tokens.weight"]
    out = {"norm.weight": hf["model.norm.weight"]}
    if args.draft_vocab_size is not None:
        out["draft_vocab"] = hf[VOCAB_TENSOR]
    if args.tie_word_embeddings:
        out["lm_head.weight"] = embed.t()
    else:
        out["embed"] = embed
        out["lm_head.weight"] = hf["lm_head.weight"].t()
    for i in range(args.num_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        attn = src + "self_attn."
        out[dst + "attn_norm.weight"] = hf[src + "input_layernorm.weight"]
        out[dst + "mlp_norm.weight"] = hf[src + "post_attention_layernorm.weight"]
        out[dst + "attn.qkv.weight"] = torch.cat([hf[attn + f"{p}_proj.weight"] for p in "qkv"]).t()
        if args.qkv_bias:
            out[dst + "attn.qkv.bias"] = torch.cat([hf[attn + f"{p}_proj.bias"] for p in "qkv"])
        out[dst + "attn.o_proj.weight"] = hf[attn + "o_proj.weight"].t()
        if args.o_bias:
            out[dst + "attn.o_proj.bias"] = hf[attn + "o_proj.bias"]
        if args.qk_norm:
            out[dst + "attn.q_norm.weight"] = hf[attn + "q_norm.weight"]
            out[dst + "attn.k_norm.weight"] = hf[attn + "k_norm.weight"]
        mlp = src + "mlp."
        out[dst + "mlp.gate_up.weight"] = torch.cat([hf[mlp + "gate_proj.weight"], hf[mlp + "up_proj.weight"]]).t()
        out[dst + "mlp.down.weight"] = hf[mlp + "down_proj.weight"].t()
    return out
