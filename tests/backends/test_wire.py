"""The HTTP/1.1 client under the upstream calls (``gateway.backends.wire``), against raw loopback servers
that answer with exactly the bytes each case needs: keep-alive reuse, a kept connection the server
closed, bodies framed by length, chunks and the close, gzip, a body cut in the middle, silence, a
malformed answer, pushing into a callback that stops and resumes, a cut that the server sees, and the
plain GETs (redirects, charsets, failures) that signals read."""

from __future__ import annotations

import asyncio
import gc
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvloop

from gateway.backends.base import Fetched
from gateway.backends.openai_compat import OpenAICompatClient
from gateway.backends.wire import COPY_LIMIT, PAUSE_AT_BYTES, Origin, WireError, WirePool
from gateway.backends.wire_connection import Connection

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """Counts connections; each one is served by ``handler`` until it returns."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed = asyncio.Event()  # a connection was closed by the client
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def origin(self) -> Origin:
        return Origin.of(f"http://127.0.0.1:{self.port}/v1")


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's body (the client always sends a content-length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return await reader.readexactly(length)


def answer(body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(body)
    return head + b"".join(h + b"\r\n" for h in extra) + b"\r\n" + body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def begin_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read the request; answer with a stream's head and its first event."""
    await read_request(reader)
    writer.write(STREAM_HEAD + chunk(b"data: 1\n\n"))
    await writer.drain()


@pytest.fixture
async def pool() -> AsyncIterator[WirePool]:
    wire = WirePool()
    yield wire
    wire.close()


def head_for(origin: Origin) -> bytes:
    return origin.head("/chat/completions", {"content-type": "application/json"})


async def test_keep_alive_reuses_one_connection(pool: WirePool) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await read_request(reader)
            writer.write(answer(b'{"echo": ' + body + b"}"))
            await writer.drain()

    async with RawServer(echo) as server:
        origin = server.origin()
        for n in range(3):
            response = await pool.post(origin, head_for(origin), b"%d" % n, 5.0)
            assert response.status == 200 and response.content_type == "application/json"
            assert await response.read() == b'{"echo": %d}' % n
            response.close()
        assert server.connections == 1


async def post_large_bodies() -> None:
    """A body past ``COPY_LIMIT`` is written beside its head rather than copied after it: the server
    still reads the head, then exactly that body, on a kept connection, with small posts between."""
    got: list[bytes] = []

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            got.append(await read_request(reader))
            writer.write(answer(b"{}"))
            await writer.drain()

    large = bytes(range(256)) * (3 * COPY_LIMIT // 256 + 1)
    pool = WirePool()
    try:
        async with RawServer(keep) as server:
            origin = server.origin()
            for body in (large, b"{}", large[::-1], b"[]"):
                response = await pool.post(origin, head_for(origin), body, 5.0)
                assert response.status == 200 and await response.read() == b"{}"
                response.close()
            assert got == [large, b"{}", large[::-1], b"[]"] and server.connections == 1
    finally:
        pool.close()


async def test_a_large_body_goes_out_whole_and_in_order_beside_its_head() -> None:
    await post_large_bodies()


def test_a_large_body_goes_out_whole_on_uvloop_too() -> None:
    """The gateway serves on uvloop, whose transports write a head and body apart in their own way."""
    uvloop.run(post_large_bodies())


async def test_a_kept_connection_the_server_closed_is_replaced(pool: WirePool) -> None:
    async def one_answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b"{}"))  # keep-alive by HTTP/1.1's default, then closed regardless
        await writer.drain()

    async with RawServer(one_answer_then_close) as server:
        origin = server.origin()
        first = await pool.post(origin, head_for(origin), b"{}", 5.0)
        assert await first.read() == b"{}"
        first.close()
        await asyncio.sleep(0.05)  # the server's close arrives while the connection is idle
        second = await pool.post(origin, head_for(origin), b"{}", 5.0)
        assert await second.read() == b"{}"
        second.close()
        assert server.connections == 2


async def test_chunked_push_stops_and_resumes_then_reuses(pool: WirePool) -> None:
    events = [b"data: %d\n\n" % i for i in range(6)]

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(STREAM_HEAD)
            for event in events:
                writer.write(chunk(event))
                await writer.drain()
                await asyncio.sleep(0.01)  # each event its own packet, as a paced pool's tokens
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async with RawServer(stream) as server:
        origin = server.origin()
        for _ in range(2):
            response = await pool.post(origin, head_for(origin), b"{}", 5.0)
            got: list[bytes] = []

            def take(data: bytes, got: list[bytes] = got) -> bool:
                got.append(data)
                return len(got) % 2 == 1  # stop after every second piece

            pushes = 0
            while not await response.push(take):
                pushes += 1
            assert b"".join(got) == b"".join(events)
            assert pushes >= 2  # it did stop, and went on where it stopped
            response.close()
        assert server.connections == 1


