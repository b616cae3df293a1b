"""Engine configuration, validated in one place."""

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from minedraft.kv_cache import KVCache
from minedraft.models.eagle3 import Eagle3Args, is_eagle3
from minedraft.models.hf_format import ModelArgs
from minedraft.models.loader import checkpoint_folder, default_draft_path, locate_model, read_model_config

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
# The cores this process may use, read before any engine pins it to its own share of them.
MACHINE_CPUS = sorted(os.sched_getaffinity(0))


def check_device(name: str, value: str) -> torch.device:
    """`value` as a torch device that exists here; ValueError naming `name` otherwise."""
    try:
        device = torch.device(value)
    except RuntimeError:
        raise ValueError(f"{name} {value!r} is not a torch device") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name} {value!r} asked for but CUDA is not available")
    return device


def check_num_speculative_tokens(k) -> None:
    """An integer in 1..16, or "auto" (minedraft.spec_decode.draft_length chooses it every step)."""
    if k != "auto" and (not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 16):
        raise ValueError(f"num_speculative_tokens must be an integer in 1..16 or \"auto\", got {k!r}")


@dataclass
class SpeculativeConfig:
    """vLLM-style `speculative_config`: {"method": "draft_model", "model": PATH | "self",
    "num_speculative_tokens": k}, {"method": "eagle3", "model": HEAD, ...} (an EAGLE-3 head in the
    public layout, minedraft.models.eagle3; the method is inferred from the checkpoint when not
    given), or {"method": "ngram", "prompt_lookup_min": a,
    "prompt_lookup_max": b, "num_speculative_tokens": k} (prompt lookup, no draft model); k may be
    "auto" (minedraft.spec_decode.draft_length picks it every step). With "prompt_lookup_first": true
    a model's rows draft by prompt lookup wherever it finds a match (spec_decode/ngram.py). With
    "tetris": true every row drafts k + `tetris_extra_proposals` tokens and only `tetris_capacity`
    drafts in all (0: k per row) are verified, the most probable prefixes across the (sub-)batch
    (spec_decode/tetris.py). Without "model" the bundled target drafts with the bundled drafter
    (minedraft/draft_models, made by `minedraft train-draft`). Where a draft model runs:

    - neither `draft_device` nor `parallel`: standard SD, drafter in the engine's process;
    - `draft_device` without `parallel`: the drafter in its own process, strictly draft-then-verify;
    - `parallel: true`: batch parallel SD (PSD), drafter in its own process, overlapped; with
      `"overlap": "auto"` only while overlapping is quicker than drafting and verifying the whole
      batch in turn (engine/overlap.py), else as the drafter-in-its-own-process SD (default
      "always": every step overlaps, the paper's schedule).
    On CPU the engine's process takes `target_cpus` and the drafter `draft_cpus` (default: core 0
    and core 1). `rendezvous` is the torch.distributed address ("tcp://host:port"; default: a free
    local port); `draft_timeout_s` bounds the wait for drafts before the drafter counts as failed.
    With `prefill_on_drafter` the drafter's process also holds a copy of the target, which prefills
    the prompts that arrive while streams run, between drafts.
    """

    num_speculative_tokens: int | str  # or "auto"
    method: str | None = None  # None: "eagle3" if `model` is an EAGLE-3 head, else "draft_model"
    model: str | None = None
    parallel: bool = False
    overlap: str = "always"  # psd: "always", or "auto" (engine.overlap)
    draft_device: str | None = None
    target_cpus: list[int] | None = None
    draft_cpus: list[int] | None = None
    rendezvous: str | None = None
    draft_timeout_s: float = 60.0
    prompt_lookup_min: int | None = None  # None: 1 for "ngram", 2 in front of a model
    prompt_lookup_max: int = 4
    # Prompt lookup in front of the model: rows whose last prompt_lookup_min.. tokens occurred before
    # take the lookup's draft, the others the model's. None: on for the bundled drafter without
    # TETRIS (its gain on Spec-Bench is in docs/DRAFT_MODEL.md), off for a drafter named by path.
    prompt_lookup_first: bool | None = None
    # A copy of the target in the drafter's process prefills prompts that arrive while streams run,
    # in the time the drafter waits between drafts (spec_decode/target_prefill.py).
    prefill_on_drafter: bool = False
    tetris: bool = False
    tetris_extra_proposals: int = 1
    tetris_capacity: int = 0
    model_path: Path | None = field(init=False)  # None for ngram; a .gguf file until resolve_checkpoints()

    KEYS = ("method", "model", "num_speculative_tokens", "parallel", "overlap", "draft_device", "target_cpus",
            "draft_cpus", "rendezvous", "draft_timeout_s", "prompt_lookup_min", "prompt_lookup_max",
            "prompt_lookup_first", "prefill_on_drafter", "tetris", "tetris_extra_proposals", "tetris_capacity")

    @property
    def remote(self) -> bool:
        """Whether the drafter runs in its own process."""
        return self.parallel or self.draft_device is not None

    def _validate_placement(self, target: "EngineConfig") -> None:
        if self.draft_device is None:
            self.draft_device = target.device
        device = check_device("speculative_config draft_device", self.draft_device)
        available = MACHINE_CPUS
        if device.type == "cpu" and torch.device(target.device).type == "cpu":
            if self.target_cpus is None and self.draft_cpus is None and len(available) >= 2:
                self.target_cpus, self.draft_cpus = available[:1], available[1:2]
        for name in ("target_cpus", "draft_cpus"):
            cpus = getattr(self, name)
            if cpus is not None and (not isinstance(cpus, list) or not cpus or any(c not in available for c in cpus)):
                raise ValueError(f"speculative_config {name} must be a non-empty list of cores from {available}, got {cpus!r}")
        if self.target_cpus and self.draft_cpus and set(self.target_cpus) & set(self.draft_cpus):
            raise ValueError("speculative_config target_cpus and draft_cpus overlap; give each model its own cores")
        if self.rendezvous is not None and not str(self.rendezvous).startswith("tcp://"):
            raise ValueError(f"speculative_config rendezvous must look like 'tcp://host:port', got {self.rendezvous!r}")
        if not isinstance(self.draft_timeout_s, (int, float)) or self.draft_timeout_s <= 0:
            raise ValueError(f"speculative_config draft_timeout_s must be > 0, got {self.draft_timeout_s!r}")

    def _validate_tetris(self) -> None:
        if not isinstance(self.tetris, bool):
            raise ValueError(f"speculative_config tetris must be true or false, got {self.tetris!r}")
        for name in ("tetris_extra_proposals", "tetris_capacity"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"speculative_config {name} must be an integer >= 0, got {value!r}")
        if self.tetris and (self.method == "ngram" or self.prompt_lookup_first):
            raise ValueError("speculative_config tetris ranks drafts by the drafter's probabilities; "
                             "prompt lookup has none (its drafts are certain): use method 'ngram' or "
                             "'prompt_lookup_first' without tetris")

    def _validate_ngram(self) -> None:
        if self.model is not None:
            raise ValueError("speculative_config method 'ngram' drafts from the sequence itself: drop 'model'")
        if self.remote:
            raise ValueError("speculative_config method 'ngram' runs in the engine's process: drop 'parallel' "
                             "and 'draft_device'")
        if self.prompt_lookup_first:
            raise ValueError("speculative_config method 'ngram' is prompt lookup alone: drop 'prompt_lookup_first'")
        self.model_path = None

    def _validate_lookup_sizes(self) -> None:
        if self.prompt_lookup_min is None:
            self.prompt_lookup_min = 1 if self.method == "ngram" else 2
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) or not 1 <= lo <= hi:
            raise ValueError("speculative_config needs integers 1 <= prompt_lookup_min <= prompt_lookup_max, "
                             f"got {lo!r} and {hi!r}")

    @classmethod
    def from_dict(cls, spec: dict, target: "EngineConfig") -> "SpeculativeConfig":
        if not isinstance(spec, dict):
            raise ValueError(f"speculative_config must be a dict, got {type(spec).__name__}")
        unknown = sorted(set(spec) - set(cls.KEYS))
        if unknown:
            raise ValueError(f"unknown speculative_config key {unknown[0]!r}; known: {', '.join(cls.KEYS)}")
        if "num_speculative_tokens" not in spec:
            raise ValueError("speculative_config needs 'num_speculative_tokens'")
        config = cls(**spec)
        config.validate(target)
        return config

    def validate(self, target: "EngineConfig") -> None:
        check_num_speculative_tokens(self.num_speculative_tokens)
        if self.prompt_lookup_first is None:
            self.prompt_lookup_first = self.method != "ngram" and self.model is None and not self.tetris
        if not isinstance(self.prompt_lookup_first, bool):
            raise ValueError(f"speculative_config prompt_lookup_first must be true or false, got {self.prompt_lookup_first!r}")
        self._validate_lookup_sizes()
        self._validate_tetris()
        if self.overlap not in ("always", "auto"):
            raise ValueError(f"speculative_config overlap must be 'always' or 'auto', got {self.overlap!r}")
        if self.overlap == "auto" and not self.parallel:
            raise ValueError("speculative_config overlap 'auto' applies to psd only: set 'parallel': true")
        if self.method not in (None, "draft_model", "eagle3", "ngram"):
            raise ValueError(f"speculative_config method must be 'draft_model', 'eagle3' or 'ngram', got {self.method!r}")
        if not isinstance(self.prefill_on_drafter, bool):
            raise ValueError("speculative_config prefill_on_drafter must be true or false, "
                             f"got {self.prefill_on_drafter!r}")
        if self.prefill_on_drafter and not self.remote:
            raise ValueError("speculative_config prefill_on_drafter needs a drafter in its own process: "
                             "set 'parallel' or 'draft_device'")
        if self.method == "ngram":
            self._validate_ngram()
            return
        if not isinstance(self.parallel, bool):
            raise ValueError(f"speculative_config parallel must be true or false, got {self.parallel!r}")
        if self.remote:
            self._validate_placement(target)
        else:
            placed = [k for k in ("target_cpus", "draft_cpus", "rendezvous") if getattr(self, k) is not None]
            if placed:
                raise ValueError(f"speculative_config {placed[0]} applies only to a drafter in its own process: "
                                 "set 'parallel' or 'draft_device'")
        if self.model is None:
            self.model_path = default_draft_path(target.model_path)
        else:
            self.model_path = target.model_path if self.model == "self" else locate_model(self.model)
        config = read_model_config(self.model_path)
        eagle3 = is_eagle3(config)
        if self.method is None:
            self.method = "eagle3" if eagle3 else "draft_model"
        if eagle3 != (self.method == "eagle3"):
            raise ValueError(f"speculative_config model {str(self.model_path)!r} is "
                             f"{'an EAGLE-3 head' if eagle3 else 'not an EAGLE-3 head'}: method {self.method!r} does not fit")
        head = Eagle3Args.from_hf(config) if eagle3 else None
        draft = head.layer if eagle3 else ModelArgs.from_hf(config)
        t = target.model_args
        if draft.max_position_embeddings < target.max_model_len:
            raise ValueError(
                f"draft model max_position_embeddings {draft.max_position_embeddings} is below "
                f"max_model_len {target.max_model_len}"
            )
        if draft.vocab_size != t.vocab_size:
            raise ValueError(
                f"draft model vocabulary ({draft.vocab_size} tokens) does not match the target's "
                f"({t.vocab_size}); speculative decoding needs the same tokenizer"
            )
        if eagle3:
            if head.target_hidden_size != t.hidden_size:
                raise ValueError(f"EAGLE-3 head {str(self.model_path)!r} reads hidden states of width "
                                 f"{head.target_hidden_size}; the target's are {t.hidden_size}")
            head.aux_layers(t.num_layers)  # raises if the layers do not fit the target


