"""The peak memory a real ``gateway serve`` reaches under issue 42's body and trailer cases, for
docs/reliability.md: ``.venv/bin/python -m tests.hardening.memory_figures``.

Each case starts its own gateway process (policy defaults: ``max_body_bytes`` 4 MiB, the wire's 64 KiB
head limit) and reads its peak resident memory (``VmHWM``) before and after:

- body: 96 MiB sent chunked to ``POST /v1/messages/count_tokens`` (the client stops sending once the
  answer begins), then a declared 512 MiB body with 1 KiB of it sent (whether and what it answers);
- trailers: a chat request (whole answer: a stream's relay stops reading at ``[DONE]``) whose upstream,
  a hostile server on loopback, ends its chunked answer with one 24 MiB trailer, then another with
  200 trailers of 200 KB.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx

from gateway.emulator import create_emulator_app
from tests.hardening.conftest import ServedGateway, pool_policy, served_gateway
from tests.hardening.test_bounded_bodies import chunked, connect, head, peak_rss_bytes, send_until_answered
from tests.servers import threaded_server

MIB = 1024 * 1024
ANSWER = (
    b'{"id":"c","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":'
    b'{"role":"assistant","content":"hi"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
)
ANSWER_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"


def status_line(raw: bytes) -> str:
    return raw.partition(b"\r\n")[0].decode("latin-1") or "(no answer)"


def body_case() -> None:
    with (
        threaded_server(create_emulator_app("b300-vllm", time_scale=0.1)) as pool,
        tempfile.TemporaryDirectory() as tmp,
        served_gateway(Path(tmp), pool_policy(pool)) as gateway,
    ):
        before = peak_rss_bytes(gateway.pid)
        sock = connect(gateway)
        sock.sendall(head("/v1/messages/count_tokens", b"transfer-encoding: chunked\r\n"))
        answer = send_until_answered(sock, chunked(96 * MIB, 65536))
        after = peak_rss_bytes(gateway.pid)
        print(f"body: 96 MiB chunked to count_tokens -> {status_line(answer)}")
        print(f"body: peak RSS {before / MIB:.0f} MiB before, {after / MIB:.0f} MiB after")
        sock = connect(gateway)
        sock.settimeout(10)
        sock.sendall(head("/v1/messages/count_tokens", b"content-length: %d\r\n" % (512 * MIB)) + b" " * 1024)
        try:
            declared = sock.recv(65536)
        except TimeoutError:
            declared = b"(no answer within 10 s)"
        sock.close()
        print(f"body: declared 512 MiB to count_tokens -> {status_line(declared)}")


def hostile_upstream(trailers: list[tuple[bytes, int]]) -> Iterator[str]:
    """A loopback upstream whose every answer is a chat completion, chunked and ended by ``trailers``."""
    loop = asyncio.new_event_loop()
    piece = b"t" * (256 * 1024)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                request_head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in request_head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                writer.write(ANSWER_HEAD)
                writer.write(b"%x\r\n%s\r\n" % (len(ANSWER), ANSWER))
                writer.write(b"0\r\n")
                for name, size in trailers:
                    writer.write(name + b": ")
                    for _ in range(size // len(piece)):
                        writer.write(piece)
                        await writer.drain()
                    writer.write(piece[: size % len(piece)] + b"\r\n")
                    await writer.drain()
                writer.write(b"\r\n")
                await writer.drain()
        writer.close()

    server = loop.run_until_complete(asyncio.start_server(serve, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def trailer_case(label: str, trailers: list[tuple[bytes, int]]) -> None:
    with contextlib.contextmanager(hostile_upstream)(trailers) as url, tempfile.TemporaryDirectory() as tmp:
        policy = f"""
backends:
  hostile:
    dialect: openai
    url: {url}/v1
    model: m
    pricing: {{per_token: {{input_usd_per_mtok: 1, output_usd_per_mtok: 1}}}}
    timeouts: {{first_byte_s: 30, idle_s: 30}}
routes:
  kimi-k3:
    backends: [hostile]
    fallback: {{max_attempts: 1}}
tuning: {{probes: {{enabled: false}}}}
"""
        with served_gateway(Path(tmp), policy) as gateway:
            report(gateway, label)


def report(gateway: ServedGateway, label: str) -> None:
    before = peak_rss_bytes(gateway.pid)
    chat = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    with contextlib.suppress(httpx.HTTPError):
        response = httpx.post(gateway.url + "/v1/chat/completions", json=chat, timeout=120)
        print(f"trailers: {label} -> {response.status_code}, {len(response.content)} bytes")
    after = peak_rss_bytes(gateway.pid)
    print(f"trailers: {label}: peak RSS {before / MIB:.0f} MiB before, {after / MIB:.0f} MiB after")


def main() -> None:
    body_case()
    trailer_case("one 24 MiB trailer", [(b"x-trailer", 24 * MIB)])
    trailer_case("200 trailers of 200 KB", [(b"x-trailer-%d" % n, 200 * 1000) for n in range(200)])


if __name__ == "__main__":
    main()
