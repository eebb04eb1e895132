"""Every endpoint that reads a body reads it as the doors do, against a real ``gateway serve``: a declared
length over ``server.max_body_bytes`` is refused with 413 before the body is read (a declared 512 MiB
body is answered at once, not waited for), a chunked body is cut at the limit, and the process's memory
does not grow with what a client sends; ``/v1/messages/count_tokens`` is also shed past
``server.max_in_flight``. Each error in the endpoint's own format: Anthropic's under /v1/messages*."""

from __future__ import annotations

import os
import select
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.hardening.conftest import ServedGateway, pool_policy, served_gateway
from tests.servers import ThreadedServer

LIMIT = 65536
HANG_S = 60.0  # bounds a hang only
# Every path that reads a body: the doors (and their unprefixed aliases) and the endpoints beside them.
BODY_PATHS = [
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/completions",
    "/v1/messages",
    "/v1/responses",
    "/v1/embeddings",
    "/embeddings",
    "/v1/messages/count_tokens",
    "/admin/policy/reload",
]
DECLARED = 512 * 1024 * 1024


@pytest.fixture(scope="module")
def gateway(pool: ThreadedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedGateway]:
    policy = pool_policy(pool, f"max_body_bytes: {LIMIT}, body_timeout_s: 30")
    with served_gateway(tmp_path_factory.mktemp("bounded"), policy) as gateway:
        yield gateway


def connect(gateway: ServedGateway) -> socket.socket:
    host, port = gateway.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=HANG_S)


def answer_of(sock: socket.socket) -> bytes:
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionError:  # closed on us after the answer: what came is in ``received``
        pass
    sock.close()
    return received


def send_until_answered(sock: socket.socket, pieces: Iterator[bytes]) -> bytes:
    """Send ``pieces`` until the gateway starts answering (then stop: the rest would only be refused)."""
    for piece in pieces:
        if select.select([sock], [], [], 0)[0]:
            break
        try:
            sock.sendall(piece)
        except ConnectionError:
            break
    return answer_of(sock)


def refusal(raw: bytes, path: str) -> tuple[int, dict[str, Any]]:
    """The status and error object of a refusal in ``path``'s format; the connection is closed with it."""
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head, "no answer"
    status = int(head.split(b" ", 2)[1])
    assert b"connection: close" in head.lower()
    parsed = orjson.loads(body)
    if path.startswith("/v1/messages"):
        assert parsed["type"] == "error" and {"type", "message"} <= set(parsed["error"])
    else:
        assert set(parsed) == {"error"} and {"message", "type", "param", "code"} <= set(parsed["error"])
    error: dict[str, Any] = parsed["error"]
    return status, error


def head(path: str, framing: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n%s\r\n" % (
        path.encode(),
        framing,
    )


@pytest.mark.parametrize("path", BODY_PATHS)
def test_a_declared_512_mib_body_is_refused_before_it_is_read(gateway: ServedGateway, path: str) -> None:
    sock = connect(gateway)
    # The head and 1 KiB of the body: a gateway that waited for the rest would answer nothing until
    # the body timeout (408), not 413.
    sock.sendall(head(path, b"content-length: %d\r\n" % DECLARED) + b'{"model": "kimi-k3", ' + b" " * 1000)
    status, error = refusal(answer_of(sock), path)
    assert status == 413
    assert str(DECLARED) in error["message"]


