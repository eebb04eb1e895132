"""One upstream answer as the reader sees it: status and headers, then the body pulled (``readany``,
``read``, bounded) or pushed into a callback from the network's own (``push``), decompressed a
bounded step at a time, with the socket paused while the reader is behind."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

from gateway.backends.base import Take
from gateway.backends.wire_decode import Inflater
from gateway.backends.wire_errors import BODY_LIMIT, PAUSE_AT_BYTES, WireError


class Carrier(Protocol):
    """The connection under a response, as the response needs it."""

    loop: asyncio.AbstractEventLoop

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def arm_read_clock(self, seconds: float | None) -> None: ...

    def lost(self, error: WireError) -> None: ...

    def finished(self, response: WireResponse, *, reuse: bool) -> None: ...


class WireResponse:
    """One answer: status and headers once the head arrived, then the body, pulled (``readany``,
    ``read``) or pushed (``push``). Closed exactly once; ``close`` reuses the connection when the body
    was read to its end and the server keeps it alive, and cuts it otherwise."""

    __slots__ = (
        "_buffer",
        "_buffered",
        "_conn",
        "_end_pending",
        "_error",
        "_inflater",
        "_take",
        "_waiter",
        "ended",
        "headers",
        "status",
    )

    def __init__(self, conn: Carrier) -> None:
        self._conn: Carrier | None = conn
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._buffer: deque[bytes] = deque()
        self._buffered = 0
        self._inflater: Inflater | None = None
        self._end_pending = False  # the body ended while compressed input still waits to be inflated
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

    def _decode_with(self, inflater: Inflater) -> None:
        self._inflater = inflater

    def _on_body(self, data: bytes) -> None:
        inflater = self._inflater
        if inflater is not None:
            inflater.feed(data)
            self._inflate()
            return
        # ``_deliver``, inlined: this runs once per network read of every stream.
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

    def _inflate(self) -> None:
        """Inflate while the reader keeps up; what is left waits for ``_resume`` (the socket is paused
        meanwhile), so a bomb costs at most PAUSE_AT_BYTES of memory and fails at its cap."""
        inflater = self._inflater
        assert inflater is not None
        while inflater.pending and self._buffered <= PAUSE_AT_BYTES and self._error is None:
            try:
                data = inflater.step()
            except WireError as exc:
                self._cut(exc)
                return
            if data:
                self._deliver(data)
        if self._end_pending and not inflater.pending and self._error is None:
            self._end_pending = False
            self._on_end()

    def _deliver(self, data: bytes) -> None:
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
        if self._error is not None or self.ended:
            return
        inflater = self._inflater
        if inflater is not None:
            if inflater.pending:
                self._end_pending = True
                return
            try:
                inflater.finish()
            except WireError as exc:
                self._cut(exc)
                return
        self.ended = True
        self._wake(True)

    def _cut(self, error: WireError) -> None:
        """The body is unusable (a decode error, past a limit): fail it and close its connection, which
        must not carry another answer with this one's leftovers in it."""
        conn = self._conn
        if conn is not None:
            conn.lost(error)
        else:
            self._fail(error)

    def _fail(self, error: WireError) -> None:
        if self.ended or self._error is not None:
            return
        self._error = error.copy()  # kept apart from the one the caller may raise (``WireError.copy``)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error.copy())

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
                raise self._error.copy()
            await self._wait()

    async def read(self, limit: int = BODY_LIMIT) -> bytes:
        """The whole body; longer than ``limit`` bytes (decompressed) fails it, and cuts the connection."""
        parts: list[bytes] = []
        size = 0
        while True:
            data = await self.readany()
            if not data:
                return b"".join(parts)
            size += len(data)
            if size > limit:
                error = WireError("malformed", f"the body is longer than {limit} bytes")
                self._cut(error)
                raise error
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
        self._take = take
        self._resume()  # may inflate what waited, handing it to ``take`` (and may end the body)
        if self._stopped(take):  # ``take`` asked to stop while handed what waited
            return False
        if self.ended:
            self._take = None
            return True
        if self._error is not None:
            self._take = None
            raise self._error.copy()
        try:
            return await self._wait()
        finally:
            self._take = None

    def _stopped(self, take: Take) -> bool:
        return self._take is not take

    def _wait(self) -> asyncio.Future[bool]:
        conn = self._conn
        if conn is None:
            raise WireError("broken", "the response was closed")
        waiter = self._waiter = conn.loop.create_future()
        return waiter

    def _resume(self) -> None:
        if self._inflater is not None and (self._inflater.pending or self._end_pending):
            self._inflate()
        conn = self._conn
        if conn is not None and self._buffered <= PAUSE_AT_BYTES:
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
