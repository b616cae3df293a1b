"""The engine thread behind the server."""

import asyncio
import io
import json

from minedraft.config import EngineConfig
from minedraft.engine.llm_engine import LLMEngine
from minedraft.sampling import SamplingParams
from minedraft.server.async_engine import AsyncEngine


def test_the_step_trace_is_written_after_every_step_and_not_kept(tiny_llama):
    trace = io.StringIO()
    server = AsyncEngine(LLMEngine(EngineConfig(str(tiny_llama), max_model_len=64, enforce_eager=True, trace=True)),
                         max_queue=4, trace=trace)

    async def one_request() -> int:
        params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
        return len([out async for out in server.generate([1, 2, 3, 4, 5, 6], params)][-1].outputs[0].token_ids)

    try:
        assert asyncio.run(one_request()) == 5
    finally:
        server.shutdown()
    events = [json.loads(line) for line in trace.getvalue().splitlines()]
    # the prompt's step gives the first token, four decode steps the rest
    assert [(e["kind"], e["size"], e.get("prompt_tokens")) for e in events] == \
        [("prefill", 0, 6)] + [("decode", 1, None)] * 4
    assert all(e["end"] >= e["start"] for e in events)
    assert server.engine.trace == []  # drained: a long-running server keeps no history
