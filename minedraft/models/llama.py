"""The Llama-family decoder: Llama / SmolLM2, Qwen2 (qkv bias) and Qwen3 (q/k RMSNorm).

One forward pass takes a batch of rows; each row appends its new tokens to its own KV-cache slot,
so prefill, single-token decode and multi-token verification share this code. Tokens travel packed,
row after row with no padding, through everything but attention, which sees rows padded to [B, T].
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from minedraft.kernels import small_gemm
from minedraft.models.attention import attend
from minedraft.models.hf_format import ModelArgs

def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies, computed in float32 as the reference checkpoints were trained with."""
    dim = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if args.rope_scaling is None:
        return inv_freq
    s = dict(args.rope_scaling)
    old_len = s["original_max_position_embeddings"]
    low_wavelen = old_len / s["low_freq_factor"]
    high_wavelen = old_len / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s["factor"], inv_freq)
    smooth = (old_len / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    smoothed = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(args: ModelArgs, max_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sign-folded sin for every position, [max_len, head_dim] (see `rotate`); float64
    models get float64 tables."""
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    freqs = torch.arange(max_len, dtype=compute)[:, None] * rope_inv_freq(args).to(compute)[None, :]
    cos = torch.cat((freqs, freqs), dim=-1).cos()
    signed_sin = torch.cat((-freqs.sin(), freqs.sin()), dim=-1)
    return cos.to(dtype), signed_sin.to(dtype)


def token_rope(tables: tuple[torch.Tensor, torch.Tensor], positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's rows of the (cos, signed sin) tables, shaped [N, 1, head_dim] to rotate every head."""
    return tables[0][positions][:, None], tables[1][positions][:, None]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype in (torch.float32, torch.float64):
        return F.rms_norm(x, weight.shape, weight, eps)  # fused; same arithmetic as below
    # Half precision: normalise in float32 and round before the weight, as the checkpoints expect.
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """RoPE, x * cos + (-x2, x1) * sin, computed as x * cos + (x2, x1) * (-sin, sin): the swap is
    one roll, half the small ops, and the result is the same bits (a sign flip is exact)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def cpu_packing_supported(dtype: torch.dtype) -> bool:
    """Whether oneDNN multiplies this dtype with pre-packed weights on this CPU (float32 anywhere it
    is built in; bfloat16 only with AVX512-BF16 or AMX)."""
    if not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack_for_cpu(model: nn.Module, dtype: torch.dtype, device: torch.device, compiled: bool,
                 exact: dict[str, torch.Tensor] | None = None) -> None:
    """Hand every linear weight of a loaded model (its `pack(keep_dense)`) to oneDNN where this CPU
    supports it. Float32 keeps the dense [in, out] copy too: one row streams it faster than the
    packed one; a model that also runs compiled graphs keeps it in any dtype (they multiply it).
    `exact`: the float32 (or float64) weights, by name, that a bfloat16 model was rounded from (their
    block codes, where they have them, multiply a few rows: `small_gemm.pack`)."""
    if device.type == "cpu" and cpu_packing_supported(dtype):
        model.pack(keep_dense=dtype == torch.float32 or compiled, exact=exact)


def pack_linears(model: nn.Module, keep_dense: bool, exact: dict[str, torch.Tensor] | None = None) -> None:
    # In the order a forward pass calls them.
    named = [(n, m) for n, m in model.named_modules() if isinstance(m, Linear)]
    sources = [(exact or {}).get(f"{n}.weight") for n, _ in named]
    for (_, module), small in zip(named, small_gemm.pack_in_order([m.weight for _, m in named], sources)):
        module.pack(keep_dense, small)


class Linear(nn.Module):
    """x @ weight + bias, with the weight stored [in, out]: on CPU one row streams this layout
    faster than F.linear's [out, in] (`minedraft bench decode` measures both; docs/BENCHMARKS.md).
    `pack()` also hands the weight to oneDNN in its blocked layout, which multiplies many rows
    faster (float32) or is the only fast path at all (bfloat16 without the kernel, where the
    [in, out] copy is dropped), and packs it for `kernels.small_gemm` (float32; bfloat16 where the
    CPU has AVX512-BF16), which multiplies a few rows faster than either (one pass over the weight
    for all rows; docs/BENCHMARKS.md)."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features = in_features
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.packed: torch.Tensor | None = None
        self.small: small_gemm.Packed | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        # Inside a compiled graph the kernel takes only the products Inductor's own GEMM templates
        # multiply slowly (more than 1 row; any row for block-coded weights, which Inductor would read
        # as float32), as an external call; its panels and codes are plain tensors, so frozen graphs
        # stay cacheable on disk.
        compiling = torch.compiler.is_compiling()
        if self.small is not None and small_gemm.applies(rows, x.dtype, compiling, self.small.codes is not None):
            y = small_gemm.linear(x.reshape(rows, x.shape[-1]), self.small, self.bias)
            return y.view(*x.shape[:-1], y.shape[-1])
        # Otherwise a compiled graph multiplies the dense copy with its own kernels (oneDNN's packed
        # tensors would keep it out of Inductor's on-disk cache).
        if not compiling:
            if self.packed is not None and (self.weight is None or rows > 1):
                y = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, x.shape[-1]), self.packed, self.bias,
                                                       "none", [], "")
                return y.view(*x.shape[:-1], y.shape[-1])
        y = x @ self.weight
        return y if self.bias is None else y + self.bias

    def pack(self, keep_dense: bool, small: small_gemm.Packed | None) -> None:
        """Reorder the weight once into oneDNN's blocked layout (unpacked, every product re-blocks
        it) and take `small`, its panels for the small-row kernel where that applies (None
        elsewhere; `pack_linears` packs a model's weights together). `keep_dense` keeps the
        [in, out] copy, which one row multiplies without the kernel."""
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach().t().contiguous(), None)
        self.small = small
        if not keep_dense and self.small is None:  # (the kernel's Packed holds on to it)
            self.weight = None

    @property
    def nbytes(self) -> int:
        """Bytes of the copy a one-row product reads."""
        bias = 0 if self.bias is None else self.bias.numel() * self.bias.element_size()
        if self.small is not None and self.small.codes is not None:
            return self.small.codes.nbytes + bias
        w = self.weight if self.weight is not None else self.packed
        return w.numel() * w.element_size() + bias


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, input_size: int | None = None, layer: int = 0):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_heads, args.num_kv_heads, args.head_dim
        self.layer = layer  # which of the cache's layers holds this one's keys and values
        q_size, kv_size = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
        self.qkv = Linear(input_size or args.hidden_size, q_size + 2 * kv_size, bias=args.qkv_bias)
        self.o_proj = Linear(q_size, args.hidden_size, bias=args.o_bias)
        self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x: [N, input]; rope: each token's (cos, signed sin), [N, 1, head_dim]; the cache and
        where the rows sit in it come from `attention.batch_layout`."""
        N, H, Hkv, D = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv(x)
        v = qkv[:, (H + Hkv) * D :].view(N, Hkv, D)
        qk = qkv[:, : (H + Hkv) * D].view(N, H + Hkv, D)
        if self.q_norm is not None:
            qk = torch.cat((self.q_norm(qk[:, :H]), self.k_norm(qk[:, H:])), dim=1)
        qk = rotate(qk, *rope)  # queries and keys together: half the small ops
        return self.o_proj(attend(qk[:, :H], qk[:, H:], v, self.layer))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.intermediate_size = args.intermediate_size
        self.gate_up = Linear(args.hidden_size, 2 * args.intermediate_size, bias=False)
        self.down = Linear(args.intermediate_size, args.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.intermediate_size, dim=-1)
        return self.down(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.attn = Attention(args, layer=layer)
        self.mlp_norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = MLP(args)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        # Tied models keep one [hidden, vocab] matrix: the LM head, whose columns are the embeddings.
        self.embed = None if args.tie_word_embeddings else nn.Parameter(torch.empty(args.vocab_size, args.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(args, i) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.lm_head = Linear(args.hidden_size, args.draft_vocab_size or args.vocab_size, bias=False)
        self.draft_vocab = None if args.draft_vocab_size is None else nn.Buffer(
            torch.empty(args.draft_vocab_size, dtype=torch.long))

    def pack(self, keep_dense: bool, exact: dict[str, torch.Tensor] | None = None) -> None:
        """Pack every linear weight for oneDNN (on CPU; see `pack_for_cpu`). Where the LM head's
        dense copy goes, a tied embedding keeps its own."""
        tied = self.lm_head.weight.detach() if self.embed is None else None
        pack_linears(self, keep_dense, exact)
        if tied is not None and self.lm_head.weight is None:
            self.embed = nn.Parameter(tied.t().contiguous(), requires_grad=False)

    @property
    def input_embedding(self) -> torch.Tensor:
        """[vocab, hidden]; a view of the LM head when the two are tied."""
        return self.lm_head.weight.T if self.embed is None else self.embed

    def forward(
        self, input_ids: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], aux_layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Hidden states [N, hidden] after the final norm for the N new tokens (`input_ids`, row after
        row); `rope` is their rows of the (cos, signed sin) tables (`token_rope`); the KV cache comes
        with the step's `attention.batch_layout`. Second: the inputs of the `aux_layers`
        (the residual stream before each), side by side, [N, len(aux_layers) * hidden], what an
        EAGLE-3 head reads; None when no layer is asked for."""
        x = self.input_embedding[input_ids]
        states = {}
        for i, layer in enumerate(self.layers):
            if i in aux_layers:
                states[i] = x
            x = layer(x, rope)
        return self.norm(x), torch.cat([states[i] for i in aux_layers], dim=-1) if aux_layers else None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the vocabulary; a reduced draft head's over its own tokens only (`draft_vocab`
        maps them to the target's ids: drafting samples there, the rest have draft probability 0)."""
        return self.lm_head(hidden)
