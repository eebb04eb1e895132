"""A stream whose whole answer, usage chunk included, reaches the gateway in one read (a short answer
from a fast upstream): the client's usage chunk still carries the request's cost. Found by the
hardening runs: the relay priced the usage chunk only when it came after the first read."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from openai import OpenAI

from tests.conftest import Gateway, running_gateway

USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def frame(text: str) -> bytes:
    chunk = {"id": "chatcmpl-one", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}  # fmt: skip
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def usage_frame(usage: dict[str, object] = USAGE) -> bytes:
    chunk = {"id": "chatcmpl-one", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [], "usage": usage}  # fmt: skip
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


async def read_request(reader: asyncio.StreamReader) -> None:
    """One request off the connection: its head, then its body by its content-length."""
    header = await reader.readuntil(b"\r\n\r\n")
    length = next(int(v) for k, _, v in (line.partition(b":") for line in header.split(b"\r\n"))
                  if k.lower() == b"content-length")  # fmt: skip
    await reader.readexactly(length)


class OneWriteUpstream:
    """Answers every request with its whole stream in a single write, on a loopback port."""

    def __init__(self, usage: dict[str, object] = USAGE) -> None:
        self.usage = usage
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await read_request(reader)
            events = frame("one") + frame(" read") + usage_frame(self.usage) + b"data: [DONE]\n\n"
            writer.write(STREAM_HEAD + chunked(events) + b"0\r\n\r\n")
            await writer.drain()
        writer.close()

    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        self.thread.start()
        start = asyncio.start_server(self.serve, "127.0.0.1", 0)
        self.server = asyncio.run_coroutine_threadsafe(start, self.loop).result(10)
        try:
            yield f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        finally:
            self.loop.call_soon_threadsafe(self.server.close)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


def one_backend_policy(url: str, name: str = "fast", extra: str = "") -> str:
    """A policy with one OpenAI-dialect backend at ``url`` and a route of the same name, no probes."""
    return f"""
backends:
  {name}:
    dialect: openai
    url: {url}/v1
    model: m
    pricing: {{per_token: {{input_usd_per_mtok: 1, output_usd_per_mtok: 10}}}}
routes:
  {name}: {{backends: [{name}]}}
tuning: {{probes: {{enabled: false}}}}
{extra}"""


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    with OneWriteUpstream().running() as url:
        policy = tmp_path / "policy.yaml"
        policy.write_text(one_backend_policy(url))
        with running_gateway(policy) as gateway:
            yield gateway


def test_a_stream_read_at_once_still_reports_its_cost(gateway: Gateway) -> None:
    client = OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="fast",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    usages = [chunk.usage for chunk in stream if chunk.usage is not None]
    assert len(usages) == 1
    extra = usages[0].model_extra or {}
    assert extra.get("cost_basis") == "per_token"
    assert extra.get("cost") == pytest.approx((5 * 1 + 3 * 10) / 1e6)
