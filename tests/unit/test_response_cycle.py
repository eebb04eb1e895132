"""The client's connection as ``gateway serve`` runs it (``request/connection.py``,
``request/response_cycle.py``), driven on a transport that records its writes: a whole answer leaves in
one write, a stream's head at once (or with its first event, when it asks), forbidden header bytes are
refused as uvicorn refuses them, and a client that hangs up before its answer completed is told to the
request through its ``ClientWatch``, once, and only then."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from gateway.request.connection import ConnectionLimits, GuardedHttpToolsProtocol, body_arrived, client_watch
from gateway.request.response_cycle import HOLD_HEAD

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5555)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def connected(app: App) -> tuple[GuardedHttpToolsProtocol, RecordingTransport]:
    config = uvicorn.Config(app, log_level="warning", lifespan="off", proxy_headers=False)
    config.load()
    protocol = GuardedHttpToolsProtocol(
        config=config,
        server_state=ServerState(),
        app_state={},
        _loop=asyncio.get_running_loop(),
        limits=ConnectionLimits(header_timeout_s=5.0, max_header_bytes=8192, keep_alive_s=5.0),
    )
    transport = RecordingTransport()
    protocol.connection_made(transport)
    return protocol, transport


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def answering(headers: list[tuple[bytes, bytes]], *pieces: bytes) -> App:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for n, piece in enumerate(pieces):
            await send({"type": "http.response.body", "body": piece, "more_body": n < len(pieces) - 1})

    return app


async def test_a_whole_answer_leaves_in_one_write() -> None:
    protocol, transport = await connected(
        answering([(b"content-length", b"5"), (b"x-gateway-route", b"chat")], b"hello")
    )
    protocol.data_received(REQUEST)
    await settle()
    assert len(transport.writes) == 1
    head, _sep, body = transport.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\ncontent-length: 5" in head and b"\r\nx-gateway-route: chat" in head
    assert body == b"hello"
    assert not transport.closed  # kept alive for the next request


async def test_a_whole_answer_in_pieces_keeps_its_length_checked() -> None:
    protocol, transport = await connected(answering([(b"content-length", b"6")], b"abc", b"def"))
    protocol.data_received(REQUEST)
    await settle()
    assert transport.writes[0].endswith(b"\r\n\r\nabc") and transport.writes[1:] == [b"def"]
    assert protocol.cycle.response_complete


async def test_a_stream_writes_its_head_at_once() -> None:
    gate = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await gate.wait()
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": False})

    protocol, transport = await connected(app)
    protocol.data_received(REQUEST)
    await settle()
    assert len(transport.writes) == 1 and b"transfer-encoding: chunked" in transport.writes[0]
    gate.set()
    await settle()
    assert transport.writes[1] == b"9\r\ndata: 1\n\n\r\n0\r\n\r\n"


@pytest.mark.parametrize("more", [True, False])
async def test_a_stream_that_holds_its_head_sends_it_with_its_first_event(more: bool) -> None:
    """The relay's way: its head and first event in one write (one packet the client wakes for), then
    each later piece framed as before."""
    head = [(b"content-type", b"text/event-stream")]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": head, HOLD_HEAD: True})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": more})
        if more:
            await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": False})

    protocol, transport = await connected(app)
    protocol.data_received(REQUEST)
    await settle()
    first, _sep, body = transport.writes[0].partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in first
    if more:
        assert body == b"9\r\ndata: 1\n\n\r\n"
        assert transport.writes[1:] == [b"9\r\ndata: 2\n\n\r\n0\r\n\r\n"]
    else:
        assert transport.writes[1:] == [] and body == b"9\r\ndata: 1\n\n\r\n0\r\n\r\n"
    assert protocol.cycle.response_complete and not transport.closed


@pytest.mark.parametrize("header", [(b"x-bad name", b"v"), (b"x-ok", b"split\r\ninjected: 1")])
async def test_forbidden_header_bytes_are_refused(header: tuple[bytes, bytes]) -> None:
    protocol, transport = await connected(answering([(b"content-length", b"2"), header], b"{}"))
    protocol.data_received(REQUEST)
    await settle()
    assert transport.writes == []  # nothing of it went out: the connection is closed, as uvicorn does
    assert transport.closed


async def test_a_hang_up_before_the_answer_is_told_once() -> None:
    told: list[str] = []
    waiting = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        watch = client_watch(scope)
        assert watch is not None
        watch.watch(lambda: told.append("gone"))
        await waiting.wait()

    protocol, _transport = await connected(app)
    protocol.data_received(REQUEST)
    await settle()
    protocol.connection_lost(None)
    protocol.connection_lost(None)  # a second report of the same loss tells nobody again
    assert told == ["gone"]
    waiting.set()
    await settle()


async def test_no_hang_up_is_told_after_the_answer_or_after_cancel() -> None:
    told: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        watch = client_watch(scope)
        assert watch is not None
        watch.watch(lambda: told.append("answered"))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    protocol, _ = await connected(app)
    protocol.data_received(REQUEST)
    await settle()
    protocol.connection_lost(None)  # the client leaves after its whole answer: normal

    async def cancelling(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        watch = client_watch(scope)
        assert watch is not None
        watch.watch(lambda: told.append("cancelled"))
        watch.cancel()
        await released.wait()

    released = asyncio.Event()
    protocol, _ = await connected(cancelling)
    protocol.data_received(REQUEST)
    await settle()
    protocol.connection_lost(None)
    assert told == []
    released.set()
    await settle()


async def test_a_body_that_came_with_its_headers_is_known_to_have_arrived() -> None:
    seen: list[bool] = []
    proceed = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(body_arrived(scope))
        await proceed.wait()
        seen.append(body_arrived(scope))
        await receive()

    protocol, _ = await connected(app)
    protocol.data_received(REQUEST)  # head and body in one piece
    await settle()
    protocol, _ = await connected(app)
    protocol.data_received(REQUEST[:-1])  # the body's last byte still to come
    await settle()
    protocol.data_received(REQUEST[-1:])
    proceed.set()
    await settle()
    assert seen == [True, False, True, True]
    assert body_arrived({"type": "http"}) is False  # a server that cannot tell: the clock stays
