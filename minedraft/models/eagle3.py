"""An EAGLE-3 draft head (Li et al. 2025, arXiv 2503.01840) in the public checkpoint layout that
vLLM, SGLang and the EAGLE reference read, so a head trained elsewhere loads unchanged.

The head is one decoder layer. Its input at a position is the embedding of the token there and a
feature of the previous position: at the first draft step the target's residual stream before three
of its layers (low, middle, high; `fc` maps the three to one hidden state), at later steps the
head's own output before its final norm. Layout (config.json and tensors):

    config: hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, rms_norm_eps,
            rope_theta, vocab_size (the target's), draft_vocab_size, target_hidden_size (optional),
            eagle_config.eagle_aux_hidden_state_layer_ids (optional; default 2, n // 2, n - 3)
    tensors: fc.weight [hidden, 3 * target_hidden], midlayer.{input_layernorm, hidden_norm,
             post_attention_layernorm}.weight, midlayer.self_attn.{q,k,v,o}_proj.weight,
             midlayer.mlp.{gate,up,down}_proj.weight, norm.weight, lm_head.weight [draft_vocab,
             hidden], d2t [draft_vocab] (target id = draft id + d2t), t2d [vocab] (bool),
             embed_tokens.weight (optional; otherwise the target's input embedding)
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from minedraft.models.hf_format import ModelArgs
from minedraft.models.llama import MLP, Attention, Linear, RMSNorm, pack_for_cpu, pack_linears
from minedraft.models.loader import read_config, read_safetensors

ARCHITECTURE = "LlamaForCausalLMEagle3"


def default_aux_layers(target_layers: int) -> tuple[int, ...]:
    """The layers a head reads when its config names none (the EAGLE-3 reference's choice)."""
    return (2, target_layers // 2, target_layers - 3)


@dataclass(frozen=True)
class Eagle3Args:
    layer: ModelArgs  # the one decoder layer's shape; vocab_size is the target's
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...] | None  # None: the default for the target's depth
    norm_before_residual: bool

    @classmethod
    def from_hf(cls, cfg: dict) -> "Eagle3Args":
        layers = cfg.get("num_hidden_layers", 1)
        if layers != 1:
            raise ValueError(f"EAGLE-3 heads with {layers} layers are not supported; one layer is")
        # The layer is a Llama layer (only its attention input is twice as wide).
        layer = ModelArgs.from_hf({**cfg, "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False})
        draft_vocab = cfg.get("draft_vocab_size") or layer.vocab_size
        ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        return cls(
            layer=ModelArgs(**{**layer.__dict__, "draft_vocab_size": draft_vocab}),
            target_hidden_size=cfg.get("target_hidden_size") or layer.hidden_size,
            aux_layer_ids=None if ids is None else tuple(int(i) for i in ids),
            norm_before_residual=bool(cfg.get("norm_before_residual", False)),
        )

    def aux_layers(self, target_layers: int) -> tuple[int, ...]:
        """Target layers whose inputs the head reads."""
        ids = self.aux_layer_ids or default_aux_layers(target_layers)
        if len(ids) != 3 or not all(0 <= i < target_layers for i in ids):
            raise ValueError(f"EAGLE-3 auxiliary layers {list(ids)} do not fit a target of {target_layers} layers")
        return tuple(ids)


class Eagle3Head(nn.Module):
    def __init__(self, args: Eagle3Args):
        super().__init__()
        a = args.layer
        self.args = a  # the layer's shape, what runners and KV caches read
        self.config = args
        self.hidden_size = a.hidden_size
        self.fc = Linear(3 * args.target_hidden_size, a.hidden_size, bias=False)
        self.input_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.hidden_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.attn = Attention(a, input_size=2 * a.hidden_size)
        self.mlp_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.mlp = MLP(a)
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.lm_head = Linear(a.hidden_size, a.draft_vocab_size, bias=False)
        self.draft_to_target = nn.Buffer(torch.empty(a.draft_vocab_size, dtype=torch.long))
        self.embed: torch.Tensor | None = None  # [vocab, hidden]; set by the loader

    def features(self, states: torch.Tensor) -> torch.Tensor:
        """The head's input feature: the target's three layers through `fc`, or (already the
        hidden width) the head's own previous output."""
        return states if states.shape[-1] == self.hidden_size else self.fc(states)

    def layer(self, embeds: torch.Tensor, feature: torch.Tensor, attend) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder layer around an attention function `attend(x)` (cache or training-time
        mask); returns (normed output for the head, pre-norm output: the next step's feature)."""
        normed = self.hidden_norm(feature)
        residual = normed if self.config.norm_before_residual else feature
        x = residual + attend(torch.cat((self.input_norm(embeds), normed), dim=-1))
        x = x + self.mlp(self.mlp_norm(x))
        return self.norm(x), x

    def forward(
        self, input_ids: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], features: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """For N new tokens (row after row, as `Decoder.forward`) and the feature of each one's
        previous position."""
        return self.layer(self.embed[input_ids], self.features(features), lambda x: self.attn(x, rope))

    def pack(self, keep_dense: bool, exact: dict[str, torch.Tensor] | None = None) -> None:
        """Pack every linear weight for oneDNN (on CPU; see `pack_for_cpu`)."""
        pack_linears(self, keep_dense, exact)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary only (`draft_to_target` maps its ids to the target's):
        drafting samples there, and the target's other tokens have draft probability 0."""
        return self.lm_head(hidden)


def is_eagle3(config: dict) -> bool:
    return any("Eagle3" in a for a in config.get("architectures") or []) or "draft_vocab_size" in config


def _hf_to_ours(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Public names onto ours: q/k/v and gate/up concatenated, linear weights transposed to
    [in, out], d2t offsets to absolute target ids."""
    t = {k.removeprefix("model.").replace("layers.0.", "midlayer."): v for k, v in tensors.items()}
    m = "midlayer."
    out = {
        "fc.weight": t["fc.weight"].t(),
        "input_norm.weight": t[m + "input_layernorm.weight"],
        "hidden_norm.weight": t[m + "hidden_norm.weight"],
        "attn.qkv.weight": torch.cat([t[m + f"self_attn.{p}_proj.weight"] for p in "qkv"]).t(),
        "attn.o_proj.weight": t[m + "self_attn.o_proj.weight"].t(),
        "mlp_norm.weight": t[m + "post_attention_layernorm.weight"],
        "mlp.gate_up.weight": torch.cat([t[m + "mlp.gate_proj.weight"], t[m + "mlp.up_proj.weight"]]).t(),
        "mlp.down.weight": t[m + "mlp.down_proj.weight"].t(),
        "norm.weight": t["norm.weight"],
        "lm_head.weight": t["lm_head.weight"].t(),
    }
    if m + "self_attn.q_proj.bias" in t:
        out["attn.qkv.bias"] = torch.cat([t[m + f"self_attn.{p}_proj.bias"] for p in "qkv"])
    draft_vocab = out["lm_head.weight"].shape[1]
    offsets = t.get("d2t", torch.zeros(draft_vocab, dtype=torch.long)).long()
    out["draft_to_target"] = torch.arange(draft_vocab) + offsets
    return out


def read_eagle3_state(folder: Path, tensors: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """A public-layout head's tensors under our names (`draft_to_target` absolute target ids)."""
    try:
        return _hf_to_ours(read_safetensors(folder) if tensors is None else tensors)
    except KeyError as e:
        raise ValueError(f"EAGLE-3 checkpoint {str(folder)!r} is missing tensor {e.args[0]!r}") from None


def load_eagle3(folder: Path, dtype: torch.dtype, device: torch.device, embedding: torch.Tensor,
                compiled: bool = False) -> Eagle3Head:
    """An EAGLE-3 head from a public-layout folder; `embedding` is the target's input embedding,
    used unless the checkpoint carries its own; `compiled` as `loader.load_model`. Runs no code from
    the checkpoint."""
    tensors = read_safetensors(folder)
    args = Eagle3Args.from_hf(read_config(folder))
    with torch.device("meta"):
        head = Eagle3Head(args)
    state = read_eagle3_state(folder, tensors)
    state = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype).contiguous()
             for k, v in state.items()}
    try:
        head.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        raise ValueError(f"EAGLE-3 checkpoint {str(folder)!r} does not match its config: {e}") from None
    own = next((v for k, v in tensors.items() if k.endswith("embed_tokens.weight")), None)
    head.embed = (embedding if own is None else own).to(device=device, dtype=dtype)
    if head.embed.shape != (args.layer.vocab_size, args.layer.hidden_size):
        raise ValueError(f"EAGLE-3 head {str(folder)!r} needs a [{args.layer.vocab_size}, {args.layer.hidden_size}] "
                         f"embedding, the target's is {list(head.embed.shape)}")
    head.eval().requires_grad_(False)
    pack_for_cpu(head, dtype, device, compiled)
    return head


def save_eagle3(head: Eagle3Head, folder: Path, aux_layers: tuple[int, ...], dtype: torch.dtype = torch.float16,
                extra: dict | None = None) -> Path:
    """Write `head` in the public layout (the inverse of load_eagle3; the embedding stays the
    target's)."""
    a = head.args
    folder.mkdir(parents=True, exist_ok=True)
    w = {k: v.detach().to("cpu") for k, v in head.state_dict().items()}
    H, q, kv, inter = a.hidden_size, a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim, a.intermediate_size
    qkv = w["attn.qkv.weight"].t()
    gate_up = w["mlp.gate_up.weight"].t()
    m = "midlayer."
    tensors = {
        "fc.weight": w["fc.weight"].t(),
        m + "input_layernorm.weight": w["input_norm.weight"],
        m + "hidden_norm.weight": w["hidden_norm.weight"],
        m + "self_attn.q_proj.weight": qkv[:q],
        m + "self_attn.k_proj.weight": qkv[q : q + kv],
        m + "self_attn.v_proj.weight": qkv[q + kv :],
        m + "self_attn.o_proj.weight": w["attn.o_proj.weight"].t(),
        m + "post_attention_layernorm.weight": w["mlp_norm.weight"],
        m + "mlp.gate_proj.weight": gate_up[:inter],
        m + "mlp.up_proj.weight": gate_up[inter:],
        m + "mlp.down_proj.weight": w["mlp.down.weight"].t(),
        "norm.weight": w["norm.weight"],
        "lm_head.weight": w["lm_head.weight"].t(),
    }
    tensors = {k: v.to(dtype).contiguous() for k, v in tensors.items()}
    ids = w["draft_to_target"].long()
    tensors["d2t"] = (ids - torch.arange(len(ids))).contiguous()
    t2d = torch.zeros(a.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    save_file(tensors, folder / "model.safetensors")
    config = {
        "architectures": [ARCHITECTURE], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": H, "intermediate_size": inter, "num_attention_heads": a.num_heads,
        "num_key_value_heads": a.num_kv_heads, "head_dim": a.head_dim, "num_hidden_layers": 1,
        "rms_norm_eps": a.rms_norm_eps, "rope_theta": a.rope_theta,
        "max_position_embeddings": a.max_position_embeddings, "vocab_size": a.vocab_size,
        "draft_vocab_size": a.draft_vocab_size, "target_hidden_size": head.config.target_hidden_size,
        "tie_word_embeddings": False, "torch_dtype": str(dtype).removeprefix("torch."),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layers), "use_aux_hidden_state": True},
        **({"minedraft": extra} if extra else {}),
    }
    if a.rope_scaling is not None:
        config["rope_scaling"] = {"rope_type": "llama3", **dict(a.rope_scaling)}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
