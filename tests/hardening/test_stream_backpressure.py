"""A client that stops reading a fast stream: the relay writes each upstream piece to the client's socket
from the network callback only while the socket takes it; once the client's buffers are full it must
hand the rest to the ASGI ``send`` (which waits for the client) and stop reading the upstream, and
the client must still get every event, in order, when it reads again."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from tests.hardening.conftest import served_gateway
from tests.servers import threaded_server

EVENTS = 16_000
# ~1 KB per event, ~16 MB in all: more than loopback socket buffers hold unread (4 MB + ~6 MB).
PAD = "x" * 900


def fast_stream_app() -> Starlette:
    async def chat(request: Request) -> StreamingResponse:
        await request.body()

        async def events() -> AsyncIterator[bytes]:
            for i in range(EVENTS):
                delta = {"content": f"<{i}>{PAD}"}
                chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m",
                         "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}  # fmt: skip
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def policy(url: str) -> str:
    return f"""
backends:
  fast:
    dialect: openai
    url: {url}/v1
    model: m
    pricing: {{per_token: {{input_usd_per_mtok: 1, output_usd_per_mtok: 2}}}}
    timeouts: {{first_byte_s: 30, idle_s: 30}}
routes:
  m:
    backends: [fast]
tuning: {{probes: {{enabled: false}}}}
"""


def test_a_client_that_stops_reading_still_gets_every_event_in_order(tmp_path: Path) -> None:
    with threaded_server(fast_stream_app()) as upstream, served_gateway(tmp_path, policy(upstream.url)) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        body = orjson.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]})
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        with socket.create_connection(("127.0.0.1", port), timeout=60) as client:
            client.sendall(request)
            first = client.recv(4096)
            assert first.startswith(b"HTTP/1.1 200"), first[:200]
            time.sleep(2.0)  # not reading: the gateway's writes to this socket back up meanwhile
            received = [first]
            while True:
                data = client.recv(1 << 16)
                if not data:
                    break
                received.append(data)
        raw = b"".join(received)
        order = [int(part.split(b">", 1)[0]) for part in raw.split(b"<")[1:]]
        assert order == list(range(EVENTS))
        assert b"data: [DONE]" in raw
