"""The engine on its own thread, fed by asyncio handlers: the HTTP layer never blocks the step loop.

Handlers submit requests and abort them through a command queue; the engine thread steps while
there is work and hands each request's outputs back to the handler's event loop.
"""

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from minedraft.engine.llm_engine import LLMEngine
from minedraft.engine.sequence import RequestOutput
from minedraft.sampling import SamplingParams

log = logging.getLogger("minedraft.server")


class QueueFullError(RuntimeError):
    pass


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue

    def put(self, item: RequestOutput | Exception) -> None:
        self.loop.call_soon_threadsafe(self.outputs.put_nowait, item)


class AsyncEngine:
    def __init__(self, engine: LLMEngine, max_queue: int, on_finish=None):
        self.engine = engine
        self.max_queue = max_queue
        self.on_finish = on_finish  # called on the engine thread with each finished RequestOutput
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="minedraft-engine", daemon=True)
        self._thread.start()

    @property
    def num_running(self) -> int:
        return len(self.engine.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting) + self._commands.qsize()

    async def generate(self, token_ids: list[int], params: SamplingParams) -> AsyncIterator[RequestOutput]:
        """Outputs of one request as it advances; aborts it if the consumer stops early."""
        if self.num_waiting >= self.max_queue:
            raise QueueFullError(f"the server's queue is full ({self.max_queue} waiting requests)")
        request_id = f"req-{next(self._ids)}"
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._streams[request_id] = stream
        self._send(("add", request_id, token_ids, params))
        finished = False
        try:
            while not finished:
                item = await stream.outputs.get()
                if isinstance(item, Exception):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self._send(("abort", request_id))

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)
        self.engine.close()

    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop:
            self._drain_commands()
            if not self.engine.has_unfinished():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as e:  # an engine bug must not take the server down with it
                log.exception("engine step failed; failing the requests in flight")
                for request_id in list(self.engine.requests):
                    self.engine.abort(request_id)
                    self._streams.pop(request_id).put(RuntimeError(f"engine error: {e}"))
                continue
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if out.finished:
                    self._streams.pop(out.request_id, None)
                    if self.on_finish is not None:
                        self.on_finish(out)
                if stream is not None:
                    stream.put(out)

    def _drain_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                _, request_id, token_ids, params = command
                try:
                    self.engine.add_request(token_ids, params, request_id)
                except ValueError as e:
                    self._streams.pop(request_id).put(e)
            elif command[0] == "abort":
                self.engine.abort(command[1])
                self._streams.pop(command[1], None)
