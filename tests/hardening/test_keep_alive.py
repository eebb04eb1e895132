"""A client's kept-alive connection, against a real ``gateway serve``: closed once idle for
``server.keep_alive_s`` after its last answer, and never while it is in use; a later request's header
clock starts at its own first byte. Both clocks are lazy (``request/connection.py``: a timer armed only
when it may expire, which reads its timestamp when it fires), so these tests drive a connection past the
moments an eager timer armed for an earlier request would have fired."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from gateway.emulator import create_emulator_app
from tests.hardening.conftest import ServedGateway, pool_policy, served_gateway
from tests.servers import ThreadedServer, threaded_server

KEEP_ALIVE_S = 1.0
HANG_S = 60.0  # bounds a hang only
CHAT = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def slow_pool() -> Iterator[ThreadedServer]:
    """A pool of its own: one test slows its first token down past the keep-alive."""
    with threaded_server(create_emulator_app("b300-vllm", time_scale=0.1)) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(slow_pool: ThreadedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedGateway]:
    server = f"keep_alive_s: {KEEP_ALIVE_S}, header_timeout_s: 1"
    with served_gateway(tmp_path_factory.mktemp("keep"), pool_policy(slow_pool, server)) as gateway:
        yield gateway


def open_connection(gateway: ServedGateway) -> http.client.HTTPConnection:
    host, port = gateway.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=HANG_S)
    connection.connect()
    return connection


def chat(connection: http.client.HTTPConnection) -> int:
    """One whole answer over this connection (never a new one: a closed socket fails the request)."""
    sock = connection.sock
    connection.request(
        "POST", "/v1/chat/completions", orjson.dumps(CHAT), {"content-type": "application/json"}
    )
    response = connection.getresponse()
    response.read()
    assert connection.sock is sock, "the connection was opened again"
    return response.status


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the gateway closes the socket (within HANG_S) without a byte more."""
    sock.settimeout(HANG_S)
    try:
        return sock.recv(1) == b""
    except ConnectionError:
        return True


def test_an_idle_connection_is_closed_after_the_keep_alive(gateway: ServedGateway) -> None:
    connection = open_connection(gateway)
    assert chat(connection) == 200
    answered = time.monotonic()
    assert connection.sock is not None and closed_by_peer(connection.sock)
    # Not before its time (0.9: the loop's clock is read once per iteration).
    assert time.monotonic() - answered >= KEEP_ALIVE_S * 0.9
    connection.close()


def test_a_connection_in_use_outlives_many_keep_alives(gateway: ServedGateway) -> None:
    # A request every 0.4 s for ~3 s: the timer armed at the first answer fires while the connection is
    # busy or freshly idle, and must go back to sleep, not close it.
    connection = open_connection(gateway)
    for _ in range(8):
        assert chat(connection) == 200
        time.sleep(KEEP_ALIVE_S * 0.4)
    connection.close()


def test_an_answer_slower_than_the_keep_alive_is_not_cut(
    gateway: ServedGateway, slow_pool: ThreadedServer
) -> None:
    connection = open_connection(gateway)
    assert chat(connection) == 200  # arms the keep-alive clock
    faults = slow_pool.url + "/emulator/faults"
    httpx.post(faults, json={"added_ttft_ms": 25_000}).raise_for_status()  # 2.5 s at a tenth of real time
    try:
        started = time.monotonic()
        assert chat(connection) == 200
        assert time.monotonic() - started > 2 * KEEP_ALIVE_S  # the fault took: the clock fired meanwhile
    finally:
        httpx.delete(faults).raise_for_status()
    assert chat(connection) == 200  # and the connection is still the same one
    connection.close()


def test_a_later_requests_header_clock_starts_at_its_first_byte(gateway: ServedGateway) -> None:
    # The connection opened more than header_timeout_s before its second request; that request's
    # headers arrive in two reads, 0.5 s apart: inside its own second, so it is answered.
    connection = open_connection(gateway)
    assert chat(connection) == 200
    time.sleep(0.6)
    assert chat(connection) == 200
    sock = connection.sock
    assert sock is not None
    body = orjson.dumps(CHAT)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n" % len(body)
    )
    time.sleep(0.6)
    sock.sendall(head[:20])
    time.sleep(0.5)
    sock.sendall(head[20:] + b"\r\n" + body)
    response = http.client.HTTPResponse(sock)
    response.begin()
    response.read()
    assert response.status == 200
    connection.close()
