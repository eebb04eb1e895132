"""A graceful stop: /ready fails at once, requests in flight run on for a grace period, then each still
open is ended: a stream with an SSE error event (never cut), a request still waiting for its answer with
a 503; only then does the server stop.

Every request counts from its arrival, not from its first byte: one still waiting for its first token at
SIGTERM would otherwise be invisible here, the drain would end at once, and uvicorn would wait for that
stream's whole length, past any grace period."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

log = logging.getLogger("gateway")
SHUTDOWN_CODE = "gateway_shutting_down"
SHUTDOWN_MESSAGE = "the gateway is restarting: this stream was ended after its grace period; retry it"
UNANSWERED_MESSAGE = "the gateway is restarting: no answer began within its grace period; retry this request"
SETTLE_S = 5.0  # how long streams told to end get to send their error event and settle
# How long a stop keeps listening even with nothing in flight: a load balancer polling /ready still
# sends until its next poll sees the 503, and a listener closed at once cut those connections unanswered
# (the chaos row: a request lost at a SIGTERM). Kubernetes' preStop sleep plays this part there.
NOTICE_S = 1.0


class Open(Protocol):
    """A request in flight, as a stop sees it (the request path's ``Exchange``; the runtime that owns the
    drain sits below the request path and never imports it)."""

    @property
    def response_ended(self) -> bool: ...

    def fail(self, error_type: str) -> None: ...

    def stop(self) -> None: ...


class Drain:
    """What a stop in progress means for requests: whether it began, and the streams it must wait for."""

    def __init__(self) -> None:
        self.draining = False  # /ready answers 503 from now on
        self.ended = False  # the grace period is over: open streams are being ended
        self.streams: set[Open] = set()  # every request in flight, streamed or not
        self._none_open: asyncio.Event | None = None  # made in the loop, when a drain begins

    def opened(self, exchange: Open) -> None:
        self.streams.add(exchange)

    def closed(self, exchange: Open) -> None:
        self.streams.discard(exchange)
        if not self.streams and self._none_open is not None:
            self._none_open.set()

    async def run(self, grace_s: float) -> None:
        """Fail readiness, wait up to ``grace_s`` for open streams, then end the rest with an error event."""
        self.draining = True
        self._none_open = asyncio.Event()
        log.info(
            "draining: /ready answers 503; %d requests in flight, %.1f s grace", len(self.streams), grace_s
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        await asyncio.sleep(min(grace_s, NOTICE_S))  # requests still arriving meanwhile are served
        if await self._all_closed_within(max(0.0, deadline - loop.time())):
            return
        log.warning("grace period over: ending %d requests still in flight", len(self.streams))
        self.ended = True
        for exchange in list(self.streams):
            if not exchange.response_ended:  # (one whose [DONE] is out ended well: leave its row "ok")
                # Named before the cut, so the row and the metrics say why the stream broke off: the
                # relay would otherwise record the cut as the upstream's own "dropped".
                exchange.fail(SHUTDOWN_CODE)
            exchange.stop()
        await self._all_closed_within(SETTLE_S)

    async def _all_closed_within(self, seconds: float) -> bool:
        if not self.streams:
            return True
        assert self._none_open is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._none_open.wait(), seconds)
        return not self.streams
