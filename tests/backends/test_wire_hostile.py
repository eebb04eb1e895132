"""The wire client against hostile upstreams on loopback, one per defect the review of issue 28 found:
1xx answers and a second answer that would reach the next request, a POST the upstream read in full
and that must not be sent twice, floods (head, headers, body), a decompression bomb, corrupt and
unusual compressed bodies, a redirect that would carry the backend's key elsewhere, failures that
must say what failed, and an SSE event that never ends."""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
import zlib
from collections.abc import AsyncIterator

import pytest

from gateway.backends.openai_compat import OpenAICompatClient
from gateway.backends.wire import PAUSE_AT_BYTES, WireError, WirePool
from gateway.measure.meter import MAX_EVENT_BYTES, StreamMeter
from gateway.values.observation import Attempt
from tests.backends.test_wire import STREAM_HEAD, Handler, RawServer, answer, chunk, head_for, read_request


@pytest.fixture
async def pool() -> AsyncIterator[WirePool]:
    wire = WirePool()
    yield wire
    wire.close()


async def echo_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        body = await read_request(reader)
        writer.write(answer(body))
        await writer.drain()


# --- 1xx and answers out of turn ------------------------------------------------------------------


@pytest.mark.parametrize(
    "informational",
    [
        b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\n",
    ],
)
async def test_a_1xx_before_the_answer_never_gives_one_request_anothers_answer(
    pool: WirePool, informational: bytes
) -> None:
    """The upstream says 103 (or 100) before its answer and is slow with the answer. A client that takes
    the 1xx for the answer pools the connection mid-response, and the next request on it reads the
    previous one's answer."""

    async def hints_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await read_request(reader)
        writer.write(informational)
        await writer.drain()
        try:  # a client that took the 1xx for the answer sends its next request on this connection
            async with asyncio.timeout(1.0):
                second: bytes | None = await read_request(reader)
        except TimeoutError:
            second = None
        writer.write(answer(first))
        if second is not None:
            writer.write(answer(second))
        await writer.drain()
        await echo_forever(reader, writer)

    async with RawServer(hints_first) as server:
        origin = server.origin()
        first = await pool.post(origin, head_for(origin), b'"A"', 5.0)
        first_status, first_body = first.status, await first.read()
        first.close()
        second = await pool.post(origin, head_for(origin), b'"B"', 5.0)
        second_body = await second.read()
        second.close()
    assert second_body == b'"B"'  # never A's answer
    assert (first_status, first_body) == (200, b'"A"')
    assert first.header(b"link") is None  # the 1xx's headers are not the answer's


