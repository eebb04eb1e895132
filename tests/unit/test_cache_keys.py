"""The client's own name for its conversation, as the recorded agents send it
(tests/clients/fixtures/): Codex's ``prompt_cache_key`` and ``session-id`` header, Claude Code's
session id inside ``metadata.user_id``; and short prompts left unkeyed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import orjson

from gateway.backends.continuation import continuation_body
from gateway.doors import ClientRequest
from gateway.doors.anthropic import MESSAGES
from gateway.doors.anthropic_identity import user_and_session
from gateway.request.cache_keys import client_key, keys_for
from gateway.request.privacy import take_identity
from tests.unit import factories
from tests.unit.factories import api_backend, policy, pool_backend, route

OPEN = policy([api_backend("api")], [route(("api",))])  # no keys: the fleet's scope

FIXTURES = Path(__file__).resolve().parents[1] / "clients" / "fixtures"


def recorded(name: str) -> tuple[dict[str, Any], list[tuple[bytes, bytes]]]:
    fixture = json.loads((FIXTURES / name).read_text())
    headers = [(k.lower().encode(), str(v).encode()) for k, v in fixture["headers"].items()]
    return fixture["body"], headers


def client(payload: dict[str, Any], prompt_tokens: int = 5000) -> ClientRequest:
    request = ClientRequest(payload, route(("api",)), True, True, prompt_tokens * 4, prompt_tokens, None)
    request.identity = take_identity(payload)
    return request


def test_codex_names_its_session_in_prompt_cache_key() -> None:
    body, headers = recorded("codex-0.171.0-kimi-k3.json")
    key = body["prompt_cache_key"]
    assert client_key(client(dict(body)), headers) == key
    del body["prompt_cache_key"]
    assert client_key(client(body), headers) == "01a23c16-d788-7630-8d7d-566d1d111387"  # session-id


def test_claude_code_names_its_session_in_its_metadata() -> None:
    """Read by the Messages door before the identity is taken out of the payload."""
    body, headers = recorded("claude_code_first_turn.json")
    policy = factories.policy([factories.api_backend("api")], [route(("api",))])
    parsed = MESSAGES.parse(json.dumps(body).encode(), policy, 4.0)
    parsed.identity = take_identity(parsed.payload)
    assert client_key(parsed, headers) == "00000000-0000-4000-8000-000000000000"
    assert parsed.identity["user"] == '{"account_uuid":"","device_id":"' + "0" * 64 + '"}'  # no session


def test_claude_code_1x_user_id_splits_too() -> None:
    user_id = "user_abc123_account_4f3e_session_9d8c-7b6a"
    assert user_and_session(user_id) == ("user_abc123_account_4f3e", "9d8c-7b6a")
    assert user_and_session("alice") == ("alice", None)
    assert user_and_session("{not json") == ("{not json", None)


def test_prompt_cache_key_is_taken_with_the_identity_and_still_keys_the_conversation() -> None:
    request = client({"messages": [], "prompt_cache_key": "conversation-7"})
    assert "prompt_cache_key" not in request.payload and request.identity == {
        "prompt_cache_key": "conversation-7"
    }
    assert client_key(request, []) == "conversation-7"


def test_a_session_header_names_it_for_other_clients() -> None:
    headers = [(b"x-claude-code-session-id", b"abc")]
    assert client_key(client({"messages": []}), headers) == "abc"
    assert client_key(client({"messages": []}), []) is None


def test_a_short_prompt_is_not_keyed() -> None:
    messages = [{"role": "user", "content": "hello " * 100}]
    assert not keys_for(client({"messages": messages}, prompt_tokens=150), [], OPEN, None).hashes
    assert keys_for(client({"messages": messages * 40}, prompt_tokens=6000), [], OPEN, None).hashes


def test_a_resumed_stream_keeps_its_salt_and_only_salting_engines_get_one() -> None:
    """The continuation of a cut stream goes to a backend in the same cache scope: with the salt for
    vLLM and SGLang, without it for llama-server and a paid API (which would refuse it)."""
    payload = {"model": "kimi-k3", "messages": [{"role": "user", "content": "go"}], "cache_salt": "client's"}
    for dialect, salted in (("vllm", True), ("sglang", True), ("llamacpp", False), ("openai", False)):
        backend = dataclasses.replace(pool_backend("b"), dialect=dialect)
        body = orjson.loads(continuation_body(payload, backend, "half an ans", "", 100, 3, "scope-salt"))
        assert body.get("cache_salt") == ("scope-salt" if salted else "client's"), dialect
