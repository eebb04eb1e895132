"""The client's connection: uvicorn's httptools protocol with the two limits it lacks, a deadline for the
request line and headers and a cap on their size, and a way for a stream's relay to write its body to
the client straight from the upstream's network callback (``DirectBody``).

uvicorn has a keep-alive timeout (idle between requests) but nothing that bounds how long the headers of
a request may take to arrive, nor how large they may grow: a slow-loris client that sends a header
byte every few seconds, or headers without end, would hold its connection (and its memory) for ever.
"""

from __future__ import annotations

import asyncio
import functools
import urllib.parse
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.policy.schema import Server
from gateway.request.response_cycle import GatewayCycle


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float
    max_header_bytes: int
    keep_alive_s: float

    @classmethod
    def of(cls, server: Server) -> ConnectionLimits:
        return cls(server.header_timeout_s, server.max_header_bytes, server.keep_alive_s)


DIRECT_BODY = "gateway.direct_body"  # the scope extension that carries a request's DirectBody


class DirectBody:
    """Writes a chunked response body straight to the client's transport, past the ASGI ``send``: one
    ``write`` per piece, no message dict, no coroutine. Only while uvicorn's own ``send`` would write at
    once (response started and chunked, not complete, the client there and its buffer not full); else
    ``write`` says False and the caller goes through ``send``, which waits for the client to drain.

    It knows its request by the connection's number for it (``GuardedHttpToolsProtocol.number``), not
    by its scope: the scope holds it, and holding the scope back made a reference cycle per request."""

    __slots__ = ("_number", "_protocol")

    def __init__(self, protocol: GuardedHttpToolsProtocol, number: int) -> None:
        self._protocol = protocol
        self._number = number

    def write(self, body: bytes) -> bool:
        protocol = self._protocol
        cycle = protocol.cycle
        if (
            cycle is None
            or protocol.number != self._number  # a later pipelined request's cycle: not ours to write
            or not cycle.response_started
            or cycle.response_complete
            or cycle.disconnected
            or cycle.flow.write_paused
            or not cycle.chunked_encoding
        ):
            return False
        cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return True


def direct_body(scope: MutableMapping[str, Any]) -> DirectBody | None:
    """The request's DirectBody, where the server offers one (ours does; an in-process ASGI client not)."""
    extensions = scope.get("extensions")
    return None if extensions is None else extensions.get(DIRECT_BODY)


CLIENT_WATCH = "gateway.client_watch"  # the scope extension that carries a request's ClientWatch


class ClientWatch:
    """A request's watch on its client's connection. ``watch`` calls ``on_gone`` once the connection is
    lost before the request's response completed: what a task awaiting ``receive()`` for
    ``http.disconnect`` would learn, without that task (one task, an event and a cancellation less per
    request). The callback is dropped by ``cancel`` (the request settled) or when the connection carries
    a later request. ``body_arrived``: the whole body is here already, so ``receive()`` cannot wait.
    Its request is the connection's ``number``, as for ``DirectBody``."""

    __slots__ = ("_number", "_protocol")

    def __init__(self, protocol: GuardedHttpToolsProtocol, number: int) -> None:
        self._protocol = protocol
        self._number = number

    def watch(self, on_gone: Callable[[], None]) -> None:
        self._protocol.client_watch = (self._number, on_gone)

    def cancel(self) -> None:
        watching = self._protocol.client_watch
        if watching is not None and watching[0] == self._number:
            self._protocol.client_watch = None

    def body_arrived(self) -> bool:
        protocol = self._protocol
        cycle = protocol.cycle
        return cycle is not None and protocol.number == self._number and not cycle.more_body


def client_watch(scope: MutableMapping[str, Any]) -> ClientWatch | None:
    """The request's ClientWatch, where the server offers one (ours does; an in-process ASGI client not)."""
    extensions = scope.get("extensions")
    return None if extensions is None else extensions.get(CLIENT_WATCH)


def body_arrived(scope: MutableMapping[str, Any]) -> bool:
    """Whether the request's whole body is here already (False where the server cannot tell)."""
    watch = client_watch(scope)
    return watch is not None and watch.body_arrived()