async def test_chunks_that_arrive_together_reach_the_reader_together(pool: WirePool) -> None:
    """A stream framed one event per HTTP chunk, arriving in one read, is handed on as one piece: the
    relay then meters it and writes it to its client once, not once per event."""
    events = [b"data: %d\n\n" % n for n in range(50)]

    async def burst(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + b"".join(chunk(e) for e in events) + b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with RawServer(burst) as server:
        origin = server.origin()
        response = await pool.post(origin, head_for(origin), b"{}", 5.0)
        pieces: list[bytes] = []
        while not await response.push(lambda data: pieces.append(data) is None):
            pass
        assert b"".join(pieces) == b"".join(events)
        assert len(pieces) < 5, f"{len(pieces)} pieces for 50 events sent in one write"
        response.close()


async def test_a_body_delimited_by_the_close(pool: WirePool) -> None:
    async def legacy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        writer.write(b"data: a\n\ndata: [DONE]\n\n")
        await writer.drain()

    async with RawServer(legacy) as server:
        origin = server.origin()
        response = await pool.post(origin, head_for(origin), b"{}", 5.0)
        assert await response.read() == b"data: a\n\ndata: [DONE]\n\n"
        response.close()


def answering(data: bytes) -> Handler:
    """Reads the request, answers with ``data`` and hangs up."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(data)
        await writer.drain()

    return handler


closing = answering(answer(b"{}", b"connection: close"))
malformed = answering(b"HTTP/1.1 200 OK\r\ncontent-length: nope\r\n\r\n")
too_many_headers = answering(b"HTTP/1.1 200 OK\r\n" + b"x-a: b\r\n" * 300 + b"content-length: 2\r\n\r\n{}")


@pytest.mark.parametrize(
    "handler", [closing, malformed, too_many_headers], ids=["closed", "malformed", "past-a-limit"]
)
async def test_a_closed_connection_leaves_nothing_for_the_cyclic_collector(
    pool: WirePool, handler: Handler
) -> None:
    # The connection and its httptools parser (which calls it back) pointed at each other, and a
    # connection failed by what it read kept the error, whose traceback held the frame that kept it:
    # every connection an upstream closed (``connection: close``, a restart, a reaped idle one) or
    # answered badly waited for the collector, ~20 objects each. The collector is off here, so a cycle
    # stays and is counted.
    def connections() -> int:
        return sum(1 for o in gc.get_objects() if isinstance(o, Connection))

    gc.collect()
    gc.disable()
    try:
        async with RawServer(handler) as server:
            origin = server.origin()
            for _ in range(10):
                try:
                    response = await pool.post(origin, head_for(origin), b"{}", 5.0)
                except WireError as exc:
                    assert handler is not closing and exc.kind == "malformed"
                    continue
                assert await response.read() == b"{}"
                response.close()
            for _ in range(100):  # each connection_lost runs a loop turn after its close
                if not pool._all:
                    break
                await asyncio.sleep(0.01)
            assert not pool._all, "every connection closed"
            left = connections()
    finally:
        gc.enable()
    assert left == 0, f"{left} closed connections wait for the cyclic collector"


async def test_gzip_bodies_are_decoded(pool: WirePool) -> None:
    payload = b'{"choices": []}' * 50

    async def gzipped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(gzip.compress(payload), b"content-encoding: gzip"))
        await writer.drain()
        await reader.read()

    async with RawServer(gzipped) as server:
        origin = server.origin()
        response = await pool.post(origin, head_for(origin), b"{}", 5.0)
        assert await response.read() == payload
        response.close()


async def test_a_body_cut_in_the_middle_fails_broken(pool: WirePool) -> None:
    async def dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await begin_stream(reader, writer)
        await asyncio.sleep(0.05)
        writer.transport.abort()  # the pool died mid-stream

    async with RawServer(dies) as server:
        origin = server.origin()
        response = await pool.post(origin, head_for(origin), b"{}", 5.0)
        got: list[bytes] = []
        with pytest.raises(WireError) as failed:
            while not await response.push(lambda data: got.append(data) is None):
                pass
        assert failed.value.kind == "broken" and got == [b"data: 1\n\n"]
        response.close()


async def test_silence_past_the_read_clock_fails_silent(pool: WirePool) -> None:
    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await begin_stream(reader, writer)
        await asyncio.sleep(0.1)
        writer.write(chunk(b"data: 2\n\n"))  # well within the clock: it is re-armed, not fired
        await writer.drain()
        await reader.read()  # then nothing, until the client leaves

    async with RawServer(stalls) as server:
        origin = server.origin()
        response = await pool.post(origin, head_for(origin), b"{}", 5.0)
        response.read_within(0.5)
        assert await response.readany() == b"data: 1\n\n"
        assert await response.readany() == b"data: 2\n\n"
        with pytest.raises(WireError) as failed:
            await response.readany()
        assert failed.value.kind == "silent"
        response.close()


async def test_a_reader_that_falls_behind_is_not_taken_for_silence(pool: WirePool) -> None:
    """Past PAUSE_AT_BYTES unread the socket is paused: the upstream cannot be heard then, so the
    read clock must not fail it; it counts again from when reading resumes."""
    piece = b"data: " + b"x" * 65536 + b"\n\n"
    pieces = 2 * PAUSE_AT_BYTES // len(piece) + 1

    async def floods_then_ends(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + b"".join(chunk(piece) for _ in range(pieces)))
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with RawServer(floods_then_ends) as server:
        origin = server.origin()
        response = await pool.post(origin, head_for(origin), b"{}", 5.0)
        response.read_within(0.3)
        await asyncio.sleep(1.2)  # a reader far behind: four read clocks without reading
        assert response._conn is not None and response._conn.paused
        body = await response.read()
        assert body == piece * pieces
        response.close()


async def test_closing_an_unfinished_answer_cuts_the_connection(pool: WirePool) -> None:
    seen_close = asyncio.Event()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await begin_stream(reader, writer)
        await reader.read()  # returns when the client closes: the slot would be freed here
        seen_close.set()

    async with RawServer(endless) as server:
        origin = server.origin()
        response = await pool.post(origin, head_for(origin), b"{}", 5.0)
        assert await response.readany() == b"data: 1\n\n"
        response.close()
        await asyncio.wait_for(seen_close.wait(), 5.0)


async def test_errors_before_the_head(pool: WirePool) -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()
        await reader.read()

    async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with RawServer(garbage) as server:
        origin = server.origin()
        with pytest.raises(WireError) as failed:
            await pool.post(origin, head_for(origin), b"{}", 5.0)
        assert failed.value.kind == "malformed"
    async with RawServer(hangs_up) as server:
        origin = server.origin()
        with pytest.raises(WireError) as failed:
            await pool.post(origin, head_for(origin), b"{}", 5.0)
        assert failed.value.kind == "disconnected"
    with pytest.raises(WireError) as failed:
        await pool.post(origin, head_for(origin), b"{}", 5.0)  # nobody listens there now
    assert failed.value.kind == "connect"


def test_origins_and_heads() -> None:
    origin = Origin.of("https://api.example.com/v1/")
    assert (origin.scheme, origin.host, origin.port, origin.base_path) == (
        "https",
        "api.example.com",
        443,
        "/v1",
    )
    head = origin.head("/chat/completions", {"authorization": "Bearer k"})
    assert head == (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: api.example.com\r\n"
        b"authorization: Bearer k\r\ncontent-length: "
    )
    assert Origin.of("http://[::1]:8000").host_header == "[::1]:8000"
    with pytest.raises(ValueError):
        Origin.of("ftp://example.com")


# The GETs that signals and health read (``OpenAICompatClient.fetch``) go over the same pool.


async def test_fetch_follows_a_redirect_and_reads_the_charset() -> None:
    heads: list[bytes] = []

    async def metrics(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            heads.append(head)
            if head.startswith(b"GET /metrics HTTP/1.1"):  # vLLM's mount: /metrics -> /metrics/
                writer.write(
                    b"HTTP/1.1 307 Temporary Redirect\r\nlocation: /metrics/\r\ncontent-length: 0\r\n\r\n"
                )
            else:
                text = "vllm:num_requests_running 3 # é".encode("latin-1")
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=iso-8859-1\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(text), text)
                )
            await writer.drain()

    client = OpenAICompatClient()
    try:
        async with RawServer(metrics) as server:
            url = f"http://127.0.0.1:{server.port}/metrics"
            fetched = await client.fetch(url, {"authorization": "Bearer k"}, 5.0)
            assert fetched == Fetched(200, "vllm:num_requests_running 3 # é")
            assert [h.split(b"\r\n", 1)[0] for h in heads] == [
                b"GET /metrics HTTP/1.1",
                b"GET /metrics/ HTTP/1.1",
            ]
            assert b"authorization: Bearer k" in heads[1] and b"content-length" not in heads[1]
            assert server.connections == 1  # both on one kept-alive connection
    finally:
        await client.close()


async def test_fetch_says_what_failed() -> None:
    async def loops(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 302 Found\r\nlocation: /again\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()

    async def hangs(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    client = OpenAICompatClient()
    try:
        async with RawServer(loops) as server:
            fetched = await client.fetch(f"http://127.0.0.1:{server.port}/health", None, 5.0)
            assert fetched.status is None and (fetched.error or "").startswith("TooManyRedirects")
        async with RawServer(hangs) as server:
            fetched = await client.fetch(f"http://127.0.0.1:{server.port}/health", None, 0.2)
            assert fetched.status is None and (fetched.error or "").startswith("TimeoutError")
            port = server.port
        fetched = await client.fetch(f"http://127.0.0.1:{port}/health", None, 5.0)  # nobody listens now
        assert fetched == Fetched(None, error=f"ConnectError: http://127.0.0.1:{port}: connection refused")
    finally:
        await client.close()
