"""A runner's forward pass compiled by Inductor for a few fixed token counts (CPU).

Eager PyTorch pays per-operator overhead and uses MKL's matrix-vector products, so a one-token
step on CPU takes far longer than streaming the weights once. Inductor with frozen weights and its
C++ GEMM templates (`max_autotune`) fuses the element-wise work and multiplies a few rows near that
floor (docs/BENCHMARKS.md, issue 15). Shapes are static, like vLLM's CUDA-graph capture sizes: N
tokens run through the graph of the smallest compile size >= N, padded; bigger batches (prefill)
run eagerly, where the products are large enough for oneDNN. Attention stays one opaque op
(`models.attention`): neither the KV cache nor its layout, different every step, enters a graph.
"""

import logging
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from minedraft.engine.compile_cache import inductor_cache_dir
from minedraft.kernels import small_gemm

log = logging.getLogger(__name__)

INDUCTOR_OPTIONS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                    "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}

Forward = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def _keep_frozen_graphs_cacheable() -> None:
    """Freezing would pack linear weights into oneDNN tensors, which Inductor cannot pickle, so
    each frozen graph would skip its on-disk cache and recompile at every start (about a minute
    per size here). Register the freezing patterns once with that packing off; the C++ GEMM
    templates pack the weights they multiply into plain tensors themselves."""
    try:
        from torch._inductor import config
        from torch._inductor.fx_passes import freezing_patterns

        with config.patch({"cpp.weight_prepack": False}):
            freezing_patterns.lazy_init()
    except (ImportError, AttributeError) as e:  # another torch: correct, only slower to start
        log.info("frozen graphs will not be cached on disk: %s", e)


class CompiledForward:
    """Calls `forward(model, input_ids, logit_index, rope, **inputs) -> (logits, states)` through
    compiled graphs for token counts up to max(`sizes`), eagerly otherwise. A graph is built on
    the first call with its size and input shapes (or by the runner's `warm_up`) and cached on disk
    in a folder of `cache_dir` (engine/compile_cache.py). Any compile failure (no C++ compiler, an
    unsupported op) warns once and leaves every later call eager."""

    def __init__(self, forward: Forward, sizes: tuple[int, ...], cache_dir: str | os.PathLike | None = None):
        # The user's own TORCHINDUCTOR_CACHE_DIR wins; ours is set (and pruned) once per process, and
        # a drafter process inherits it.
        if cache_dir is not None and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_cache_dir(Path(cache_dir)))
        _keep_frozen_graphs_cacheable()
        self.forward = forward
        self.sizes = tuple(sorted(set(sizes)))
        self.failed = False
        self._graph = torch.compile(forward, fullgraph=True, dynamic=False)

    def size_for(self, num_tokens: int) -> int | None:
        """The compiled size a batch of `num_tokens` runs in; None: eager."""
        if self.failed:
            return None
        return next((s for s in self.sizes if s >= num_tokens), None)

    def __call__(self, model: torch.nn.Module, input_ids: torch.Tensor, logit_index: torch.Tensor,
                 rope: tuple[torch.Tensor, torch.Tensor], **inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`model` is an argument, not reached through another object, so that its weights are
        what Inductor freezes. Per-token tensors (ids, rope, `inputs` with N rows) are padded."""
        n = len(input_ids)
        size = self.size_for(n)
        if size is None:
            return self.forward(model, input_ids, logit_index, rope, **inputs)
        # Padding tokens write nothing and their outputs are dropped (the attention op stops at N,
        # the small-row kernel's products at N rows).
        padded = {k: _pad(v, n, size) if isinstance(v, torch.Tensor) and len(v) == n else v
                  for k, v in inputs.items()}
        args = (model, _pad(input_ids, n, size), _pad(logit_index, len(logit_index), size),
                tuple(_pad(t, n, size) for t in rope))
        try:
            with _compiling(), small_gemm.padding_after(n):
                logits, states = self._graph(*args, **padded)
        except Exception as e:  # noqa: BLE001 (any compiler failure means: run eagerly)
            self.failed = True
            warnings.warn(f"compiling the forward pass failed, running eagerly from now on "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})", stacklevel=3)
            return self.forward(model, input_ids, logit_index, rope, **inputs)
        return logits[: len(logit_index)], None if states is None else states[:n]


@contextmanager
def _compiling() -> Iterator[None]:
    """A call may compile: a new size or new input shapes. Every graph of every runner (target,
    drafter) is one more entry in Dynamo's cache of the same function, so allow many. Inductor's
    options are patched rather than passed to torch.compile, which does not apply `freezing` from
    its `options`. Dict tags let a call's guards skip the model's unchanged modules rather than
    check each of its hundreds of weights (docs/BENCHMARKS.md, 2026-12-05: a batch-1 step 3% shorter)."""
    with torch._dynamo.config.patch(recompile_limit=256, accumulated_recompile_limit=1024,
                                    use_recursive_dict_tags_for_guards=True), \
            torch._inductor.config.patch(INDUCTOR_OPTIONS):
        yield


def _pad(t: torch.Tensor, n: int, size: int) -> torch.Tensor:
    """`t` ([n, ...]) with zero rows appended up to `size` rows: contiguous and an inference
    tensor, whether padded or not, since a graph's guards check both (an EAGLE-3 head's features,
    made outside inference mode, otherwise built each size's graph again on first use)."""
    if n < size:
        return torch.cat((t, t.new_zeros(size - n, *t.shape[1:])))
    return t if t.is_inference() and t.is_contiguous() else t.clone(memory_format=torch.contiguous_format)
