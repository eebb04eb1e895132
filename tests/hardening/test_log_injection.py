"""Client-chosen text in the log of a real ``gateway serve``: a model name carrying ``\\r`` (which makes a
terminal overwrite the line shown so far), an ANSI escape (which recolours or rewrites the terminal)
and a line feed reaches the refusal's log line escaped, never as the characters themselves."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.hardening.conftest import ServedGateway, pool_policy, served_gateway
from tests.servers import ThreadedServer

HOSTILE_MODEL = "kimi\r\x1b[2K\x1b[31mINFO admin logged in\u2028\x9b0m\nforged line"


@pytest.fixture(scope="module")
def gateway(pool: ThreadedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedGateway]:
    with served_gateway(tmp_path_factory.mktemp("logs"), pool_policy(pool)) as gateway:
        yield gateway


def test_control_characters_of_a_model_name_reach_the_log_escaped(gateway: ServedGateway) -> None:
    body = {"model": HOSTILE_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    request_id = "log-injection-1"  # the client's id, taken as the request's: it finds the log line
    response = httpx.post(
        gateway.url + "/v1/chat/completions", json=body, headers={"x-request-id": request_id}, timeout=60
    )
    assert response.status_code == 404
    deadline = time.monotonic() + 60
    line = b""
    while not line and time.monotonic() < deadline:  # the log is written by another process
        line = next((x for x in gateway.log.read_bytes().split(b"\n") if request_id.encode() in x), b"")
        time.sleep(0.05)
    assert b"refused request" in line
    text = line.decode()
    assert not any(c in text for c in "\r\x1b\x9b\u2028")
    assert "\\r\\x1b[2K\\x1b[31mINFO admin logged in\\u2028\\x9b0m\\nforged line" in text
    lines = gateway.log.read_bytes().split(b"\n")
    assert not any(b"forged line" in x and request_id.encode() not in x for x in lines)  # no line of its own
