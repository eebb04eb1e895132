"""HTTP/1.1 to the upstreams on asyncio protocols and httptools (llhttp, the parser uvicorn uses).

Why not aiohttp's client here: a paced stream's every token is its own packet, and through aiohttp
each one costs a future, a task wake-up and three async-iterator frames before the relay sees it; a
whole answer costs ~0.3 ms of request objects, header multidicts and timers. Here the body reaches the
relay from the network callback itself (``WireResponse.push``) and a request is one prebuilt head and
one ``write``. The client does only what upstream calls need: POST with a known length, keep-alive
pooling per origin, TLS, responses framed by length, chunks or close, gzip/deflate bodies, and three
clocks (connect, the head, silence between body pieces). ``gateway.backends.openai_compat`` turns its
answers and failures into the backend seam's. Plain GETs (metrics, health, slots) go over the same
pool (``WirePool.get``): one HTTP stack in the process, and none of aiohttp's ~0.3 s of import at start.
"""

from __future__ import annotations

import asyncio
import ssl
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import SplitResult, urlsplit

import httptools

from gateway.backends.base import Take

IDLE_KEEP_S = 15.0  # a pooled connection idle longer than this is closed rather than reused
PAUSE_AT_BYTES = 1 << 20  # unread body beyond this pauses the socket until the reader catches up


