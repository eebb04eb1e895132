"""A purpose-built misbehaving upstream on a raw socket: each connection gets the fault named in
``mode``, down to the byte (resets, hangs, truncations, trickles, garbage), which no real server and no
emulator knob produces on demand. A request to ``/fault/MODE/...`` gets MODE whatever ``mode`` says, so
one upstream serves every fault at once: a backend's URL names its fault (``url_for``)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

import orjson

FRAMES_BEFORE_FAULT = 2
RETRY_AFTER_S = "7"


def frame(text: str) -> bytes:
    chunk = {
        "id": "chatcmpl-fault",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def head(status: str, content_type: str, extra: str = "", length: int | None = None) -> bytes:
    framing = f"content-length: {length}" if length is not None else "transfer-encoding: chunked"
    return f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\n{framing}\r\n{extra}\r\n".encode()


def json_answer(status: str, body: bytes, extra: str = "") -> bytes:
    return head(status, "application/json", extra, len(body)) + body


OPENAI_ERROR = orjson.dumps(
    {"error": {"message": "The server had an error", "type": "server_error", "code": None}}
)
STREAM_HEAD = head("200 OK", "text/event-stream")


class FaultyUpstream:
    """Listens on 127.0.0.1 in a thread of its own; ``mode`` says how the next connections misbehave."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._writers: set[asyncio.StreamWriter] = set()
        self._stopping = asyncio.Event()  # set when the upstream stops: hangs end

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def url_for(self, mode: str) -> str:
        """A base URL whose every request meets ``mode``, whatever the upstream's own mode is."""
        assert hasattr(self, "_" + mode), mode
        return f"{self.url}/fault/{mode}"

    def start(self) -> FaultyUpstream:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop
        )
        self._server = started.result(10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            # Connections still in a hang end here, not with the loop (which would leave tasks pending).
            self._stopping.set()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if others:
                await asyncio.wait(others, timeout=5)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            header = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in header.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            await reader.readexactly(length)
            await getattr(self, "_" + mode_in(header, self.mode))(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    # -- the faults, one method each ------------------------------------------------------------------

    async def _ok(self, writer: asyncio.StreamWriter) -> None:
        writer.write(
            STREAM_HEAD + b"".join(chunked(frame("ok")) for _ in range(3)) + chunked(b"data: [DONE]\n\n")
        )
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _http_500(self, writer: asyncio.StreamWriter) -> None:
        writer.write(json_answer("500 Internal Server Error", OPENAI_ERROR))
        await writer.drain()

    async def _http_429(self, writer: asyncio.StreamWriter) -> None:
        body = orjson.dumps(
            {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit"}}
        )
        writer.write(json_answer("429 Too Many Requests", body, f"retry-after: {RETRY_AFTER_S}\r\n"))
        await writer.drain()

    async def _reset(self, writer: asyncio.StreamWriter) -> None:
        self._rst(writer)

    async def _hang_before_first_byte(self, writer: asyncio.StreamWriter) -> None:
        await self._hang()

    async def _hang_mid_stream(self, writer: asyncio.StreamWriter) -> None:
        await self._frames(writer)
        await self._hang()

    async def _death_mid_stream(self, writer: asyncio.StreamWriter) -> None:
        await self._frames(writer)
        self._rst(writer)

    async def _garbage_sse(self, writer: asyncio.StreamWriter) -> None:
        await self._frames(writer)
        await asyncio.sleep(0.2)  # the frames reach the client first: the garbage comes mid-stream
        writer.write(chunked(b"data: {not json\n\n\xff\xfe\x00garbage\r\n\r\n:::\n\ndata: [1, 2\n\n"))
        await writer.drain()
        await asyncio.sleep(0.2)
        self._rst(writer)

    async def _truncated_json(self, writer: asyncio.StreamWriter) -> None:
        body = (
            b'{"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "message": {"role"'
        )
        writer.write(head("200 OK", "application/json", length=len(body) + 400) + body)
        await writer.drain()
        writer.close()

    async def _trickle(self, writer: asyncio.StreamWriter) -> None:
        writer.write(STREAM_HEAD)
        await writer.drain()
        for byte in frame("slow") * 20:
            writer.write(chunked(bytes([byte])))
            await writer.drain()
            await asyncio.sleep(1.0)

    async def _ok_with_error_body(self, writer: asyncio.StreamWriter) -> None:
        writer.write(json_answer("200 OK", OPENAI_ERROR))
        await writer.drain()

    async def _frames(self, writer: asyncio.StreamWriter) -> None:
        writer.write(STREAM_HEAD + b"".join(chunked(frame(f"t{i} ")) for i in range(FRAMES_BEFORE_FAULT)))
        await writer.drain()

    async def _hang(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), 3600)

    @staticmethod
    def _rst(writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()


def mode_in(header: bytes, default: str) -> str:
    """The mode a request's path names (``POST /fault/MODE/v1/...``), else ``default``."""
    parts = header.split(b" ", 2)
    path = parts[1].decode(errors="replace") if len(parts) > 1 else ""
    if path.startswith("/fault/"):
        return path.split("/")[2]
    return default


@contextlib.contextmanager
def faulty_upstream() -> Iterator[FaultyUpstream]:
    upstream = FaultyUpstream().start()
    try:
        yield upstream
    finally:
        upstream.stop()
