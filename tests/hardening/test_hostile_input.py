"""Hostile input at every door (chat, completions, messages, responses, embeddings): numbers out of
range, invalid UTF-8, nesting past the parser's depth, client text that would reach a response header,
and ``max_tokens`` in the billions. Each is a 4xx in the door's error format, never a 5xx, or an
answer whose reservation is bounded by the backends' context window."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.money.costs import DEFAULT_CONTEXT_WINDOW
from gateway.request.proxy import retry_after_header
from tests.conftest import PAID_KEY, Gateway, Upstreams, policy_yaml, running_gateway

MESSAGES = b'[{"role": "user", "content": "hi"}]'
# Each door's smallest valid body, with HOLE where a hostile field goes.
DOORS: dict[str, bytes] = {
    "/v1/chat/completions": b'{"model": "kimi-k3", "messages": ' + MESSAGES + b", HOLE}",
    "/v1/completions": b'{"model": "kimi-k3", "prompt": "hi", HOLE}',
    "/v1/messages": b'{"model": "kimi-k3", "max_tokens": 16, "messages": ' + MESSAGES + b", HOLE}",
    "/v1/responses": b'{"model": "kimi-k3", "input": "hi", HOLE}',
    "/v1/embeddings": b'{"model": "kimi-k3", "input": "hi", HOLE}',
}
# Not JSON at all (orjson refuses them): the parser's own limits.
UNPARSABLE = {
    "infinity": b'"temperature": 1e999',
    "nan": b'"temperature": NaN',
    "huge_int": b'"max_tokens": ' + b"9" * 400,
    "invalid_utf8": b'"user": "\xff\xfe\xfa"',
    "lone_surrogate": b'"user": "\\ud800"',
    "too_deep": b'"metadata": ' + b"[" * 5000 + b"]" * 5000,
}
CHAT_LIKE = [path for path in DOORS if path != "/v1/embeddings"]
OPENAI = ["/v1/chat/completions", "/v1/completions"]
# JSON, but numbers no door accepts; the Messages and Responses doors pass on temperature and top_p
# only (their translation leaves the other fields out).
OUT_OF_RANGE = [
    (path, field, param)
    for field, param, paths in [
        (b'"temperature": 1e300', "temperature", CHAT_LIKE),
        (b'"temperature": -1', "temperature", CHAT_LIKE),
        (b'"temperature": "hot"', "temperature", CHAT_LIKE),
        (b'"top_p": 5', "top_p", CHAT_LIKE),
        (b'"n": 0', "n", OPENAI),
        (b'"presence_penalty": 1e30', "presence_penalty", OPENAI),
        (b'"seed": 1e30', "seed", OPENAI),
    ]
    for path in paths
]


@pytest.fixture(scope="module")
def gateway(upstreams: Upstreams, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway for the module: nothing here changes its state but for a few ledger rows."""
    upstreams.reset()
    path = tmp_path_factory.mktemp("hostile") / "policy.yaml"
    path.write_text(policy_yaml(upstreams))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TEST_PAID_API_KEY", PAID_KEY)
        with running_gateway(path) as gateway:
            yield gateway
    upstreams.reset()


def post(gateway: Gateway, path: str, body: bytes, **headers: str) -> httpx.Response:
    return httpx.post(
        gateway.url + path, content=body, headers={"content-type": "application/json", **headers}, timeout=60
    )


def door_error(response: httpx.Response) -> dict[str, Any]:
    """The error object in the door's own shape (Anthropic's for /v1/messages, OpenAI's elsewhere)."""
    body = response.json()
    error: dict[str, Any] = body["error"]
    if body.get("type") == "error":
        assert {"type", "message"} <= set(error)
    else:
        assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(error)
    assert error["message"]
    return error


@pytest.mark.parametrize("path", list(DOORS))
@pytest.mark.parametrize("case", list(UNPARSABLE))
def test_unparsable_bodies_are_400(gateway: Gateway, path: str, case: str) -> None:
    response = post(gateway, path, DOORS[path].replace(b"HOLE", UNPARSABLE[case]))
    assert response.status_code == 400, response.text
    door_error(response)


@pytest.mark.parametrize(("path", "field", "param"), OUT_OF_RANGE)
def test_numbers_out_of_range_are_400(gateway: Gateway, path: str, field: bytes, param: str) -> None:
    response = post(gateway, path, DOORS[path].replace(b"HOLE", field))
    assert response.status_code == 400, response.text
    error = door_error(response)
    assert param in error["message"]


@pytest.mark.parametrize("path", CHAT_LIKE)
@pytest.mark.parametrize("limit", [0, -5, 2**63 - 1, 10**30, 1.5, True])
def test_max_tokens_of_any_size_is_never_a_5xx(gateway: Gateway, path: str, limit: object) -> None:
    name = {"/v1/responses": "max_output_tokens"}.get(path, "max_tokens")
    body = DOORS[path].replace(b'"max_tokens": 16, ', b"")
    field = f'"{name}": {str(limit).lower()}'.encode()
    response = post(gateway, path, body.replace(b"HOLE", field))
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert response.status_code == 400 and name in door_error(response)["message"]