# Measured on the development CPU (docs/BENCHMARKS.md, issue 15): Inductor's C++ GEMM templates
# beat oneDNN's packed products up to four rows. In float32 with the small-row kernel built, graphs
# multiply 2 rows and more through it (kernels.small_gemm), and the 8-token graph beat the same step
# run eagerly; elsewhere (bfloat16, no AVX-512) they use the templates, which were not timed at 8
# rows against eager there.
CPU_COMPILE_SIZES = (1, 2, 4, 8)
# Prompt tokens per step by default. Every step pays for one pass over the weights whatever it
# carries, so a step with no stream running takes many: 512 (like vLLM's offline `LLM`) took ar at
# 8 in flight from 27.3 to 32.4 tokens/s (docs/BENCHMARKS.md, issue 15).
CPU_MAX_NUM_BATCHED_TOKENS = 512
# Serving on CPU, a step beside running streams carries few enough prompt tokens that it takes at
# most this many times a step without them (engine.scheduler.PrefillPacer), since every stream's
# inter-token gap waits on it. A fixed 48 tokens kept the token gaps' p99 within about 3x their
# median on a Xeon and let it reach 9.8x on an EPYC, whose decode step is 3x shorter and prompt
# tokens dearer; paced at 2.5 it stayed within 1.1-2.8x there in every mode at 0.25-1 req/s, for
# throughput within -5% to +3% in ar and sd and 6-9% lower in psd at 0.5-1 req/s
# (docs/BENCHMARKS.md, issue 19).
CPU_SERVING_STALL_RATIO = 2.5
GPU_MAX_NUM_BATCHED_TOKENS = 2048


