"""Stopping `minedraft serve` on SIGTERM or Ctrl-C: new connections are refused at once, running
requests get a bounded grace period, then every request still open is ended properly."""

import asyncio
import logging
import signal
import socket
from types import FrameType

import uvicorn

from minedraft.server.async_engine import AsyncEngine

log = logging.getLogger("minedraft.server")

# After the grace period, how long the ended requests have to send their last chunks before
# uvicorn cancels what is left (a client that stopped reading would otherwise hold the server).
FLUSH_S = 5.0


class GracefulServer(uvicorn.Server):
    """uvicorn's server whose stop ends the engine's requests `grace_s` seconds after the signal
    (finish reason "abort": a stream's final chunk, then [DONE]). A second Ctrl-C stops at once."""

    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, grace_s: float):
        config.timeout_graceful_shutdown = grace_s + FLUSH_S
        super().__init__(config)
        self.engine = engine
        self.grace_s = grace_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # uvicorn's, except that the signal is not recorded: uvicorn raises the signals it caught
        # again once it has shut down, which ends a clean stop by SIGTERM (or a KeyboardInterrupt)
        # instead of exit status 0.
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        ending = asyncio.get_running_loop().call_later(self.grace_s, self._end_requests)
        try:
            await super().shutdown(sockets)
        finally:
            ending.cancel()

    def _end_requests(self) -> None:
        log.info("grace period of %g s over: ending the requests still open", self.grace_s)
        self.engine.end_all()