@pytest.mark.parametrize("depth", [200, 300, 1000])
def test_nesting_within_the_parser_depth_is_not_a_5xx(gateway: Gateway, depth: int) -> None:
    deep = b'"metadata": {"a": ' + b"[" * depth + b"]" * depth + b"}"
    for path, body in DOORS.items():
        response = post(gateway, path, body.replace(b"HOLE", deep))
        assert response.status_code < 500, response.text
        if depth > 255:  # deeper than orjson writes: refused as the client's, not failed upstream
            assert response.status_code == 400 and "nests" in door_error(response)["message"]


def test_client_text_never_reaches_a_response_header(gateway: Gateway) -> None:
    body = DOORS["/v1/chat/completions"].replace(b", HOLE", b"")
    host, port = gateway.url.removeprefix("http://").split(":")
    # Latin-1 bytes that Python calls alphanumeric ("ª", "µ"), sent raw: not echoed as the request id.
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
            b"x-request-id: ab\xaa\xb5cd\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
            % (len(body), body)
        )
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head = raw.partition(b"\r\n\r\n")[0]
    assert head.startswith(b"HTTP/1.1 200")
    assert b"\xaa" not in head and b"\xc2" not in head
    assert all(32 <= byte < 127 for line in head.split(b"\r\n") for byte in line)
    # A model name (echoed in x-gateway-route only when it is a route) and a request id full of
    # header syntax: neither comes back.
    hostile = post(
        gateway,
        "/v1/chat/completions",
        body.replace(b'"kimi-k3"', b'"kimi-k3\\r\\nx-injected: 1"'),
        **{"x-request-id": "id: x-injected 1"},
    )
    assert hostile.status_code == 404
    assert "x-injected" not in hostile.headers and hostile.headers.get("x-request-id") != "id: x-injected 1"
    assert "x-gateway-route" not in hostile.headers


@pytest.fixture
def windowed(upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    """The test policy with a context window on the paid API, a daily budget and a key limited to a
    million tokens a minute."""
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    digest = hashlib.sha256(b"sk-hostile").hexdigest()
    policy = policy_yaml(upstreams).replace(
        "    api_key_env: TEST_PAID_API_KEY\n",
        "    api_key_env: TEST_PAID_API_KEY\n    context_window: 262144\n",
    )
    policy = policy.replace(
        "  paid-only:\n    backends: [paid-api]\n",
        "  paid-only:\n    backends: [paid-api]\n    budgets: {per_day_usd: 5}\n",
    )
    policy += f"""auth:
  keys:
    - {{name: k, sha256: {digest}, rate_limit: {{tokens_per_minute: 1000000}}}}
tuning: {{probes: {{enabled: false}}}}
"""
    path = tmp_path / "policy.yaml"
    path.write_text(policy)
    with running_gateway(path) as gateway:
        yield gateway
    upstreams.reset()


@pytest.mark.parametrize("path", CHAT_LIKE)
def test_max_tokens_in_the_billions_is_bounded_by_the_context_window(windowed: Gateway, path: str) -> None:
    name = {"/v1/responses": "max_output_tokens"}.get(path, "max_tokens")
    body = DOORS[path].replace(b'"max_tokens": 16, ', b"").replace(b"kimi-k3", b"paid-only")
    body = body.replace(b"HOLE", f'"{name}": 5000000000'.encode())
    response = post(windowed, path, body, authorization="Bearer sk-hostile")
    # Counted as the whole window (under the key's million tokens a minute), not as five billion.
    assert response.status_code == 200, response.text
    observation = windowed.runtime.recent[-1]
    assert observation.max_tokens is not None and observation.max_tokens <= 262144
    assert observation.expected_cost_usd is not None and observation.expected_cost_usd < 5.0


def test_without_a_context_window_the_default_bound_holds(gateway: Gateway) -> None:
    body = DOORS["/v1/chat/completions"].replace(b"HOLE", b'"max_tokens": 9000000000000000000')
    assert post(gateway, "/v1/chat/completions", body).status_code == 200
    observation = gateway.runtime.recent[-1]
    assert observation.max_tokens is not None and observation.max_tokens <= DEFAULT_CONTEXT_WINDOW


@pytest.mark.parametrize(
    ("upstream", "client"),
    [
        ("7", "7"),
        ("0.2", "1"),
        ("Thu, 01 Jan 1970 00:00:10 GMT", "10"),
        ("soon\r\nx-injected: 1", "1"),
        ("99999999", "3600"),
        ("", None),
        (None, None),
    ],
)
def test_an_upstream_retry_after_reaches_the_client_as_whole_seconds(
    upstream: str | None, client: str | None
) -> None:
    assert retry_after_header(upstream, 0.0) == client
