"""The OpenAI-compatible server: `minedraft serve`."""

import argparse
import contextlib
from pathlib import Path


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from minedraft.config import EngineConfig
    from minedraft.engine.llm_engine import LLMEngine
    from minedraft.server.api import create_app
    from minedraft.server.async_engine import AsyncEngine
    from minedraft.server.shutdown import GracefulServer

    if args.shutdown_grace_s < 0:
        raise ValueError(f"--shutdown-grace-s must be >= 0, got {args.shutdown_grace_s}")
    config = EngineConfig(model=args.model, dtype=args.dtype, device=args.device, max_num_seqs=args.max_num_seqs,
                          max_model_len=args.max_model_len, num_threads=args.num_threads,
                          enforce_eager=args.enforce_eager, speculative_config=args.speculative_config,
                          max_num_batched_tokens=args.max_num_batched_tokens,
                          max_prompt_tokens_beside_streams=args.max_prompt_tokens_beside_streams,
                          enable_chunked_prefill=args.enable_chunked_prefill,
                          prefill_stall_ratio=args.prefill_stall_ratio, scheduling_policy=args.scheduling_policy,
                          serving=True, trace=bool(args.trace))
    # `with`: the trace file is closed however the server ends, a failed start included
    with open(args.trace, "a", encoding="utf-8") if args.trace else contextlib.nullcontext() as trace_file:
        server = AsyncEngine(LLMEngine(config), max_queue=args.max_queue, trace_file=trace_file)
        name = args.served_model_name or (Path(args.model).name if args.model else "SmolLM2-135M-Instruct")
        app = create_app(server, name, args.api_key)
        try:
            uvicorn_config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info")
            GracefulServer(uvicorn_config, server, args.shutdown_grace_s).run()
        finally:
            server.shutdown()
