"""The engine on its own thread, fed by asyncio handlers: the HTTP layer never blocks the step loop.

Handlers submit requests and abort them through a command queue; the engine thread steps while
there is work and hands each request's outputs back to the handler's event loop. If the thread
ever dies, every waiting handler gets an EngineDeadError and so does every later request.
"""

import asyncio
import itertools
import json
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TextIO

from minedraft.engine.llm_engine import LLMEngine
from minedraft.engine.sequence import RequestOutput
from minedraft.sampling import SamplingParams

log = logging.getLogger("minedraft.server")


class QueueFullError(RuntimeError):
    pass


class EngineDeadError(RuntimeError):
    """The engine thread has stopped; no request can be served."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue

    def put(self, item: RequestOutput | Exception) -> None:
        try:
            self.loop.call_soon_threadsafe(self.outputs.put_nowait, item)
        except RuntimeError:  # the handler's event loop has closed: nobody is listening
            pass


class AsyncEngine:
    def __init__(self, engine: LLMEngine, max_queue: int, on_finish=None, trace_file: TextIO | None = None):
        self.engine = engine
        self.max_queue = max_queue
        self.on_finish = on_finish  # called on the engine thread with each finished RequestOutput
        # The engine's step trace (config.trace) goes here as JSON lines after every step, so a
        # server that runs for days neither keeps it in memory nor loses it when killed.
        self.trace_file = trace_file
        self.error: BaseException | None = None  # why the engine thread died
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count()
        self._stop = False
        self._ending = False  # the server is stopping: requests end now, new ones are refused
        self._thread = threading.Thread(target=self._run, name="minedraft-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self.error is None and self._thread.is_alive()

    @property
    def num_running(self) -> int:
        return len(self.engine.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting) + self._commands.qsize()

    async def generate(self, token_ids: list[int], params: SamplingParams) -> AsyncIterator[RequestOutput]:
        """Outputs of one request as it advances; aborts it if the consumer stops early."""
        self._check_alive()
        if self.num_waiting >= self.max_queue:
            raise QueueFullError(f"the server's queue is full ({self.max_queue} waiting requests)")
        request_id = f"req-{next(self._ids)}"
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._streams[request_id] = stream
        self._send(("add", request_id, token_ids, params))
        finished = False
        try:
            self._check_alive()  # again: the thread may have died before it saw this stream
            while not finished:
                item = await stream.outputs.get()
                if isinstance(item, Exception):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._send(("abort", request_id))

    async def call(self, fn: Callable[[], object]) -> object:
        """Run `fn` on the engine thread between steps (the engine is not thread-safe) and return its result."""
        self._check_alive()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._send(("call", fn, loop, future))
        self._check_alive()  # as in generate()
        return await future

    def end_all(self) -> None:
        """End every request now, as aborted, each with its last output (a stream's final chunk),
        and refuse later ones (503): the server is stopping. Safe from any thread."""
        self._send(("end_all",))

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)
        self.engine.close()

    def _check_alive(self) -> None:
        if not self.alive:
            raise EngineDeadError(f"the engine has stopped ({self.error!r})")

    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wake.set()

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:
            log.exception("the engine thread died; answering 503 from now on")
            self.error = e  # set before failing what waits: generate() and call() check it after queueing
            dead = EngineDeadError(f"the engine has stopped ({e!r})")
            for request_id in list(self._streams):
                self._fail(request_id, dead)
            while not self._commands.empty():
                command = self._commands.get_nowait()
                if command[0] == "call":
                    _, _, loop, future = command
                    loop.call_soon_threadsafe(_settle, future, None, dead)

    def _loop(self) -> None:
        while not self._stop:
            self._drain_commands()
            if not self.engine.has_unfinished():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as e:  # the engine fails a step's own sequences; this is a last resort
                log.exception("engine step failed; failing the requests in flight")
                for request_id in list(self.engine.requests):
                    self.engine.abort(request_id)
                    self._fail(request_id, RuntimeError(f"engine error: {e}"))
                continue
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if out.finished:
                    self._streams.pop(out.request_id, None)
                    self._observe(out)
                if stream is not None:
                    stream.put(out)
            self._write_trace()  # after the outputs are on their way: tracing delays no token

    def _end_all(self) -> None:
        self._ending = True
        for request_id, seqs in list(self.engine.requests.items()):
            self.engine.abort(request_id)
            out = RequestOutput.from_sequences(seqs)
            self._observe(out)
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                stream.put(out)

    def _write_trace(self) -> None:
        if self.trace_file is None or not self.engine.trace:
            return
        try:
            self.trace_file.write("".join(json.dumps(event) + "\n" for event in self.engine.trace))
            self.trace_file.flush()
        except OSError:  # a full disk must not stop serving
            log.exception("writing the step trace failed; tracing stops")
            self.trace_file = self.engine.trace = None  # the engine stops recording too: no growing list
            return
        self.engine.trace.clear()

    def _observe(self, out: RequestOutput) -> None:
        if self.on_finish is not None:
            try:
                self.on_finish(out)
            except Exception:  # metrics must not stop the engine
                log.exception("on_finish failed for request %s", out.request_id)

    def _fail(self, request_id: str, error: Exception) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.put(error)

    def _drain_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                _, request_id, token_ids, params = command
                if request_id not in self._streams:  # its handler has gone already
                    continue
                if self._ending:
                    self._fail(request_id, EngineDeadError("the server is shutting down"))
                    continue
                try:
                    self.engine.add_request(token_ids, params, request_id)
                except Exception as e:  # ValueError: bad input (400); anything else: nothing was queued
                    if not isinstance(e, ValueError):
                        log.exception("adding request %s failed", request_id)
                    self._fail(request_id, e)
            elif command[0] == "abort":
                self.engine.abort(command[1])
            elif command[0] == "end_all":
                self._end_all()
            elif command[0] == "call":
                _, fn, loop, future = command
                try:
                    result, error = fn(), None
                except Exception as e:
                    result, error = None, e
                loop.call_soon_threadsafe(_settle, future, result, error)


def _settle(future: asyncio.Future, result: object, error: Exception | None) -> None:
    if future.done():  # its caller has gone
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
