"""MineDraft's PSD inside vLLM V1: a scheduler plugin (see docs/VLLM_PLUGIN.md).

`engine_args(...)` gives the keyword arguments for `vllm.LLM(...)` / `vllm.AsyncEngineArgs(...)`,
`serve_flags(...)` the same as `vllm serve` flags. This module does not import vLLM: the arguments
can be made in an environment without it. The scheduler (`minedraft.vllm.scheduler`) and the
proposer (`minedraft.vllm.proposer`) run inside vLLM's processes and import it.
"""

import json
import shlex
from pathlib import Path

SUPPORTED_VLLM = "0.32.0"
SCHEDULER = "minedraft.vllm.scheduler.PSDScheduler"
PROPOSER = "minedraft.vllm.proposer.NullProposer"
DEFAULT_DRAFT_MODEL = Path(__file__).resolve().parent.parent / "draft_models" / "smollm2-135m-instruct"


def check_version() -> None:
    """Refuse any vLLM but the one the plugin was written and tested against: it relies on
    scheduler internals (`Request.next_decode_eligible_step`, `Scheduler.running`) that move."""
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"minedraft.vllm needs vLLM {SUPPORTED_VLLM} (see scripts/vllm_check.sh): {e}") from None
    version = getattr(vllm, "__version__", "unknown")
    if version != SUPPORTED_VLLM:
        raise RuntimeError(f"minedraft.vllm supports vLLM {SUPPORTED_VLLM} only, this is vLLM {version}")


def engine_args(
    draft_model: str | Path = DEFAULT_DRAFT_MODEL,
    num_speculative_tokens: int = 4,
    draft_device: str = "cpu",
    draft_cpus: list[int] | None = None,
    parallel: bool = True,
    trace: str | Path | None = None,
    timeout_s: float = 60.0,
) -> dict:
    """The keyword arguments that put MineDraft's drafter into a vLLM engine.

    parallel=True is PSD: the drafter drafts for one half of the running requests while vLLM
    verifies the other half. parallel=False drafts for every request, then verifies them all
    (sequential speculative decoding through the same drafter, for comparison). `trace` names a
    JSON-lines file of every step (who was verified, what was drafted, when). vLLM's own rejection
    sampler decides every token, so output is what vLLM without speculation gives (greedy: the
    same tokens).
    """
    if not isinstance(num_speculative_tokens, int) or isinstance(num_speculative_tokens, bool) \
            or num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be a positive int, got {num_speculative_tokens!r}")
    draft = Path(draft_model).expanduser().resolve()
    if not (draft / "config.json").is_file():
        raise ValueError(f"draft_model {str(draft)!r} is not a checkpoint folder (no config.json)")
    if json.loads((draft / "config.json").read_text()).get("draft_vocab_size") is not None:
        raise ValueError("an EAGLE-3 head reads the target's hidden states, which vLLM's scheduler never "
                         "sees; give the plugin an independent draft model")
    if draft_cpus is not None and (not draft_cpus or any(not isinstance(c, int) or c < 0 for c in draft_cpus)):
        raise ValueError(f"draft_cpus must be a non-empty list of core numbers, got {draft_cpus!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    settings = {"draft_model": str(draft), "draft_device": draft_device, "draft_cpus": draft_cpus,
                "parallel": bool(parallel), "trace": None if trace is None else str(Path(trace).resolve()),
                "timeout_s": float(timeout_s)}
    return {
        "scheduler_cls": SCHEDULER,
        "speculative_config": {"method": "custom_class", "model": PROPOSER,
                               "num_speculative_tokens": num_speculative_tokens},
        "additional_config": {"minedraft": settings},
    }


def serve_flags(**kwargs) -> list[str]:
    """`engine_args(**kwargs)` as `vllm serve` command-line flags."""
    args = engine_args(**kwargs)
    return ["--scheduler-cls", args["scheduler_cls"],
            "--speculative-config", json.dumps(args["speculative_config"]),
            "--additional-config", json.dumps(args["additional_config"])]


def serve_command(model: str, **kwargs) -> str:
    return shlex.join(["vllm", "serve", model, *serve_flags(**kwargs)])
