"""The engine thread behind the server."""

import asyncio
import io
import json

from minedraft.config import EngineConfig
from minedraft.engine.llm_engine import LLMEngine
from minedraft.sampling import SamplingParams
from minedraft.server.async_engine import AsyncEngine, EngineDeadError


def serve_one_request(model, trace_file) -> tuple[AsyncEngine, int]:
    """A traced server that answers one 5-token greedy request, then stops: (it, tokens received)."""
    config = EngineConfig(str(model), max_model_len=64, enforce_eager=True, trace=True)
    server = AsyncEngine(LLMEngine(config), max_queue=4, trace_file=trace_file)

    async def one_request() -> int:
        params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
        return len([out async for out in server.generate([1, 2, 3, 4, 5, 6], params)][-1].outputs[0].token_ids)

    try:
        return server, asyncio.run(one_request())
    finally:
        server.shutdown()


def test_the_step_trace_is_written_after_every_step_and_not_kept(tiny_llama):
    trace = io.StringIO()
    server, tokens = serve_one_request(tiny_llama, trace)
    assert tokens == 5
    events = [json.loads(line) for line in trace.getvalue().splitlines()]
    # the prompt's step gives the first token, four decode steps the rest
    assert [(e["kind"], e["size"], e.get("prompt_tokens")) for e in events] == \
        [("prefill", 0, 6)] + [("decode", 1, None)] * 4
    assert all(e["end"] >= e["start"] for e in events)
    assert server.engine.trace == []  # drained: a long-running server keeps no history


def test_a_trace_that_cannot_be_written_stops_tracing_not_serving(tiny_llama):
    class FullDisk(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(28, "No space left on device")

    server, tokens = serve_one_request(tiny_llama, FullDisk())
    assert tokens == 5 and server.alive is False  # shut down by the helper, not by the failed write
    assert server.error is None and server.trace_file is None and server.engine.trace is None


def test_end_all_ends_open_requests_with_their_last_output_and_refuses_new_ones(tiny_llama):
    """What a stopping server does once its grace period is over."""
    server = AsyncEngine(LLMEngine(EngineConfig(str(tiny_llama), max_model_len=256, enforce_eager=True)), max_queue=4)
    finished = []
    server.on_finish = finished.append
    params = SamplingParams(max_tokens=240, temperature=0, ignore_eos=True)

    async def stopped_midway():
        outs = []
        async for out in server.generate([1, 2, 3], params):
            outs.append(out)
            if len(outs) == 3:
                server.end_all()
        try:
            [out async for out in server.generate([4, 5], params)]
        except EngineDeadError as e:
            return outs, str(e)

    try:
        outs, refused = asyncio.run(stopped_midway())
    finally:
        server.shutdown()
    last = outs[-1].outputs[0]
    assert outs[-1].finished and last.finish_reason == "abort" and 3 <= len(last.token_ids) < 240
    assert [out.request_id for out in finished] == [outs[-1].request_id]  # metrics count it
    assert "shutting down" in refused and not server.engine.requests