def chunked(total: int, piece: int = 16384) -> Iterator[bytes]:
    yield b'%x\r\n{"model": "kimi-k3", "x": "\r\n' % len(b'{"model": "kimi-k3", "x": "')
    for _ in range(total // piece):
        yield b"%x\r\n%s\r\n" % (piece, b"a" * piece)
    yield b'2\r\n"}\r\n0\r\n\r\n'


@pytest.mark.parametrize("path", BODY_PATHS)
def test_a_chunked_body_over_the_limit_is_cut_at_it(gateway: ServedGateway, path: str) -> None:
    sock = connect(gateway)
    sock.sendall(head(path, b"transfer-encoding: chunked\r\n"))
    status, error = refusal(send_until_answered(sock, chunked(16 * LIMIT)), path)
    assert status == 413
    assert str(LIMIT) in error["message"]
    assert gateway.ready()["in_flight"]["now"] == 0


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM): what a body held, even briefly, shows."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_96_mib_count_tokens_body_does_not_reach_memory(gateway: ServedGateway) -> None:
    """The issue's case: 96 MiB sent to count_tokens raised the peak by 191 MiB before its 413."""
    before = peak_rss_bytes(gateway.pid)
    sock = connect(gateway)
    sock.sendall(head("/v1/messages/count_tokens", b"transfer-encoding: chunked\r\n"))
    status, _ = refusal(send_until_answered(sock, chunked(96 * 1024 * 1024, 65536)), "/v1/messages")
    assert status == 413
    # The limit is 64 KiB: what the body could hold is that plus a read or two; the bound leaves room
    # for the allocator, far below the 96 MiB a reader without the limit holds.
    assert peak_rss_bytes(gateway.pid) - before < 16 * 1024 * 1024


def test_count_tokens_still_counts(gateway: ServedGateway) -> None:
    body = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hello there"}]}
    response = httpx.post(gateway.url + "/v1/messages/count_tokens", json=body, timeout=HANG_S)
    assert response.status_code == 200 and response.json()["input_tokens"] > 0
    assert gateway.ready()["in_flight"]["now"] == 0  # its place was given back


def test_count_tokens_is_shed_past_the_in_flight_bound(pool: ThreadedServer, tmp_path: Path) -> None:
    """One place, held by a request whose upstream hangs: a count is shed in Anthropic's format."""
    httpx.post(pool.url + "/emulator/faults", json={"hang": True}).raise_for_status()
    policy = pool_policy(pool, "max_in_flight: 1, shed_retry_after_s: 2")
    try:
        with served_gateway(tmp_path, policy) as gateway:
            chat = orjson.dumps({"model": "kimi-k3", "messages": [{"role": "user", "content": "go"}]})
            holder = connect(gateway)
            holder.sendall(head("/v1/chat/completions", b"content-length: %d\r\n" % len(chat)) + chat)
            deadline = time.monotonic() + HANG_S
            while gateway.ready()["in_flight"]["now"] < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            body = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}]}
            shed = httpx.post(gateway.url + "/v1/messages/count_tokens", json=body, timeout=HANG_S)
            holder.close()  # the waiting request goes: its place is free again
            assert shed.status_code == 503 and shed.headers["retry-after"] == "2"
            assert shed.json()["type"] == "error" and shed.json()["error"]["type"] == "overloaded_error"
            while gateway.ready()["in_flight"]["now"] > 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            httpx.delete(pool.url + "/emulator/faults")
            counted = httpx.post(gateway.url + "/v1/messages/count_tokens", json=body, timeout=HANG_S)
            assert counted.status_code == 200
    finally:
        httpx.delete(pool.url + "/emulator/faults")


def test_a_graceful_stop_waits_for_a_count_then_answers_it(pool: ThreadedServer, tmp_path: Path) -> None:
    """A count whose body still trickles at SIGTERM is one of the requests the drain waits for: at the
    end of the grace it is answered 503 in Anthropic's shape, not cut without a word."""
    with served_gateway(tmp_path, pool_policy(pool, "body_timeout_s: 120")) as gateway:
        sock = connect(gateway)
        expect = b"expect: 100-continue\r\ncontent-length: 1000\r\n"
        sock.sendall(head("/v1/messages/count_tokens", expect))
        # uvicorn says 100 Continue when the endpoint starts reading the body: it is in the drain's count.
        assert sock.recv(65536).startswith(b"HTTP/1.1 100")
        sock.sendall(b'{"model": ')
        os.kill(gateway.pid, signal.SIGTERM)
        raw = answer_of(sock)
    status, error = refusal_without_close(raw)
    assert status == 503 and error["type"] == "overloaded_error" and "restarting" in error["message"]


def refusal_without_close(raw: bytes) -> tuple[int, dict[str, Any]]:
    head_line, _, body = raw.partition(b"\r\n\r\n")
    assert head_line, "no answer"
    parsed = orjson.loads(body)
    assert parsed["type"] == "error"
    error: dict[str, Any] = parsed["error"]
    return int(head_line.split(b" ", 2)[1]), error
