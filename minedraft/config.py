"""Engine configuration, validated in one place."""

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from minedraft.kv_cache import KVCache
from minedraft.models.llama import ModelArgs
from minedraft.models.loader import read_config, resolve_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


@dataclass
class EngineConfig:
    model: str | os.PathLike | None = None  # checkpoint folder or .gguf file; None: the bundled default
    dtype: str = "float32"
    device: str = "cpu"
    max_num_seqs: int = 16  # requests in flight
    max_model_len: int | None = None  # prompt + output tokens per request; None: min(2048, the model's)
    max_num_batched_tokens: int = 4096  # padded prefill tokens per step
    kv_cache_memory_gb: float | None = None  # cap on KV-cache memory; None: max_num_seqs full slots
    num_threads: int | None = None  # torch threads on CPU; None: leave torch's default
    seed: int = 0  # for requests without their own seed
    model_path: Path = field(init=False)
    model_args: ModelArgs = field(init=False)
    hf_config: dict = field(init=False, repr=False)
    num_slots: int = field(init=False)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        try:
            device = torch.device(self.device)
        except RuntimeError:
            raise ValueError(f"device {self.device!r} is not a torch device") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} asked for but CUDA is not available")
        self.model_path = resolve_model(self.model)
        self.hf_config = read_config(self.model_path)
        self.model_args = ModelArgs.from_hf(self.hf_config)
        if self.max_model_len is None:
            self.max_model_len = min(2048, self.model_args.max_position_embeddings)
        for name in ("max_num_seqs", "max_model_len", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.num_threads is not None and (not isinstance(self.num_threads, int) or self.num_threads < 1):
            raise ValueError(f"num_threads must be an integer >= 1, got {self.num_threads!r}")
        if self.max_model_len > self.model_args.max_position_embeddings:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings "
                f"{self.model_args.max_position_embeddings}"
            )
        self.num_slots = self.max_num_seqs
        if self.kv_cache_memory_gb is not None:
            a = self.model_args
            per_slot = KVCache.bytes_per_slot(a.num_layers, self.max_model_len, a.num_kv_heads, a.head_dim, self.torch_dtype)
            self.num_slots = min(self.max_num_seqs, int(self.kv_cache_memory_gb * 2**30 // per_slot))
            if self.num_slots < 1:
                raise ValueError(
                    f"kv_cache_memory_gb={self.kv_cache_memory_gb} holds no sequence of max_model_len "
                    f"{self.max_model_len} ({per_slot / 2**30:.3f} GB each)"
                )

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
