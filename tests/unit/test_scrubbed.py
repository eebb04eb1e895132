"""``gateway.errors.scrubbed``: an upstream's own words, passed on to a client, lose what a debug-mode
server puts in them and keep what the client needs to fix its request."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import SCRUBBED_MAX_CHARS, UpstreamClientError, scrubbed, scrubbed_error

KEPT = [
    "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.",
    "messages.0.content is required",
    "max_tokens must be at least 1, got -5",
    "model gpt-4.1 does not support tools; try Qwen2.5-7B-Instruct",
    "model Qwen2.5-Coder-32B-Instruct-GPTQ-Int4-Long-Context not found",
]
REMOVED = [
    ("see http://10.0.3.7:8000/v1/chat/completions", "10.0.3.7"),
    ("served by vllm-0.vllm.default.svc.cluster.local", "cluster.local"),
    ("on gpu-node-17:8000", "gpu-node-17"),
    ("at [fd00::1]:8000", "fd00::1"),
    ("Incorrect API key provided: sk-proj-abcdef123456", "sk-proj"),
    ("header was Bearer gwk-0123456789abcdef", "gwk-0123"),
    ('bad\nTraceback (most recent call last):\n  File "/srv/app.py", line 3, in f', "Traceback"),
    ("token 3f9a0c1e6b2d4a8f9e7c5b3a1d0f2e4c6b8a", "3f9a0c1e6b2d"),
]


@pytest.mark.parametrize("text", KEPT)
def test_what_the_client_needs_is_kept(text: str) -> None:
    assert scrubbed(text) == text


@pytest.mark.parametrize(("text", "secret"), REMOVED)
def test_addresses_keys_and_tracebacks_are_taken_out(text: str, secret: str) -> None:
    assert secret not in scrubbed(text)


def test_a_refusal_keeps_plain_codes_and_drops_the_rest() -> None:
    error = UpstreamClientError(
        400, "too long for http://h:1/x", code="context_length_exceeded", param="h.io:80"
    )
    assert error.body()["error"] == {
        "message": "too long for [url]",
        "type": "invalid_request_error",
        "param": None,
        "code": "context_length_exceeded",
    }
    assert scrubbed_error("a bare string at localhost:8000")["message"] == "a bare string at [host]"
    assert scrubbed_error({"message": 3, "code": 42, "type": ["x"]})["type"] == "upstream_error"


@given(st.text(max_size=3000))
def test_any_text_comes_out_bounded_and_without_a_traceback(text: str) -> None:
    out = scrubbed(text + '\nTraceback (most recent call last):\n  File "x", line 1')
    assert len(out) <= SCRUBBED_MAX_CHARS and "Traceback (most recent" not in out