async def test_a_1xx_in_the_same_packet_as_the_answer_is_skipped(pool: WirePool) -> None:
    async def together(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await read_request(reader)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" + answer(body))
        await writer.drain()
        await echo_forever(reader, writer)

    async with RawServer(together) as server:
        origin = server.origin()
        for n in range(2):
            response = await pool.post(origin, head_for(origin), b"%d" % n, 5.0)
            assert (response.status, await response.read()) == (200, b"%d" % n)
            response.close()
        assert server.connections == 1  # a clean 1xx leaves the connection reusable


async def test_a_second_answer_in_the_same_read_neither_overwrites_the_first_nor_reaches_the_next(
    pool: WirePool,
) -> None:
    async def says_more(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await read_request(reader)
        stray = b"HTTP/1.1 500 Oops\r\ncontent-length: 9\r\n\r\n" + b'"stray!!"'
        writer.write(answer(body) + stray)
        await writer.drain()
        await echo_forever(reader, writer)

    async with RawServer(says_more) as server:
        origin = server.origin()
        first = await pool.post(origin, head_for(origin), b'"A"', 5.0)
        assert first.status == 200 and await first.read() == b'"A"'
        first.close()
        second = await pool.post(origin, head_for(origin), b'"B"', 5.0)
        assert (second.status, await second.read()) == (200, b'"B"')
        second.close()
        assert server.connections == 2  # the connection that talked out of turn was not reused


# --- a POST is never sent twice ---------------------------------------------------------------------


async def test_a_post_the_upstream_read_is_not_sent_again_when_it_hangs_up(pool: WirePool) -> None:
    """The upstream reads the second request on a kept connection in full, then closes without a word
    (it may have started, and billed, the generation). Sending it again on a new connection would run
    it twice; the attempt must fail instead."""
    received: list[bytes] = []

    async def reads_then_hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await read_request(reader)
            received.append(body)
            if len(received) == 2:
                return  # read in full, then closed
            writer.write(answer(body))
            await writer.drain()

    async with RawServer(reads_then_hangs_up) as server:
        origin = server.origin()
        first = await pool.post(origin, head_for(origin), b"1", 5.0)
        assert await first.read() == b"1"
        first.close()
        with pytest.raises(WireError) as failed:
            await pool.post(origin, head_for(origin), b"2", 5.0)
        assert failed.value.kind == "disconnected"
        await asyncio.sleep(0.05)  # a resend would be on its way by now
        assert received == [b"1", b"2"]
        assert server.connections == 1


async def test_a_kept_connection_the_server_closed_while_idle_is_not_used(pool: WirePool) -> None:
    """The usual race the other way round: the close came before our request, so a new connection
    carries it (and the upstream sees it once)."""
    received: list[bytes] = []
    closed = asyncio.Event()

    async def one_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await read_request(reader)
        received.append(body)
        writer.write(answer(body))
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        closed.set()

    async with RawServer(one_per_connection) as server:
        origin = server.origin()
        first = await pool.post(origin, head_for(origin), b"1", 5.0)
        assert await first.read() == b"1"
        first.close()
        await closed.wait()
        second = await pool.post(origin, head_for(origin), b"2", 5.0)
        assert await second.read() == b"2"
        second.close()
    assert received == [b"1", b"2"]


# --- floods -------------------------------------------------------------------------------------------


async def test_a_head_flood_fails_at_the_limit(pool: WirePool) -> None:
    async def endless_header(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nx-flood: ")
        for _ in range(64):  # 16 MiB of one header value, if the client keeps reading
            writer.write(b"a" * (256 * 1024))
            await writer.drain()
        writer.write(b"\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()

    async with RawServer(endless_header) as server:
        origin = server.origin()
        with pytest.raises(WireError) as failed:
            await pool.post(origin, head_for(origin), b"{}", 5.0)
        assert failed.value.kind == "malformed" and "head is longer" in str(failed.value)


async def test_too_many_headers_fail(pool: WirePool) -> None:
    async def many_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        head = b"HTTP/1.1 200 OK\r\n" + b"".join(b"x-%d: 1\r\n" % n for n in range(5000))
        writer.write(head + b"content-length: 2\r\n\r\n{}")
        await writer.drain()

    async with RawServer(many_headers) as server:
        origin = server.origin()
        with pytest.raises(WireError) as failed:
            await pool.post(origin, head_for(origin), b"{}", 5.0)
        assert "headers" in str(failed.value)


async def test_a_body_flood_fails_a_whole_read_at_the_limit() -> None:
    async def endless_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        piece = chunk(b"x" * (1024 * 1024))
        for _ in range(40):  # 40 MiB, past the default 32 MiB a whole body may be
            writer.write(piece)
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    wire = WirePool()
    try:
        async with RawServer(endless_body) as server:
            origin = server.origin()
            response = await wire.post(origin, head_for(origin), b"{}", 5.0)
            with pytest.raises(WireError) as failed:
                await response.read()
            response.close()
            assert "longer than" in str(failed.value)
    finally:
        wire.close()


def trailers_after(body: bytes, *trailers: tuple[bytes, int]) -> Handler:
    """An upstream answering with a chunked ``body`` and then ``trailers`` (name, size of its value),
    each value written in 256 KiB pieces as the client reads them."""
    piece = b"t" * (256 * 1024)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + chunk(body) + b"0\r\n")
        for name, size in trailers:
            writer.write(name + b": ")
            for _ in range(size // len(piece)):
                writer.write(piece)
                await writer.drain()
            writer.write(piece[: size % len(piece)] + b"\r\n")
            await writer.drain()
        writer.write(b"\r\n")
        await writer.drain()

    return handler


async def read_traced(handler: Handler) -> tuple[bytes | WireError, int]:
    """What reading the answer gives, and the most memory Python held meanwhile (tracemalloc's peak:
    httptools holds a header's value in bytes objects until it ends)."""
    wire = WirePool()
    tracemalloc.start()
    try:
        async with RawServer(handler) as server:
            origin = server.origin()
            response = await wire.post(origin, head_for(origin), b"{}", 5.0)
            try:
                result: bytes | WireError = await response.read()
                assert response.header(b"x-trailer") is None  # a trailer is never one of the answer's
            except WireError as exc:
                result = exc
            response.close()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        wire.close()


async def test_a_24_mib_trailer_fails_at_the_head_limit_without_being_held() -> None:
    result, peak = await read_traced(trailers_after(b"{}", (b"x-trailer", 24 * 1024 * 1024)))
    assert isinstance(result, WireError) and "trailers are longer" in str(result)
    # Unbounded, the trailer's 24 MiB is held (and copied as it grows): 72 MiB at the peak.
    assert peak < 4 * 1024 * 1024


async def test_200_trailers_of_200_kb_fail_at_the_head_limit() -> None:
    trailers = [(b"x-trailer-%d" % n, 200 * 1000) for n in range(200)]
    result, peak = await read_traced(trailers_after(b"{}", *trailers))
    assert isinstance(result, WireError) and "trailers are longer" in str(result)
    assert peak < 4 * 1024 * 1024


async def test_small_trailers_are_read_and_dropped() -> None:
    result, _ = await read_traced(trailers_after(b'{"ok": 1}', (b"x-trailer", 40), (b"x-checksum", 64)))
    assert result == b'{"ok": 1}'


def gzip_bomb(inflated: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    zeros = bytes(1 << 20)
    return b"".join(compressor.compress(zeros) for _ in range(inflated >> 20)) + compressor.flush()


async def test_a_decompression_bomb_is_inflated_in_bounded_steps_and_fails_at_its_cap(pool: WirePool) -> None:
    bomb = gzip_bomb(256 << 20)  # ~0.25 MiB that inflates to 256 MiB

    async def bombs(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(answer(bomb, b"content-encoding: gzip"))
            await writer.drain()

    async with RawServer(bombs) as server:
        origin = server.origin()
        response = await pool.post(origin, head_for(origin), b"{}", 5.0)
        pieces: list[int] = []

        def take(data: bytes) -> bool:
            pieces.append(len(data))
            return True

        with pytest.raises(WireError) as failed:
            await response.push(take)
        response.close()
        assert "decompresses past" in str(failed.value)
        assert max(pieces) <= PAUSE_AT_BYTES  # never one huge piece
        assert sum(pieces) <= 64 << 20  # stopped at the cap, not at 256 MiB

        response = await pool.post(origin, head_for(origin), b"{}", 5.0)
        with pytest.raises(WireError):
            await response.read()
        response.close()


# --- compressed bodies ----------------------------------------------------------------------------


async def serve_encoded(pool: WirePool, body: bytes, encoding: bytes) -> tuple[bytes | WireError, int]:
    """POST once to an upstream answering ``body`` with ``encoding``, then once more: what the first
    read gave (or its failure), and how many connections the two took."""

    answered: list[bool] = []

    async def encoded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not answered:  # the first request of all; then plain echoes, on any connection
            answered.append(True)
            await read_request(reader)
            writer.write(answer(body, b"content-encoding: " + encoding))
            await writer.drain()
        await echo_forever(reader, writer)

    async with RawServer(encoded) as server:
        origin = server.origin()
        response = await pool.post(origin, head_for(origin), b"{}", 5.0)
        result: bytes | WireError
        try:
            result = await response.read()
        except WireError as exc:
            result = exc
        response.close()
        again = await pool.post(origin, head_for(origin), b"2", 5.0)
        assert await again.read() == b"2"
        again.close()
        return result, server.connections


async def test_corrupt_gzip_fails_and_cuts_the_connection(pool: WirePool) -> None:
    corrupt = gzip.compress(b'{"ok": true}' * 100)[:20] + b"\xff" * 40
    result, connections = await serve_encoded(pool, corrupt, b"gzip")
    assert isinstance(result, WireError) and result.kind == "decoding"
    assert connections == 2


async def test_truncated_gzip_fails(pool: WirePool) -> None:
    whole = gzip.compress(b'{"ok": true}' * 1000)
    result, connections = await serve_encoded(pool, whole[: len(whole) // 2], b"gzip")
    assert isinstance(result, WireError) and result.kind == "decoding"
    assert connections == 2


async def test_raw_deflate_and_every_gzip_member_are_decoded(pool: WirePool) -> None:
    raw = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    result, connections = await serve_encoded(pool, raw.compress(b'{"raw": 1}') + raw.flush(), b"deflate")
    assert result == b'{"raw": 1}' and connections == 1
    members = gzip.compress(b'{"a": 1,') + gzip.compress(b' "b": 2}')
    result, connections = await serve_encoded(pool, members, b"gzip")
    assert result == b'{"a": 1, "b": 2}' and connections == 1


# --- redirects and failure details -----------------------------------------------------------------


async def test_a_redirect_to_another_origin_drops_the_credentials() -> None:
    seen: list[bytes] = []

    async def elsewhere(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()

    client = OpenAICompatClient()
    try:
        async with RawServer(elsewhere) as other:

            async def redirects(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                seen.append(await reader.readuntil(b"\r\n\r\n"))
                location = b"http://localhost:%d/metrics" % other.port  # another host: another origin
                writer.write(
                    b"HTTP/1.1 302 Found\r\nlocation: " + location + b"\r\ncontent-length: 0\r\n\r\n"
                )
                await writer.drain()

            async with RawServer(redirects) as first:
                url = f"http://127.0.0.1:{first.port}/metrics"
                fetched = await client.fetch(url, {"Authorization": "Bearer sk-secret"}, 5.0)
        assert fetched.status == 200 and fetched.text == "ok"
        assert b"sk-secret" in seen[0]
        assert b"sk-secret" not in seen[1] and b"authorization" not in seen[1].lower()
    finally:
        await client.close()


async def test_a_connect_failure_says_what_failed() -> None:
    client = OpenAICompatClient()
    try:
        fetched = await client.fetch("http://no-such-host.invalid/metrics", None, 5.0)
        assert fetched.status is None and "DNS" in fetched.error
    finally:
        await client.close()


# --- an SSE event that never ends ------------------------------------------------------------------


def test_an_sse_event_that_never_ends_makes_the_stream_corrupt_instead_of_being_held() -> None:
    meter = StreamMeter(Attempt("b", 0.0), client_wants_usage=False, prompt_tokens=1)
    first = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    assert meter.feed(first + b'data: {"choices":[{"delta":{"content":"', 0.0) == first
    piece = b"x" * 65536
    fed = 0
    while not meter.corrupt and fed <= 2 * MAX_EVENT_BYTES:
        assert meter.feed(piece, 0.0) == b""
        fed += len(piece)
    assert meter.corrupt and fed <= MAX_EVENT_BYTES + len(piece)


def test_an_event_split_over_many_reads_is_whole_when_its_end_comes() -> None:
    meter = StreamMeter(Attempt("b", 0.0), client_wants_usage=False, prompt_tokens=1)
    event = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"y" * 300_000 + b'"}}]}\n\n'
    out = b"".join(meter.feed(event[n : n + 1000], 0.0) for n in range(0, len(event), 1000))
    assert out == event and not meter.corrupt and meter.answer_chunks == 1
    # The end split across reads ("\n" | "\n"), and CRLF streams, are still found.
    crlf = StreamMeter(Attempt("b", 0.0), client_wants_usage=False, prompt_tokens=1)
    events = b'data: {"choices":[]}\r\n\r\ndata: {"choices":[]}\r\n\r\n'
    assert b"".join(crlf.feed(events[n : n + 1], 0.0) for n in range(len(events))) == events
