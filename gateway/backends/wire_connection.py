"""One keep-alive HTTP/1.1 connection, parsed by httptools (llhttp, the parser uvicorn uses): the head
bounded in bytes and count, a chunked body's trailers bounded alike and dropped, 1xx answers skipped,
anything past the answer refused, the read clock.

A connection is reusable only when its answer ended cleanly and nothing followed it: a server that
says more than it was asked would hand its extra words to the next request (another user's).
"""

from __future__ import annotations

import asyncio
import select
from typing import Protocol, cast

import httptools

from gateway.backends.wire_decode import Inflater
from gateway.backends.wire_errors import WireError, WireLimits
from gateway.backends.wire_origin import Origin
from gateway.backends.wire_response import WireResponse


class Home(Protocol):
    """The pool a connection goes back to (or leaves)."""

    def keep(self, conn: Connection) -> None: ...

    def forget(self, conn: Connection) -> None: ...


class Connection(asyncio.Protocol):
    """One keep-alive connection to an origin, carrying one response at a time."""

    def __init__(
        self, home: Home, origin: Origin, loop: asyncio.AbstractEventLoop, limits: WireLimits
    ) -> None:
        self.home = home
        self.origin = origin
        self.loop = loop
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self.response: WireResponse | None = None
        self.head_waiter: asyncio.Future[None] | None = None
        self.keep_alive = True
        self.framed = False  # the response says where its body ends (length or chunks), not the close
        self.got_bytes = False
        self.done = False  # the answer's message is complete: any byte after it is out of turn
        self.idle_since = 0.0
        self.paused = False
        self._head_left = limits.head_bytes  # bytes the head (this one, a 1xx's) may still take
        # Bytes read since the body last grew: chunk framing, and a chunked body's trailers (which
        # httptools holds whole until each ends). Bounded like a head, so trailers cannot grow memory.
        self._bodiless_bytes = 0
        self._header_count = 0
        self._informational = False  # the message being parsed is a 1xx, skipped
        self._parser = httptools.HttpResponseParser(self)
        # The body pieces (HTTP chunks) of one read, handed on together when the read is parsed: a
        # stream whose events are one chunk each then costs its reader one call, and its client one
        # write, per read rather than per event.
        self._pieces: list[bytes] = []
        self._read_clock_s: float | None = None
        self._last_read = 0.0
        self._read_timer: asyncio.TimerHandle | None = None
        self._readable: select.poll | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio's subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:  # registered once: checking an idle socket is then one poll(2)
            self._readable = select.poll()
            self._readable.register(sock.fileno(), select.POLLIN)

    def data_received(self, data: bytes) -> None:
        if self.response is None or self.done:  # nothing was asked: a server talking out of turn
            self.abort()
            return
        self.got_bytes = True
        if self._read_clock_s is not None:
            self._last_read = self.loop.time()
        failure: WireError | None = None
        try:
            if self.head_waiter is None and not self._informational:
                self._parser.feed_data(data)
                if not self._pieces and not self.done:  # no body in this read: framing or trailers
                    self._count_bodiless(len(data))
                elif self._bodiless_bytes:
                    self._bodiless_bytes = 0
            elif len(data) < self._head_left:  # the usual first read: the whole head within its budget
                self._head_left -= len(data)
                self._parser.feed_data(data)
            else:
                self._feed_head(data)
        except httptools.HttpParserUpgrade:
            failure = WireError("malformed", "the upstream switched protocols")
        except httptools.HttpParserCallbackError as exc:
            reason = exc.__context__
            if isinstance(reason, WireError):  # ours: a limit, a message out of turn
                failure = reason
            else:  # a reader's callback failed: not the upstream's fault
                self._pieces.clear()
                failure = WireError("broken", f"the reader failed ({reason!r})")
        except httptools.HttpParserError as exc:
            failure = WireError("malformed", f"unreadable HTTP from the upstream ({exc})")
        except WireError as exc:
            failure = exc
        try:
            self._deliver_pieces()  # what was whole before any garbage still reaches the reader
        except Exception as exc:
            failure = failure or WireError("broken", f"the reader failed ({exc!r})")
        if failure is not None:
            self.lost(failure)

    def _feed_head(self, data: bytes) -> None:
        """Feed while a head is unfinished, never more than its budget at once: a flood of header bytes
        stops at the limit instead of being parsed (httptools grows a long value quadratically)."""
        parser = self._parser
        while data and (self.head_waiter is not None or self._informational):
            budget = self._head_left
            if budget <= 0:
                raise WireError(
                    "malformed", f"the response head is longer than {self.limits.head_bytes} bytes"
                )
            piece, data = (data, b"") if len(data) <= budget else (data[:budget], data[budget:])
            self._head_left -= len(piece)
            parser.feed_data(piece)
        if data:
            parser.feed_data(data)

    def _count_bodiless(self, size: int) -> None:
        """A read that carried no body byte: within a head's budget, or the upstream is sending trailers
        (or chunk extensions) without end. Checked per read, not per chunk: the stream's own path pays
        one test of a list per read."""
        self._bodiless_bytes += size
        if self._bodiless_bytes > self.limits.head_bytes:
            raise WireError(
                "malformed", f"the response's trailers are longer than {self.limits.head_bytes} bytes"
            )

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        # The parser calls this connection back, so the two point at each other: let go of it (no
        # byte is parsed after the loss) and a closed connection is freed at once, not by the
        # cyclic collector (tests/backends/test_wire: ~20 objects per connection an upstream closed).
        del self._parser
        self.keep_alive = False
        self._stop_read_clock()
        self.home.forget(self)
        response = self.response
        if response is None:
            return
        if self.head_waiter is None and not self.framed and not response.ended:
            response._on_end()  # a body delimited by the close: this is its end
            return
        self.lost(WireError("broken" if self.head_waiter is None else "disconnected", "connection lost"))

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        response = self.response
        assert response is not None
        if self.done:
            raise WireError("malformed", "the upstream sent a second answer to one request")
        self._header_count += 1
        if self._header_count > self.limits.headers:
            raise WireError("malformed", f"the response has more than {self.limits.headers} headers")
        if self.head_waiter is None:
            # A trailer of a chunked body (the head is complete): counted above and in the bytes read
            # without body, then dropped. Never one of the answer's headers, which the relay has read.
            return
        response.headers.append((name, value))

    def on_headers_complete(self) -> None:
        response, parser = self.response, self._parser
        assert response is not None
        if self.done:  # a second answer (on_header says so when it has headers)
            raise WireError("malformed", "the upstream sent a second answer to one request")
        status = parser.get_status_code()
        if 100 <= status < 200:
            # 100 Continue, 103 Early Hints: a word before the answer, which follows on this
            # connection. Skipped as aiohttp and h11 do; its head counts against the limit alone.
            self._informational = True
            response.headers.clear()
            return
        response.status = status
        self.keep_alive = parser.should_keep_alive()
        encoding = None
        for name, value in response.headers:
            lowered = name.lower()
            if lowered == b"content-length" or (
                lowered == b"transfer-encoding" and b"chunked" in value.lower()
            ):
                self.framed = True
            elif lowered == b"content-encoding":
                encoding = value.strip().lower()
        if encoding in (b"gzip", b"x-gzip", b"deflate"):
            response._decode_with(
                Inflater(b"deflate" if encoding == b"deflate" else b"gzip", self.limits.inflated_bytes)
            )
        elif encoding not in (None, b"identity"):
            raise WireError("malformed", f"unsupported content-encoding {encoding.decode('latin-1')}")
        if status in (204, 304):
            self.framed = True
        waiter, self.head_waiter = self.head_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._pieces.append(body)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            self._head_left = self.limits.head_bytes
            self._header_count = 0
            return
        self.done = True
        self._stop_read_clock()
        self._deliver_pieces()
        if self.response is not None:
            self.response._on_end()

    def _deliver_pieces(self) -> None:
        pieces = self._pieces
        if not pieces:
            return
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        pieces.clear()
        if self.response is not None:
            self.response._on_body(data)

    # For the pool and the response

    def begin(self, request: bytes, body: bytes = b"") -> WireResponse:
        """Send ``request`` (and ``body``, when apart from it: one write of both, no copy) and expect
        its response."""
        assert self.transport is not None
        self.response = WireResponse(self)
        self.head_waiter = self.loop.create_future()
        self.framed = False
        self.got_bytes = False
        self.done = False
        self._head_left = self.limits.head_bytes
        self._header_count = 0
        self._bodiless_bytes = 0
        if body:
            self.transport.writelines((request, body))
        else:
            self.transport.write(request)
        return self.response

    def unread(self) -> bool:
        """Whether the idle socket has nothing waiting: no EOF, no byte out of turn. asyncio may not
        have run the callback yet for a close that already arrived; reusing such a connection would
        send a request the server may have read before it hung up, and sending it again bills twice."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return False
        return self._readable is None or not self._readable.poll(0)

    def arm_read_clock(self, seconds: float | None) -> None:
        """Silence longer than ``seconds`` fails the response. One timer per ``seconds``, not per packet:
        when it fires early (data came meanwhile) it is set again for the new deadline."""
        self._stop_read_clock()
        self._read_clock_s = seconds
        if seconds is not None and self.transport is not None:
            self._last_read = self.loop.time()
            self._read_timer = self.loop.call_at(self._last_read + seconds, self._check_read_clock)

    def _check_read_clock(self) -> None:
        seconds = self._read_clock_s
        self._read_timer = None
        if seconds is None or self.response is None or self.response.ended:
            return
        deadline = self._last_read + seconds
        if self.paused or self.loop.time() < deadline:
            # Paused, the silence is ours (the reader is behind, e.g. a client not reading): the clock
            # starts again when reading resumes.
            self._read_timer = self.loop.call_at(
                max(deadline, self.loop.time() + seconds), self._check_read_clock
            )
            return
        self.lost(WireError("silent", f"no data for {seconds:g}s"))

    def _stop_read_clock(self) -> None:
        self._read_clock_s = None
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def lost(self, error: WireError) -> None:
        """This connection can carry nothing more: fail whatever waits on it and close it."""
        # Handed on without the traceback of where it was caught (``data_received``, whose frame holds
        # it): raised again by the waiter, it would keep that frame and this connection in a cycle.
        error = error.with_traceback(None)
        self.keep_alive = False
        self._stop_read_clock()
        waiter, self.head_waiter = self.head_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        if self.response is not None:
            self.response._fail(error)
        self.abort()

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None:
            self.paused = False
            self._last_read = self.loop.time()
            self.transport.resume_reading()

    def finished(self, response: WireResponse, *, reuse: bool) -> None:
        """Its response was closed: back to the pool when complete and kept alive, else cut."""
        if response is not self.response:
            return
        self.response = None
        self.head_waiter = None
        self._stop_read_clock()
        self.resume()
        clean = reuse and self.done and not self._pieces
        if clean and self.keep_alive and self.transport is not None and not self.transport.is_closing():
            self.idle_since = self.loop.time()
            self.home.keep(self)
        else:
            self.abort()

    def abort(self) -> None:
        self.keep_alive = False
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.close()
