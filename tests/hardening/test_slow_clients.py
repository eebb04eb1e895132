"""Slow-loris clients, on raw sockets that really trickle, against a real ``gateway serve``: headers or a
body that take longer than ``server.header_timeout_s`` / ``body_timeout_s`` get 408 and a closed
connection, headers past ``server.max_header_bytes`` get 431, and normal traffic flows meanwhile."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.hardening.conftest import ServedGateway, pool_policy, served_gateway
from tests.servers import ThreadedServer

TRICKLERS = 12
HANG_S = 60.0  # bounds a hang only: the cut-offs come after one or two seconds
CHAT = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def gateway(pool: ThreadedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedGateway]:
    server = "header_timeout_s: 1, body_timeout_s: 1, max_header_bytes: 8192"
    with served_gateway(tmp_path_factory.mktemp("slow"), pool_policy(pool, server)) as gateway:
        yield gateway


def connect(gateway: ServedGateway) -> socket.socket:
    host, port = gateway.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=HANG_S)
    sock.setblocking(False)
    return sock


def trickle_until_closed(socks: list[socket.socket], drip: bytes, every_s: float = 0.2) -> list[bytes]:
    """Send one byte of ``drip`` to every socket each ``every_s`` until the gateway closes each;
    returns what each received. Stops at HANG_S whatever happens (the test then fails on the answers)."""
    received = [b""] * len(socks)
    open_ = set(range(len(socks)))
    position = 0
    deadline = time.monotonic() + HANG_S
    while open_ and time.monotonic() < deadline:
        for n in list(open_):
            try:
                while chunk := socks[n].recv(65536):
                    received[n] += chunk
                open_.discard(n)  # b"": the gateway closed it
                continue
            except BlockingIOError:
                pass
            except ConnectionError:
                open_.discard(n)
                continue
            if drip:
                with contextlib.suppress(BlockingIOError, ConnectionError):
                    socks[n].send(drip[position % len(drip) : position % len(drip) + 1])
        position += 1
        time.sleep(every_s)
    for sock in socks:
        sock.close()
    return received


def status_and_error(raw: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"connection: close" in head.lower()
    error = orjson.loads(body)["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    return status, error


def gateway_sockets(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return count


def test_trickled_headers_are_cut_off_while_normal_traffic_flows(gateway: ServedGateway) -> None:
    before = gateway_sockets(gateway.pid)
    socks = [connect(gateway) for _ in range(TRICKLERS)]
    for sock in socks:
        sock.send(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n")
    normal = [httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=HANG_S) for _ in range(3)]
    received = trickle_until_closed(socks, b"x-slow: " + b"a" * 64)
    assert [r.status_code for r in normal] == [200, 200, 200]
    answers = [status_and_error(raw) for raw in received]
    assert [status for status, _ in answers] == [408] * TRICKLERS
    assert {error["code"] for _, error in answers} == {"request_timeout"}
    assert httpx.get(gateway.url + "/health", timeout=HANG_S).status_code == 200
    deadline = time.monotonic() + HANG_S
    while gateway_sockets(gateway.pid) > before + 2 and time.monotonic() < deadline:
        time.sleep(0.1)  # the closes are the gateway's own: its socket count goes back down
    assert gateway_sockets(gateway.pid) <= before + 2


def test_a_connection_that_sends_nothing_is_closed(gateway: ServedGateway) -> None:
    [received] = trickle_until_closed([connect(gateway)], b"", every_s=0.1)
    assert status_and_error(received)[0] == 408


def test_the_header_clock_restarts_on_a_kept_alive_connection(gateway: ServedGateway) -> None:
    sock = connect(gateway)
    sock.setblocking(True)
    sock.sendall(b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n")
    first = sock.recv(65536)
    assert first.startswith(b"HTTP/1.1 200")
    sock.setblocking(False)
    [received] = trickle_until_closed([sock], b"GET /health HTTP/1.1\r\nx-slow: " + b"b" * 64)
    assert status_and_error(received)[0] == 408


def test_a_trickled_body_gets_408_and_the_connection_closed(gateway: ServedGateway) -> None:
    socks = [connect(gateway) for _ in range(TRICKLERS)]
    for sock in socks:
        sock.send(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
            b"content-length: 100000\r\n\r\n"
        )
    received = trickle_until_closed(socks, b'{"model": "kimi-k3", "messages": []')
    answers = [status_and_error(raw) for raw in received]
    assert [status for status, _ in answers] == [408] * TRICKLERS
    assert {error["code"] for _, error in answers} == {"request_timeout"}
    ready = gateway.ready()
    assert ready["in_flight"]["now"] == 0  # each left the gate when it was answered


def test_oversized_headers_get_431_and_no_growth(gateway: ServedGateway) -> None:
    def oversized() -> bytes:
        sock = connect(gateway)
        sock.setblocking(True)
        headers = b"".join(b"x-pad-%d: %s\r\n" % (n, b"p" * 1000) for n in range(64))
        received = b""
        # Closed while we still send or read: the answer is already in our receive buffer.
        with contextlib.suppress(ConnectionError):
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n" + headers + b"\r\n")
        with contextlib.suppress(ConnectionError):
            while chunk := sock.recv(65536):
                received += chunk
        sock.close()
        return received

    status, error = status_and_error(oversized())
    assert status == 431 and error["code"] == "request_header_fields_too_large"
    before = pss_bytes(gateway.pid)
    statuses = [status_and_error(oversized())[0] for _ in range(60)]
    assert statuses == [431] * 60
    # 60 refusals of 64 KiB each: a leak would keep ~4 MiB; the bound is generous for the allocator.
    assert pss_bytes(gateway.pid) - before < 16 * 1024 * 1024
    assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT, timeout=HANG_S).status_code == 200


def pss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def test_workers_cut_slow_headers_too(pool: ThreadedServer, tmp_path: Path) -> None:
    """``serve --workers`` builds its own uvicorn config: its workers get the same protocol."""
    with served_gateway(tmp_path, pool_policy(pool, "header_timeout_s: 1"), "--workers", "2") as gateway:
        socks = [connect(gateway) for _ in range(4)]  # spread over both workers
        for sock in socks:
            sock.send(b"GET /health HTTP/1.1\r\n")
        received = trickle_until_closed(socks, b"x-slow: " + b"c" * 64)
    assert [status_and_error(raw)[0] for raw in received] == [408] * 4


def exchange_raw(gateway: ServedGateway, parts: list[bytes]) -> bytes:
    """Send ``parts`` one write each (so the gateway's parser sees them apart), then read to the close."""
    sock = connect(gateway)
    sock.setblocking(True)
    received = b""
    with contextlib.suppress(ConnectionError):
        for part in parts:
            sock.sendall(part)
            time.sleep(0.002)
        while chunk := sock.recv(65536):
            received += chunk
    sock.close()
    return received


def health_request(pad: int) -> bytes:
    return b"GET /health HTTP/1.1\r\nhost: gw\r\nx-pad: " + b"p" * pad + b"\r\nconnection: close\r\n\r\n"


def counted_header_bytes(request: bytes) -> int:
    """What the gateway counts against max_header_bytes: the URL, and each header line with its CRLF."""
    line, *headers = request.split(b"\r\n\r\n")[0].split(b"\r\n")
    return len(line.split(b" ")[1]) + sum(len(h) + 2 for h in headers)


def test_the_header_cap_is_exact(gateway: ServedGateway) -> None:
    base = counted_header_bytes(health_request(0))
    at_limit = health_request(8192 - base)
    assert counted_header_bytes(at_limit) == 8192
    assert exchange_raw(gateway, [at_limit]).startswith(b"HTTP/1.1 200")
    assert exchange_raw(gateway, [health_request(8193 - base)]).startswith(b"HTTP/1.1 431")


@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=8), pad=st.integers(0, 2000))
def test_a_request_split_anywhere_within_the_limits_is_answered(
    gateway: ServedGateway, cuts: list[int], pad: int
) -> None:
    request = health_request(pad)
    points = sorted({min(c, len(request) - 1) for c in cuts})
    parts = [request[a:b] for a, b in zip([0, *points], [*points, len(request)], strict=True) if a < b]
    assert exchange_raw(gateway, parts).startswith(b"HTTP/1.1 200")
