"""A minimal OpenAI-compatible upstream for benchmarks: raw asyncio + httptools on uvloop, prebuilt bytes.

Streams for models named ``*paced*`` arrive like a real pool's (first token after ``--ttft-ms``, then
``--tokens-per-s``); everything else is answered at once, so whatever sits in front is the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from typing import Any

import httptools
import orjson

STREAM_RE = re.compile(rb'"stream"\s*:\s*true')
MODEL_RE = re.compile(rb'"model"\s*:\s*"([^"]*)"')
COMPLETION_ID = "chatcmpl-bench"


def completion_bytes() -> bytes:
    body = orjson.dumps(
        {
            "id": COMPLETION_ID,
            "object": "chat.completion",
            "created": 1700000000,
            "model": "bench-upstream",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hello from the bench upstream."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20},
        }
    )
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    return head + body


def stream_events(chunks: int) -> list[bytes]:
    """Each SSE event already framed as one HTTP/1.1 chunk: content chunks, a usage chunk, [DONE]."""
    events = []
    for i in range(chunks):
        delta: dict[str, Any] = {"content": f"tok{i} "}
        if i == 0:
            delta["role"] = "assistant"
        choice = {"index": 0, "delta": delta, "finish_reason": "stop" if i == chunks - 1 else None}
        events.append(_chunk_obj([choice]))
    usage = {"prompt_tokens": 12, "completion_tokens": chunks, "total_tokens": 12 + chunks}
    events.append(_chunk_obj([], usage=usage))
    events.append(b"data: [DONE]\n\n")
    return [b"%x\r\n%s\r\n" % (len(e), e) for e in events]


def _chunk_obj(choices: list[Any], **extra: Any) -> bytes:
    obj = {
        "id": COMPLETION_ID,
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "bench-upstream",
        "choices": choices,
        **extra,
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
STREAM_END = b"0\r\n\r\n"
MODELS = orjson.dumps({"object": "list", "data": [{"id": "fast", "object": "model", "owned_by": "bench"}]})
SMALL_OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(MODELS),
    MODELS,
)
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"


class Upstream:
    """The server's fixed answers and pacing; shared by every connection."""

    def __init__(self, chunks: int, ttft_s: float, tokens_per_s: float) -> None:
        self.completion = completion_bytes()
        self.events = stream_events(chunks)
        self.ttft_s = ttft_s
        self.interval_s = 1.0 / tokens_per_s


class Connection(asyncio.Protocol):
    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.body)
        url, self.url, self.body = self.url, b"", []
        transport = self.transport
        if transport is None:
            return
        if url.endswith(b"/completions") and self.parser.get_method() == b"POST":
            model = MODEL_RE.search(body)
            paced = model is not None and b"paced" in model.group(1)
            if not STREAM_RE.search(body):
                transport.write(self.upstream.completion)
            elif paced:
                self._paced_stream(transport)
            else:
                # One write per event, as a real server emits them; the kernel may still coalesce.
                transport.write(STREAM_HEAD)
                for event in self.upstream.events:
                    transport.write(event)
                transport.write(STREAM_END)
        elif url.endswith((b"/models", b"/health")):
            transport.write(SMALL_OK)
        else:
            transport.write(NOT_FOUND)

    def _paced_stream(self, transport: asyncio.Transport) -> None:
        transport.write(STREAM_HEAD)
        loop = asyncio.get_running_loop()
        start = loop.time() + self.upstream.ttft_s
        events = self.upstream.events
        interval = self.upstream.interval_s

        def send(i: int) -> None:
            if self.closed:
                return
            transport.write(events[i])
            if i + 1 < len(events):
                # Absolute deadlines: a late tick does not push every later token back.
                loop.call_at(start + (i + 1) * interval, send, i + 1)
            else:
                transport.write(STREAM_END)

        loop.call_at(start, send, 0)


async def serve(host: str, port: int, upstream: Upstream) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(upstream), host, port, backlog=4096)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=64, help="content chunks per streamed answer")
    parser.add_argument("--ttft-ms", type=float, default=100.0, help="paced models: delay to the first token")
    parser.add_argument("--tokens-per-s", type=float, default=50.0, help="paced models: tokens per second")
    args = parser.parse_args(argv)
    upstream = Upstream(args.chunks, args.ttft_ms / 1000.0, args.tokens_per_s)
    import uvloop

    uvloop.run(serve(args.host, args.port, upstream))


if __name__ == "__main__":
    main()
