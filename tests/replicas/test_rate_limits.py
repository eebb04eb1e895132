"""Token limits through a real gateway: admission reserves a whole answer's worth (``max_tokens``, else
the predicted output), the end of the request gives back what it did not use, and a request larger
than a minute's tokens is refused outright."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.values.auth import digest_of
from tests.conftest import PAID_KEY, Gateway, Upstreams, policy_yaml, running_gateway

from .conftest import HELLO

TOKENS_KEY = "gwk-tokens-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGH"
TOKENS_PER_MINUTE = 250
ROUTES = """
  paid-only:
    backends: [paid-api]
"""


@pytest.fixture
def limited(upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    entry = f"{{name: tokens, sha256: {digest_of(TOKENS_KEY)}, "
    entry += f"rate_limit: {{tokens_per_minute: {TOKENS_PER_MINUTE}}}}}"
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(upstreams, ROUTES) + f"auth:\n  keys:\n    - {entry}\n")
    with running_gateway(path) as gateway:
        yield gateway


def chat(gateway: Gateway, **extra: Any) -> httpx.Response:
    body = {"model": "paid-only", "messages": HELLO, **extra}
    headers = {"authorization": f"Bearer {TOKENS_KEY}"}
    return httpx.post(gateway.base_url + "/chat/completions", json=body, headers=headers, timeout=30)


def test_token_reservations_settle_with_real_usage(limited: Gateway) -> None:
    first = chat(limited)
    assert first.status_code == 200, (
        "nothing used yet: a predicted 1000-token answer reserves the whole minute"
    )
    usage = first.json()["usage"]
    per_request = usage["prompt_tokens"] + usage["completion_tokens"]
    admitted = 1
    while (response := chat(limited)).status_code == 200:
        admitted += 1
        assert admitted < 10
    assert admitted == TOKENS_PER_MINUTE // per_request >= 2, "unused reservations were given back"
    error = response.json()["error"]
    assert response.status_code == 429 and error["type"] == "rate_limit_error"
    assert "tokens per minute" in error["message"] and int(response.headers["retry-after"]) >= 1
    assert response.headers["x-ratelimit-limit-tokens"] == str(TOKENS_PER_MINUTE)


def test_a_request_larger_than_a_minute_of_tokens_is_refused(limited: Gateway) -> None:
    response = chat(limited, max_tokens=TOKENS_PER_MINUTE + 1)
    assert response.status_code == 429
    assert "request too large" in response.json()["error"]["message"]
    assert "retry-after" not in response.headers, "no wait would let it through"
    assert chat(limited, max_tokens=16).status_code == 200, "it reserved nothing"