class WireError(Exception):
    """A call that failed on the wire. ``kind``: connect, disconnected (before the head), broken (in the
    body), silent (no byte for the read clock), malformed (not HTTP the parser can read)."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(detail or kind)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Origin:
    """Where one base URL's requests go, and the head they share up to the path."""

    scheme: str
    host: str
    port: int
    base_path: str  # the URL's path without its trailing slash, e.g. "/v1"
    host_header: str

    @classmethod
    def of(cls, base_url: str) -> Origin:
        return cls._of(urlsplit(base_url), base_url)

    @classmethod
    def _of(cls, parts: SplitResult, url: str) -> Origin:
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        default = 443 if scheme == "https" else 80
        port = parts.port or default
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        host_header = shown if port == default else f"{shown}:{port}"
        return cls(scheme, host, port, parts.path.rstrip("/"), host_header)

    def head(self, path: str, headers: dict[str, str]) -> bytes:
        """A POST's request line and headers up to (and without) the content-length value."""
        lines = self._lines("POST", f"{self.base_path}{path}", headers)
        lines.append("content-length: ")
        return "\r\n".join(lines).encode("latin-1")

    def get_head(self, target: str, headers: dict[str, str]) -> bytes:
        """A whole GET request for ``target`` (path and query, as sent), which has no body."""
        return ("\r\n".join(self._lines("GET", target, headers)) + "\r\n\r\n").encode("latin-1")

    def _lines(self, method: str, target: str, headers: dict[str, str]) -> list[str]:
        lines = [f"{method} {target} HTTP/1.1", f"host: {self.host_header}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        return lines


def split_url(url: str) -> tuple[Origin, str]:
    """An absolute http(s) URL as its origin and its request target ("/metrics?x=1")."""
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Origin._of(parts._replace(path=""), url), target


class WireResponse:
    """One answer: status and headers once the head arrived, then the body, pulled (``readany``,
    ``read``) or pushed (``push``). Closed exactly once; ``close`` reuses the connection when the body
    was read to its end and the server keeps it alive, and cuts it otherwise."""

    __slots__ = (
        "_buffer",
        "_buffered",
        "_conn",
        "_decoder",
        "_error",
        "_take",
        "_waiter",
        "ended",
        "headers",
        "status",
    )

    def __init__(self, conn: _Connection) -> None:
        self._conn: _Connection | None = conn
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._buffer: deque[bytes] = deque()
        self._buffered = 0
        self._decoder: Any = None
        self.ended = False
        self._error: WireError | None = None
        self._take: Take | None = None
        self._waiter: asyncio.Future[bool] | None = None

    def header(self, name: bytes) -> str | None:
        """A response header's value (the first, by lowercase name)."""
        for key, value in self.headers:
            if key.lower() == name:
                return value.decode("latin-1")
        return None

    @property
    def content_type(self) -> str:
        return (self.header(b"content-type") or "").split(";", 1)[0].strip().lower()

    # What the connection tells its response.

    def _on_body(self, data: bytes) -> None:
        if self._decoder is not None:
            try:
                data = self._decoder.decompress(data)
            except zlib.error:
                self._fail(WireError("malformed", "the body does not decompress"))
                return
            if not data:
                return
        take = self._take
        if take is not None and not self._buffer:
            if take(data):
                return
            self._take = None
            self._wake(False)
            return
        self._buffer.append(data)
        self._buffered += len(data)
        conn = self._conn
        if self._buffered > PAUSE_AT_BYTES and conn is not None:
            conn.pause()
        self._wake(False)

    def _on_end(self) -> None:
        if self._decoder is not None:
            tail = self._decoder.flush()
            self._decoder = None
            if tail:
                self._on_body(tail)
        self.ended = True
        self._wake(True)

    def _fail(self, error: WireError) -> None:
        if self.ended or self._error is not None:
            return
        self._error = error
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def _wake(self, value: bool) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(value)

    # What the reader asks of it.

    async def readany(self) -> bytes:
        """The next piece of the body as it arrived; b"" at its end. Raises ``WireError``."""
        while True:
            if self._buffer:
                data = self._buffer.popleft()
                self._buffered -= len(data)
                if not self._buffer:
                    self._resume()
                return data
            if self.ended:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait()

    async def read(self) -> bytes:
        """The whole body."""
        parts: list[bytes] = []
        while True:
            data = await self.readany()
            if not data:
                return b"".join(parts)
            parts.append(data)

    async def push(self, take: Take) -> bool:
        """Hand each piece of the body to ``take``, from the network callback as it arrives (pieces
        that came before this call first), until ``take`` returns False (then False) or the body has
        ended (then True). Raises ``WireError``. No task wakes per piece: the caller waits once."""
        buffer = self._buffer
        while buffer:
            data = buffer.popleft()
            self._buffered -= len(data)
            if not take(data):
                self._resume()
                return False
        if self.ended:
            return True
        if self._error is not None:
            raise self._error
        self._take = take
        self._resume()
        try:
            return await self._wait()
        finally:
            self._take = None

    def _wait(self) -> asyncio.Future[bool]:
        conn = self._conn
        if conn is None:
            raise WireError("broken", "the response was closed")
        waiter = self._waiter = conn.loop.create_future()
        return waiter

    def _resume(self) -> None:
        conn = self._conn
        if conn is not None:
            conn.resume()

    def read_within(self, seconds: float | None) -> None:
        """From now on, silence longer than ``seconds`` while the body is unfinished is a failure."""
        if self._conn is not None:
            self._conn.arm_read_clock(seconds)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        self._take = None
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(WireError("broken", "the response was closed"))
        self._waiter = None
        conn.finished(self, reuse=self.ended and not self._buffer)


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an origin, carrying one response at a time."""

    def __init__(self, pool: WirePool, origin: Origin, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.origin = origin
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.response: WireResponse | None = None
        self.head_waiter: asyncio.Future[None] | None = None
        self.keep_alive = True
        self.framed = False  # the response says where its body ends (length or chunks), not the close
        self.got_bytes = False
        self.idle_since = 0.0
        self.paused = False
        self._parser = httptools.HttpResponseParser(self)
        # The body pieces (HTTP chunks) of one read, handed on together when the read is parsed: a
        # stream whose events are one chunk each then costs its reader one call, and its client one
        # write, per read rather than per event.
        self._pieces: list[bytes] = []
        self._read_clock_s: float | None = None
        self._last_read = 0.0
        self._read_timer: asyncio.TimerHandle | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio's subclasses

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # nothing was asked: a server that talks out of turn is not reused
            self.abort()
            return
        self.got_bytes = True
        if self._read_clock_s is not None:
            self._last_read = self.loop.time()
        failure: WireError | None = None
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            failure = WireError("malformed", "the upstream switched protocols")
        except httptools.HttpParserCallbackError as exc:  # a reader's callback failed: not the upstream's
            self._pieces.clear()
            failure = WireError("broken", f"the reader failed ({exc.__context__!r})")
        except httptools.HttpParserError as exc:
            failure = WireError("malformed", f"unreadable HTTP from the upstream ({exc})")
        try:
            self._deliver_pieces()  # what was whole before any garbage still reaches the reader
        except Exception as exc:
            failure = failure or WireError("broken", f"the reader failed ({exc!r})")
        if failure is not None:
            self._lost(failure)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.keep_alive = False
        self._stop_read_clock()
        self.pool.forget(self)
        response = self.response
        if response is None:
            return
        if self.head_waiter is None and not self.framed and not response.ended:
            response._on_end()  # a body delimited by the close: this is its end
            return
        self._lost(WireError("broken" if self.head_waiter is None else "disconnected", "connection lost"))

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        self.response.headers.append((name, value))

    def on_headers_complete(self) -> None:
        response, parser = self.response, self._parser
        assert response is not None
        response.status = parser.get_status_code()
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
            response._decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib, told by its header
        elif encoding not in (None, b"identity"):
            self._lost(WireError("malformed", f"unsupported content-encoding {encoding.decode('latin-1')}"))
            return
        if response.status in (204, 304):
            self.framed = True
        waiter, self.head_waiter = self.head_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._pieces.append(body)

    def on_message_complete(self) -> None:
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

    def begin(self, request: bytes) -> WireResponse:
        assert self.transport is not None
        self.response = WireResponse(self)
        self.head_waiter = self.loop.create_future()
        self.framed = False
        self.got_bytes = False
        self.transport.write(request)
        return self.response

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
        self._lost(WireError("silent", f"no data for {seconds:g}s"))

    def _stop_read_clock(self) -> None:
        self._read_clock_s = None
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _lost(self, error: WireError) -> None:
        """This connection can carry nothing more: fail whatever waits on it and close it."""
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
        if reuse and self.keep_alive and self.transport is not None and not self.transport.is_closing():
            self.idle_since = self.loop.time()
            self.pool.keep(self)
        else:
            self.abort()

    def abort(self) -> None:
        self.keep_alive = False
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.close()


class WirePool:
    """Keep-alive connections per origin, most recently used first; no cap of its own (a backend's
    ``max_concurrency`` bounds its calls in the decision)."""

    def __init__(self) -> None:
        self._idle: dict[Origin, list[_Connection]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._all: set[_Connection] = set()

    async def post(self, origin: Origin, head: bytes, body: bytes, connect_s: float | None) -> WireResponse:
        """Send one request; return once the response's head arrived (any status). A kept connection
        that turns out closed before answering a byte is replaced once by a new one: the server never
        saw the request. Cancel it to give up (its connection is then cut)."""
        return await self._send(origin, head + b"%d\r\n\r\n" % len(body) + body, connect_s)

    async def get(self, origin: Origin, head: bytes, connect_s: float | None) -> WireResponse:
        """``post`` for a whole GET request (``Origin.get_head``)."""
        return await self._send(origin, head, connect_s)

    async def _send(self, origin: Origin, request: bytes, connect_s: float | None) -> WireResponse:
        conn = self._reusable(origin)
        if conn is not None:
            try:
                return await self._exchange(conn, request)
            except WireError as exc:
                if exc.kind != "disconnected" or conn.got_bytes:
                    raise
        conn = await self._connect(origin, connect_s)
        return await self._exchange(conn, request)

    async def _exchange(self, conn: _Connection, request: bytes) -> WireResponse:
        response = conn.begin(request)
        waiter = conn.head_waiter
        assert waiter is not None
        try:
            await waiter
        except BaseException:
            response.close()
            raise
        return response

    def _reusable(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.transport is None or conn.transport.is_closing():
                continue
            if conn.loop.time() - conn.idle_since > IDLE_KEEP_S:
                conn.abort()
                continue
            return conn
        return None

    async def _connect(self, origin: Origin, connect_s: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        context = None
        if origin.scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        try:
            async with asyncio.timeout(connect_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, origin, loop),
                    origin.host,
                    origin.port,
                    ssl=context,
                    server_hostname=origin.host if context is not None else None,
                )
        except TimeoutError:
            raise WireError("connect", f"no connection in {connect_s:g}s") from None
        except OSError as exc:  # refused, unreachable, DNS, TLS handshake
            raise WireError("connect", type(exc).__name__) from exc
        self._all.add(conn)
        return conn

    def keep(self, conn: _Connection) -> None:
        self._idle.setdefault(conn.origin, []).append(conn)

    def forget(self, conn: _Connection) -> None:
        self._all.discard(conn)
        idle = self._idle.get(conn.origin)
        if idle and conn in idle:
            idle.remove(conn)

    def close(self) -> None:
        for conn in list(self._all):
            conn.abort()
        self._idle.clear()