class HeadersTooLarge(Exception):
    """Raised inside the parser's callback: it stops parsing the rest of what arrived."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """One client connection. The header clock starts when the connection opens, and again when the
    first byte of each later request arrives; it stops once the headers are complete. On expiry the
    client gets 408 and the connection closes; headers past the size cap get 431 and the same. A
    connection idle for ``keep_alive_s`` after its last answer is closed (uvicorn's keep-alive).

    Both clocks are lazy (issue 39): a request costs two timestamps, not two timers armed and cancelled
    (``call_later`` and ``cancel`` per request each, as uvicorn does for its keep-alive). A clock's timer
    is armed only when it may expire: the header clock's when a read ends with a request's headers
    incomplete (most requests' headers arrive in the read that begins them) or a connection opens, the
    keep-alive's when an answer completes and none is armed. When it fires it reads its timestamp and
    closes, goes back to sleep for what is left, or stops (its clock is not running)."""

    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = limits
        self._max_header_bytes = limits.max_header_bytes
        self.timeout_keep_alive = limits.keep_alive_s  # type: ignore[assignment]  # call_later takes a float
        self._header_deadline: asyncio.TimerHandle | None = None
        # The loop's time at which the headers under way began: the connection's opening or a later
        # request's first byte; None while no request's headers are under way.
        self._headers_began: float | None = None
        # The loop's time at which the last answer completed, while no byte has come since; else None.
        self._idle_since: float | None = None
        self._header_bytes = 0
        self._refused = False
        self.client_watch: tuple[int, Callable[[], None]] | None = None
        # Each request's number on this connection; ``number`` is that of the request whose cycle is
        # ``cycle`` (the last one parsed: a pipelined request's, while the one before it still runs).
        self.requests_parsed = 0
        self.number = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._headers_began = self.loop.time()
        self._arm_header_deadline(self._limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        watching, self.client_watch = self.client_watch, None
        cycle = self.cycle
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        super().connection_lost(exc)
        if watching is not None and cycle is not None and self.number == watching[0] and cycle.disconnected:
            watching[1]()  # uvicorn marks only an unfinished response's cycle disconnected
        # The protocol keeps its last request's scope, whose extensions name the protocol back: a
        # closed connection would leave that request to the cyclic collector.
        scope: Any = self.scope  # None before the first request
        extensions = scope.get("extensions") if scope else None
        if extensions:
            extensions.pop(DIRECT_BODY, None)
            extensions.pop(CLIENT_WATCH, None)

    def data_received(self, data: bytes) -> None:
        if self._refused:  # after a refusal the connection is closing: nothing more is parsed
            return
        super().data_received(data)  # a parser error (a HeadersTooLarge in a callback too) closes it
        began = self._headers_began
        if began is not None and self._header_deadline is None and not self.transport.is_closing():
            self._arm_header_deadline(began + self._limits.header_timeout_s - self.loop.time())

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn calls this when a byte arrives (and when the connection ends, which cancels the timer
        # itself): the keep-alive clock stops, and its timer, if armed, sees that when it fires.
        self._idle_since = None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        if self._headers_began is None:
            self._headers_began = self.loop.time()

    def on_url(self, url: bytes) -> None:
        self._header_bytes += len(url)
        if self._header_bytes > self._max_header_bytes:
            self._headers_too_large()
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        # uvicorn's, with the size counted (": " and CRLF included).
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self._max_header_bytes:
            self._headers_too_large()
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._headers_began = None
        scope: Any = self.scope
        self.requests_parsed = number = self.requests_parsed + 1
        extensions = scope.setdefault("extensions", {})
        extensions[DIRECT_BODY] = DirectBody(self, number)
        extensions[CLIENT_WATCH] = ClientWatch(self, number)
        if self.limit_concurrency is not None or self.parser.should_upgrade():
            previous = self.cycle
            super().on_headers_complete()  # uvicorn's own handling: an upgrade, its concurrency limit
            if self.cycle is not previous:
                self.number = number
            return
        # uvicorn 0.54's on_headers_complete for a plain request, with ``GatewayCycle`` for its response.
        parser = self.parser
        scope["method"] = parser.get_method().decode("ascii")
        http_version = parser.get_http_version()
        if http_version != "1.1":
            scope["http_version"] = http_version
        url = httptools.parse_url(self.url)
        path = url.path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + url.path
        scope["query_string"] = url.query or b""
        previous = self.cycle
        self.cycle = GatewayCycle(
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=self.expect_100_continue,
            keep_alive=http_version != "1.0" and parser.should_keep_alive(),
            on_response=self.on_response_complete,
        )
        self.number = number
        if previous is None or previous.response_complete:
            self._start_asgi_task(self.cycle, self.app)
        else:  # a pipelined request waits for the answer before it
            self.flow.pause_reading()
            self.pipeline.appendleft((self.cycle, self.app))

    def on_response_complete(self) -> None:
        # uvicorn's, with the lazy keep-alive clock.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self._keep_alive_due)

    def _keep_alive_due(self) -> None:
        self.timeout_keep_alive_task = None
        idle_since = self._idle_since
        if idle_since is None or self.transport.is_closing():
            return  # a request came: the answer that ends it arms the clock again
        left = idle_since + self.timeout_keep_alive - self.loop.time()
        if left > 0:
            self.timeout_keep_alive_task = self.loop.call_later(left, self._keep_alive_due)
        else:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers any parser error with a 400; a refusal of ours has already been answered.
        if not self._refused:
            super().send_400_response(msg)

    def _headers_too_large(self) -> None:
        message = f"the request line and headers exceed {self._max_header_bytes} bytes"
        self._refuse(431, "Request Header Fields Too Large", "request_header_fields_too_large", message)
        raise HeadersTooLarge

    def _arm_header_deadline(self, delay_s: float) -> None:
        self._header_deadline = self.loop.call_later(max(delay_s, 0.0), self._headers_due)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_due(self) -> None:
        self._header_deadline = None
        began = self._headers_began
        if began is None or self._refused or self.transport.is_closing():
            return  # no request's headers under way: the next read that leaves some incomplete arms it
        left = began + self._limits.header_timeout_s - self.loop.time()
        if left > 0:  # a later request's headers, begun after this timer was armed
            self._arm_header_deadline(left)
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # An answer to the previous request is still being written (a pipelining client that
            # trickles the next one's headers): no status line can go out now, only the close.
            self._refused = True
            self.transport.close()
            return
        message = f"the request headers did not arrive within {self._limits.header_timeout_s:g}s"
        self._refuse(408, "Request Timeout", "request_timeout", message)

    def _refuse(self, status: int, reason: str, code: str, message: str) -> None:
        """An OpenAI-format error, then the close: the connection is in no state to carry another request."""
        self._refused = True
        self._disarm_header_deadline()
        body = orjson.dumps(
            {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
        )
        head = (
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode("ascii") + body)
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """What ``uvicorn.Config(http=...)`` takes: a factory uvicorn calls like the protocol class. A
    ``functools.partial`` of a module-level class, so ``serve --workers`` can pickle it to each worker."""
    factory: Any = functools.partial(GuardedHttpToolsProtocol, limits=limits)
    return factory  # type: ignore[no-any-return]
