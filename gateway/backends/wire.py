"""HTTP/1.1 to the upstreams on asyncio protocols and httptools: the pool of keep-alive connections.

Why not aiohttp's client here: a paced stream's every token is its own packet, and through aiohttp
each one costs a future, a task wake-up and three async-iterator frames before the relay sees it; a
whole answer costs ~0.3 ms of request objects, header multidicts and timers. Here the body reaches the
relay from the network callback itself (``WireResponse.push``) and a request is one prebuilt head and
one ``write``. The client does only what upstream calls need: POST with a known length, keep-alive
pooling per origin (capped, with a queue, idle connections reaped), TLS, proxies, responses framed by
length, chunks or close, gzip/deflate bodies, and three clocks (connect, the head, silence between
body pieces). ``gateway.backends.openai_compat`` turns its answers and failures into the backend
seam's. Plain GETs (metrics, health, slots) go over the same pool (``WirePool.get``).

The parts: ``wire_origin`` (where, and the heads), ``wire_dial`` (DNS, happy eyeballs, TLS, proxy
tunnels), ``wire_connection`` (parsing one answer, its limits), ``wire_response`` (the body as the
reader sees it), ``wire_decode`` (gzip/deflate), ``wire_errors`` (``WireError``, ``WireLimits``).
"""

from __future__ import annotations

import asyncio
from collections import deque

from gateway.backends.wire_connection import Connection
from gateway.backends.wire_dial import Dialer
from gateway.backends.wire_errors import PAUSE_AT_BYTES, WireError, WireLimits
from gateway.backends.wire_origin import Origin, Proxy, split_url
from gateway.backends.wire_response import WireResponse

__all__ = [
    "PAUSE_AT_BYTES",
    "Origin",
    "Proxy",
    "WireError",
    "WireLimits",
    "WirePool",
    "WireResponse",
    "split_url",
]

# A pooled connection idle longer than this is closed, not reused: below the 5 s keep-alive of
# uvicorn, node and most servers, so that we, not they, end an idle connection (a server that closes
# as our request leaves makes the request fail; it is never sent twice).
IDLE_KEEP_S = 4.0
DEFAULT_MAX_CONNECTIONS = 1024  # per origin, unless the backend says (out of fds is worse than a queue)
# A body larger than this goes out in one write beside its head, not copied after it. Why: with the
# caller's buffer, the copy made two large blocks live at once, and freeing them let the C allocator
# hand the heap's top back to the kernel, to fault it in again on the next one: a traced gateway's
# ~480 KB OTLP posts cost it ~0.9 page faults per request, 1-6% of a traced whole answer's CPU in two
# measurements (docs/performance.md, "Tracing off and on").
COPY_LIMIT = 64 * 1024