@dataclass
class EngineConfig:
    model: str | os.PathLike | None = None  # checkpoint folder or .gguf file; None: the bundled default
    dtype: str = "float32"
    device: str = "cpu"
    max_num_seqs: int = 16  # requests in flight
    max_model_len: int | None = None  # prompt + output tokens per request; None: min(2048, the model's)
    # Prompt tokens a step may carry (chunked prefill); None: CPU_MAX_NUM_BATCHED_TOKENS on CPU,
    # GPU_MAX_NUM_BATCHED_TOKENS elsewhere.
    max_num_batched_tokens: int | None = None
    # At most this many of them while prefilled streams run in the step; None: max_num_batched_tokens.
    max_prompt_tokens_beside_streams: int | None = None
    serving: bool = False  # the engine streams to clients (`minedraft serve`): defaults for latency
    enable_chunked_prefill: bool = True  # split prompts over steps (else a prompt goes whole, alone if too long)
    # Beside running streams, prompt chunks shrink so that a step takes at most this many times a
    # step without them (engine.scheduler.PrefillPacer); None: off (the whole budget beside streams);
    # "auto": CPU_SERVING_STALL_RATIO on CPU when `serving`, else off.
    prefill_stall_ratio: float | str | None = "auto"
    # Which prompts a step's prompt tokens go to: "fcfs" (arrival order) or "shortest_prompt" (the
    # soonest done first, engine.scheduler); None: "shortest_prompt" when `serving`, else "fcfs".
    scheduling_policy: str | None = None
    kv_cache_memory_gb: float | None = None  # cap on KV-cache memory; None: max_num_seqs full slots
    num_threads: int | None = None  # torch threads on CPU; None: leave torch's default
    seed: int = 0  # for requests without their own seed
    speculative_config: dict | None = None  # see SpeculativeConfig
    trace: bool = False  # record a per-step timeline of verification and drafting (engine.trace)
    # Never compile the forward pass on CPU nor replay CUDA graphs on a GPU (vLLM's name).
    enforce_eager: bool = False
    # Token counts whose forward pass is compiled on CPU (engine.compiled_forward); None:
    # CPU_COMPILE_SIZES on CPU, none on a GPU (there decode and verification replay CUDA graphs,
    # engine.cuda_graphs).
    compile_sizes: tuple[int, ...] | None = None
    speculative: SpeculativeConfig | None = field(init=False)
    model_path: Path = field(init=False)  # a folder, or a .gguf file until resolve_checkpoints()
    model_args: ModelArgs = field(init=False)
    num_slots: int = field(init=False)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        check_device("device", self.device)
        self.model_path = locate_model(self.model)
        self.model_args = ModelArgs.from_hf(read_model_config(self.model_path))
        if self.max_model_len is None:
            self.max_model_len = min(2048, self.model_args.max_position_embeddings)
        cpu = self.device == "cpu"
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = CPU_MAX_NUM_BATCHED_TOKENS if cpu else GPU_MAX_NUM_BATCHED_TOKENS
        if self.max_prompt_tokens_beside_streams is None:
            self.max_prompt_tokens_beside_streams = self.max_num_batched_tokens
        for name in ("max_num_seqs", "max_model_len", "max_num_batched_tokens", "max_prompt_tokens_beside_streams"):
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
        if self.prefill_stall_ratio == "auto":
            self.prefill_stall_ratio = CPU_SERVING_STALL_RATIO if cpu and self.serving else None
        ratio = self.prefill_stall_ratio
        if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, (int, float))
                                  or not math.isfinite(ratio) or ratio <= 1):
            raise ValueError(f"prefill_stall_ratio must be a number > 1, 'auto' or None, got {ratio!r}")
        if self.scheduling_policy is None:
            self.scheduling_policy = "shortest_prompt" if self.serving else "fcfs"
        if self.scheduling_policy not in ("fcfs", "shortest_prompt"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'shortest_prompt', got {self.scheduling_policy!r}")
        for name in ("enforce_eager", "enable_chunked_prefill", "serving"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.compile_sizes is None:
            self.compile_sizes = CPU_COMPILE_SIZES if self.device == "cpu" else ()
        sizes = self.compile_sizes
        if not isinstance(sizes, (tuple, list)) or any(not isinstance(n, int) or isinstance(n, bool) or n < 1
                                                       for n in sizes):
            raise ValueError(f"compile_sizes must be a list of token counts >= 1, got {sizes!r}")
        self.compile_sizes = () if self.enforce_eager else tuple(sorted(set(sizes)))
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
        self.speculative = None
        if self.speculative_config is not None:
            self.speculative = SpeculativeConfig.from_dict(self.speculative_config, self)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def resolve_checkpoints(self) -> None:
        """Point model_path, and the drafter's, at Hugging Face folders, converting a GGUF file the
        first time. The engine calls this when it loads the models: building a config stays cheap."""
        self.model_path = checkpoint_folder(self.model_path)
        if self.speculative is not None and self.speculative.model_path is not None:
            self.speculative.model_path = checkpoint_folder(self.speculative.model_path)
