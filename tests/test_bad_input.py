"""Every malformed request gets a 4xx in the OpenAI error format: never a 5xx, never a hang."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import Gateway

CHAT = "/v1/chat/completions"


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    assert error["message"]
    return error


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', 400, "model"),
        (b'{"model": 7, "messages": []}', 400, "model"),
        (b'{"model": "kimi-k3"}', 400, "messages"),
        (b'{"model": "kimi-k3", "messages": []}', 400, "messages"),
        (
            b'{"model": "kimi-k3", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
            400,
            "stream",
        ),
        (
            b'{"model": "kimi-k3", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
            400,
            "max_tokens",
        ),
        (
            b'{"model": "kimi-k3", "messages": [{"role": "user", "content": "x"}], "stream_options": 3}',
            400,
            "stream_options",
        ),
    ],
)
def test_malformed_bodies(gateway: Gateway, body: bytes, status: int, param: str | None) -> None:
    response = httpx.post(gateway.url + CHAT, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status
    error = error_of(response)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_completions_without_prompt(gateway: Gateway) -> None:
    response = httpx.post(gateway.url + "/v1/completions", json={"model": "kimi-k3"})
    assert response.status_code == 400 and error_of(response)["param"] == "prompt"


def test_unknown_model_lists_the_known_ones(gateway: Gateway) -> None:
    response = httpx.post(
        gateway.url + CHAT, json={"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}
    )
    assert response.status_code == 404
    error = error_of(response)
    assert error["code"] == "model_not_found"
    assert "gpt-9" in error["message"] and "kimi-k3" in error["message"] and "paid-only" in error["message"]


def test_body_too_large_declared_and_streamed(gateway: Gateway) -> None:
    limit = gateway.runtime.policy.max_body_bytes
    big = b'{"model": "kimi-k3", "messages": [{"role": "user", "content": "' + b"x" * limit + b'"}]}'
    response = httpx.post(gateway.url + CHAT, content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413 and error_of(response)["code"] == "request_too_large"

    def chunked() -> Any:  # no content-length: the limit holds while reading
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536]

    response = httpx.post(gateway.url + CHAT, content=chunked(), headers={"content-type": "application/json"})
    assert response.status_code == 413


def test_unknown_path_and_wrong_method(gateway: Gateway) -> None:
    missing = httpx.get(gateway.url + "/v1/nothing-here")
    assert missing.status_code == 404
    error_of(missing)
    wrong = httpx.get(gateway.url + CHAT)
    assert wrong.status_code == 405
    error_of(wrong)