class WirePool:
    """Keep-alive connections per origin, most recently used first, at most ``max_connections`` per
    origin (more requests wait in order for one to come back)."""

    def __init__(self, limits: WireLimits | None = None, dialer: Dialer | None = None) -> None:
        self.limits = limits or WireLimits()
        self._dialer = dialer or Dialer()
        self._idle: dict[Origin, list[Connection]] = {}
        self._open: dict[Origin, int] = {}  # connections per origin, connecting ones included
        self._waiting: dict[Origin, deque[asyncio.Future[Connection | None]]] = {}
        self._all: set[Connection] = set()
        self._reaper: asyncio.TimerHandle | None = None

    async def post(
        self,
        origin: Origin,
        head: bytes,
        body: bytes,
        connect_s: float | None,
        max_connections: int | None = None,
    ) -> WireResponse:
        """Send one request; return once the response's head arrived (any status). Never sent twice:
        once written, a request that gets no answer fails (the server may have run it). Cancel it to
        give up (its connection is then cut)."""
        head += b"%d\r\n\r\n" % len(body)
        conn = self._reusable(origin) or await self._acquire(origin, connect_s, max_connections)
        if len(body) > COPY_LIMIT:  # written from the caller's buffer, not copied after the head
            return await self._exchange(conn, head, body)
        return await self._exchange(conn, head + body)

    async def get(
        self, origin: Origin, head: bytes, connect_s: float | None, max_connections: int | None = None
    ) -> WireResponse:
        """``post`` for a whole GET request (``Origin.get_head``). A GET is safe to repeat, so one a
        kept connection dropped unanswered is sent once more on a new connection."""
        conn = self._reusable(origin) or await self._acquire(origin, connect_s, max_connections)
        reused = conn.idle_since > 0
        try:
            return await self._exchange(conn, head)
        except WireError as exc:
            if not reused or exc.kind != "disconnected" or conn.got_bytes:
                raise
        conn = await self._acquire(origin, connect_s, max_connections)
        return await self._exchange(conn, head)

    async def _exchange(self, conn: Connection, request: bytes, body: bytes = b"") -> WireResponse:
        response = conn.begin(request, body)
        waiter = conn.head_waiter
        assert waiter is not None
        try:
            await waiter
        except BaseException:
            # The future holds what it raised, whose traceback holds this frame: without the name,
            # the frame does not hold the future back (no cycle keeping the connection for the collector).
            del waiter
            response.close()
            raise
        return response

    async def _acquire(self, origin: Origin, connect_s: float | None, cap: int | None) -> Connection:
        """A connection that is not idle in the pool: a new one within the cap, else the first one
        handed back (or the first slot freed), in order."""
        if self._open.get(origin, 0) >= (cap or DEFAULT_MAX_CONNECTIONS):
            waiter: asyncio.Future[Connection | None] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(origin, deque()).append(waiter)
            try:
                handed = await waiter  # a kept connection, or None: a slot to connect in
            except BaseException:
                self._give_up_wait(origin, waiter)
                raise
            if handed is not None:
                return handed
        else:
            self._open[origin] = self._open.get(origin, 0) + 1
        return await self._connect(origin, connect_s)

    def _give_up_wait(self, origin: Origin, waiter: asyncio.Future[Connection | None]) -> None:
        """A waiter cancelled (its request gave up): what it was handed goes on to the next."""
        queue = self._waiting.get(origin)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            return
        if waiter.done() and not waiter.cancelled():
            handed = waiter.result()
            if handed is not None:
                self.keep(handed)
            else:
                self._release_slot(origin)

    def _reusable(self, origin: Origin) -> Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.loop.time() - conn.idle_since > IDLE_KEEP_S or not conn.unread():
                conn.abort()
                continue
            return conn
        return None

    async def _connect(self, origin: Origin, connect_s: float | None) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            conn: Connection = await self._dialer.dial(
                origin, connect_s, lambda: Connection(self, origin, loop, self.limits)
            )
        except BaseException:
            self._release_slot(origin)
            raise
        if conn.transport is None:  # closed as it opened (connection_lost came first)
            self._release_slot(origin)
            raise WireError("connect", f"{origin.name}: closed as soon as it opened")
        self._all.add(conn)
        return conn

    def keep(self, conn: Connection) -> None:
        """A connection free for the next request: handed to the first waiter, else kept idle."""
        queue = self._waiting.get(conn.origin) if self._waiting else None
        while queue:
            waiter = queue.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.setdefault(conn.origin, []).append(conn)
        if self._reaper is None:
            self._reaper = conn.loop.call_later(IDLE_KEEP_S, self._reap)

    def forget(self, conn: Connection) -> None:
        """A connection closed: its slot goes to the first waiter."""
        if conn not in self._all:
            return
        self._all.discard(conn)
        idle = self._idle.get(conn.origin)
        if idle and conn in idle:
            idle.remove(conn)
        self._release_slot(conn.origin)

    def _release_slot(self, origin: Origin) -> None:
        queue = self._waiting.get(origin)
        while queue:
            waiter = queue.popleft()
            if not waiter.done():
                waiter.set_result(None)  # its holder connects in the slot this one leaves
                return
        left = self._open.get(origin, 0) - 1
        if left > 0:
            self._open[origin] = left
        else:
            self._open.pop(origin, None)
            self._waiting.pop(origin, None)

    def _reap(self) -> None:
        """Close connections idle past IDLE_KEEP_S: a server would soon, and each holds an fd."""
        self._reaper = None
        soonest = None
        for idle in list(self._idle.values()):
            for conn in list(idle):
                age = conn.loop.time() - conn.idle_since
                if age >= IDLE_KEEP_S:
                    conn.abort()
                elif soonest is None or age > soonest[0]:
                    soonest = (age, conn)
        if soonest is not None:
            self._reaper = soonest[1].loop.call_later(IDLE_KEEP_S - soonest[0], self._reap)

    def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for conn in list(self._all):
            conn.abort()
        self._idle.clear()
