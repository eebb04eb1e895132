"""The SSE relay: passes upstream bytes on as they arrive, measured on the way (``gateway.measure.meter``).

Events are forwarded untouched; the only one ever held back is the usage-only chunk the gateway
asked for itself (``stream_options.include_usage``) when the client did not. Each event is parsed once,
only to see whether it carries reasoning, an answer, usage or the end of the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from gateway.backends.base import Upstream
from gateway.errors import AttemptFailure, error_event
from gateway.measure.meter import StreamMeter
from gateway.request.connection import DirectBody, direct_body
from gateway.request.response_cycle import HOLD_HEAD
from gateway.request.resume import resume_stream
from gateway.runtime.drain import SHUTDOWN_CODE, SHUTDOWN_MESSAGE
from gateway.values.dialect import insert_usage_cost
from gateway.values.observation import Attempt

if TYPE_CHECKING:
    from gateway.doors import StreamTranslator
    from gateway.request.exchange import Exchange

DRAIN_TIMEOUT_S = 1.0
# The code of the error event that ends a stream, by what ended it. An error event has no [DONE] after
# it: the OpenAI SDK raises on the error event itself (openai 3.57 _streaming.py:96-107), and a client
# that only waits for [DONE] must not take a cut answer for a finished one.
STREAM_ERROR_CODES = {"timeout": "upstream_timeout", "upstream_error": "upstream_stream_error"}
Clock = Callable[[], float]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class StreamRelay:
    """An ASGI response that relays an open upstream stream; its end settles the exchange. A stream
    that breaks off may go on from another backend (``gateway.request.resume``) when its route allows.

    The body goes from the upstream's network callback to the client's socket (``_take``, through
    ``DirectBody``): the relay's task waits once per stream, not once per token, and is woken only for
    what must wait (a client that is not reading, the end, a failure)."""

    __slots__ = (
        "_attempt",
        "_clock",
        "_direct",
        "_exchange",
        "_failed",
        "_first",
        "_headers",
        "_meter",
        "_pending",
        "_rest",
        "_rewrite",
        "_translator",
        "_upstream",
    )

    def __init__(
        self,
        exchange: Exchange,
        upstream: Upstream,
        *,
        headers: list[tuple[bytes, bytes]],
        first: bytes,
        rest: bytes = b"",
        meter: StreamMeter,
        attempt: Attempt,
        translator: StreamTranslator | None = None,
    ) -> None:
        self._exchange = exchange
        self._upstream = upstream
        self._headers = headers
        self._first = first
        self._meter = meter
        self._attempt = attempt
        self._translator = translator  # the client's door speaks another dialect
        self._rewrite: Callable[[bytes], bytes] | None = None  # a continuation's events, made seamless
        self._clock = exchange.runtime.clock
        self._direct: DirectBody | None = None
        self._pending: list[bytes] = []  # events for the client that must go through ``send``
        self._failed: Exception | None = None  # raised in ``_take``, re-raised in the task
        self._rest = rest  # the rest of the read the first events came in, not yet measured

    async def __call__(self, scope: Any, receive: Receive, send: Send) -> None:
        exchange = self._exchange
        self._direct = direct_body(scope)
        try:
            await send(
                {"type": "http.response.start", "status": 200, "headers": self._headers, HOLD_HEAD: True}
            )
            await send({"type": "http.response.body", "body": self._first, "more_body": True})
            await self._relay(send)
        except asyncio.CancelledError:
            if not exchange.absorb_cancel():
                raise
            if self._attempt.finished_at is None:  # (not one a resume already ended as dropped)
                self._attempt.status = "cancelled"  # the client went away: a normal end, not an error
        finally:
            if self._attempt.finished_at is None:
                self._meter.finish(exchange.runtime.clock())
            exchange.settle()  # closes the upstream: reused when read to its end, else cut

    async def _relay(self, send: Send) -> None:
        while True:
            failure = await self._pump(send)
            if failure is None:
                break
            attempt = self._attempt
            if failure.kind == "timeout":
                attempt.status = "timeout"
            elif failure.kind == "upstream_error":  # its error event: counted as the backend's failure
                attempt.status, attempt.http_status = "upstream_error", failure.http_status
            else:
                attempt.status = "dropped"
            attempt.error = failure.message
            resumed = None
            stopping = self._exchange.runtime.drain.ended  # the gateway ended it: no resuming elsewhere
            transcript = self._meter.transcript
            if transcript is not None and transcript.resumes and not stopping:
                resumed = await resume_stream(self._exchange, self._meter, failure)
            if stopping:
                # The gateway cut it, not the backend: no failure of its to count (a rolling restart
                # would otherwise open circuits, the fleet's too, on healthy backends).
                self._attempt.status, self._attempt.error = "cancelled", None
                failure = AttemptFailure("dropped", SHUTDOWN_MESSAGE)
                code = SHUTDOWN_CODE
            if resumed is None:
                if not stopping:
                    code = STREAM_ERROR_CODES.get(failure.kind, "upstream_stream_broken")
                translator = self._translator
                event = (
                    error_event(failure.message, code)
                    if translator is None
                    else translator.error(failure.message, code)
                )
                await send({"type": "http.response.body", "body": event, "more_body": True})
                break
            self._upstream, self._meter, self._attempt = resumed.upstream, resumed.meter, resumed.attempt
            self._rewrite, self._rest = resumed.rewrite, resumed.rest
            first = self._outgoing(resumed.first, rewritten=True)
            if first:
                await send({"type": "http.response.body", "body": first, "more_body": True})
        # The client has everything once [DONE] is out (SDKs hang up then): settle and end the response
        # before waiting for the upstream to close, so that hang-up is not taken for a cancellation.
        meter, exchange = self._meter, self._exchange
        if self._attempt.finished_at is None:
            meter.finish(exchange.runtime.clock())
        exchange.response_ended = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if meter.done:
            # The books first (the row, spend, metrics), then the upstream's last bytes (its chunked
            # terminator, read so its connection is kept): an upstream slow to send them (up to
            # DRAIN_TIMEOUT_S) held back the row of an answer its client already had, which a crash or
            # a kill in between lost. The exchange lets go of the upstream, so settling keeps it open.
            exchange.release_upstream()
            exchange.settle()
            try:
                await self._drain()
            finally:
                self._upstream.close()  # kept for reuse when read to its end, cut otherwise

    async def _pump(self, send: Send) -> AttemptFailure | None:
        """Relay the current upstream to its [DONE]; the failure that ended it early, if one did."""
        meter = self._meter
        try:
            while not meter.saw_done():  # a short stream may have ended within its very first read
                rest, self._rest = self._rest, b""
                if rest:  # what came with the first events (``first_events``): before any later read
                    ended = False
                    self._take(rest)  # what it says is in the checks below
                else:
                    ended = await self._upstream.push(self._take)
                failed, self._failed = self._failed, None
                if failed is not None:
                    raise failed
                if self._pending:  # what the client's connection could not take at once
                    body = b"".join(self._pending)
                    self._pending.clear()
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                broken = meter.failure(self._attempt.backend)
                if broken is not None:
                    raise broken
                if ended:
                    break
            if not meter.saw_done():
                raise AttemptFailure("dropped", "upstream closed the stream before it finished")
        except AttemptFailure as failure:
            return failure
        return None

    def _take(self, data: bytes) -> bool:
        """One piece of the upstream's body, in its network callback: measured, then written to the
        client at once where its connection takes it. False hands over to the task: events that must
        go through ``send``, the end of the stream, a broken event, an error (never raised in here)."""
        meter = self._meter
        try:
            out = meter.feed(data, self._clock())
            if meter.final_usage:  # once per stream: the usage the client asked for, priced
                meter.final_usage = False
                usage = meter.usage_so_far()
                cost, basis = self._exchange.cost_so_far(self._attempt, usage)
                out = insert_usage_cost(out, cost, basis)
            if out:
                out = self._outgoing(out)
            if out:
                direct = self._direct
                if self._pending or direct is None or not direct.write(out):
                    self._pending.append(out)
                    return False
        except Exception as exc:  # a bug of ours must not surface in the upstream's protocol
            self._failed = exc
            return False
        return not (meter.corrupt or meter.done or meter.upstream_error is not None)

    def _outgoing(self, out: bytes, *, rewritten: bool = False) -> bytes:
        if self._rewrite is not None and not rewritten:
            out = self._rewrite(out)
        if self._translator is not None:
            out = self._translator.translate(out)
        return out

    async def _drain(self) -> None:
        """Read the upstream to its end (usually just the chunked terminator) so its connection is reused."""
        with contextlib.suppress(AttemptFailure, TimeoutError):
            async with asyncio.timeout(DRAIN_TIMEOUT_S):
                while not await self._upstream.push(_discard):
                    pass


def _discard(_data: bytes) -> bool:
    return True
