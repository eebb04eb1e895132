"""Privacy by default: what identifies a client's user or device (Anthropic ``metadata.user_id``, OpenAI
``user``, ``safety_identifier`` and ``metadata``, Codex ``client_metadata``) never reaches an upstream
unless that backend's policy says ``forward_user: true``; the ledger keeps a keyed hash of the user id
only when ``ledger.user: hashed`` asks. The upstreams are the emulators, which record every body they
receive (GET /emulator/requests)."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.measure.probes import PROBE_PROMPT
from gateway.policy.check import render_policy
from tests.conftest import PAID_KEY, Gateway, Upstreams, policy_yaml, running_gateway
from tests.servers import ThreadedServer, python_module
from tests.spend.conftest import ledger_rows
from tests.test_exchange import eventually

# What Claude Code sends: a JSON string holding its device and session ids; the user is the part
# without the session (keys sorted, as the Messages door writes it).
CLAUDE_USER_ID = json.dumps({"device_id": "d3v1ce-42", "account_uuid": "", "session_id": "5e55-10n"})
CLAUDE_USER = '{"account_uuid":"","device_id":"d3v1ce-42"}'
IDENTITY = {
    "user": "alice@example.com",
    "safety_identifier": "alice-hashed-by-the-app",
    "metadata": {"user_id": "alice", "team": "blue"},
}
IDENTIFYING = ("user", "safety_identifier", "metadata", "client_metadata", "prompt_cache_key")
HASH_KEY = "a-secret-the-operator-keeps"


@contextmanager
def gateway_with(
    upstreams: Upstreams,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    forward: bool = False,
    tail: str = "",
) -> Iterator[Gateway]:
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    text = policy_yaml(upstreams)
    if forward:  # the self-hosted pool may learn who asks; the paid API still may not
        text = text.replace(
            "    model: moonshotai/Kimi-K3\n", "    model: moonshotai/Kimi-K3\n    forward_user: true\n"
        )
    path = tmp_path / "policy.yaml"
    path.write_text(text + "ledger:\n  flush_interval_s: 0.05\n" + tail)
    with running_gateway(path) as gateway:
        yield gateway
    upstreams.reset()


def received(server: ThreadedServer) -> list[dict[str, Any]]:
    """The completion bodies an emulator received from clients, oldest first (not the gateway's own
    probes, which carry nothing of a client)."""
    entries = httpx.get(server.url + "/emulator/requests").json()
    bodies = [e["body"] for e in entries if e["path"].endswith(("/chat/completions", "/completions"))]
    return [body for body in bodies if PROBE_PROMPT not in json.dumps(body)]


def anthropic_message(gateway: Gateway, route: str, **extra: Any) -> httpx.Response:
    body = {
        "model": route,
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": CLAUDE_USER_ID},
        **extra,
    }
    return httpx.post(
        gateway.url + "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}, timeout=30
    )


def every_door(gateway: Gateway, route: str) -> None:
    """One request with identifying metadata through each door, streamed and not."""
    for stream in (False, True):
        assert anthropic_message(gateway, route, stream=stream).status_code == 200
        chat = {"model": route, "messages": [{"role": "user", "content": "hi"}], "stream": stream, **IDENTITY}
        chat["prompt_cache_key"] = "alice-conversation-1"  # OpenAI's replacement for `user`
        assert httpx.post(gateway.base_url + "/chat/completions", json=chat, timeout=30).status_code == 200
        completion = {"model": route, "prompt": "hi", "stream": stream, **IDENTITY}
        assert httpx.post(gateway.base_url + "/completions", json=completion, timeout=30).status_code == 200
        codex = {
            "model": route,
            "input": "hi",
            "stream": stream,
            "user": "alice",
            "client_metadata": {"installation_id": "inst-7"},
        }
        assert httpx.post(gateway.base_url + "/responses", json=codex, timeout=30).status_code == 200


def test_by_default_no_upstream_learns_who_asked(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with gateway_with(upstreams, tmp_path, monkeypatch) as gateway:
        for route, server in (("vllm-only", upstreams.vllm), ("paid-only", upstreams.paid)):
            every_door(gateway, route)
            bodies = received(server)
            assert len(bodies) == 8, f"{route}: every request reached its upstream"
            for body in bodies:
                assert not [name for name in IDENTIFYING if name in body], body
                assert "d3v1ce-42" not in json.dumps(body) and "alice" not in json.dumps(body)
        rows = ledger_rows(tmp_path / "ledger.sqlite3")
        assert {row["user_hash"] for row in rows} <= {None}, "no user in the ledger unless the policy asks"


def test_forward_user_sends_it_to_that_backend_only(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with gateway_with(upstreams, tmp_path, monkeypatch, forward=True) as gateway:
        assert anthropic_message(gateway, "vllm-only").status_code == 200
        (body,) = received(upstreams.vllm)
        assert body["user"] == CLAUDE_USER, "the user part of the Anthropic door's metadata.user_id"
        chat = {
            "model": "vllm-only",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            **IDENTITY,
            "prompt_cache_key": "alice-conversation-1",
        }
        assert httpx.post(gateway.base_url + "/chat/completions", json=chat, timeout=30).status_code == 200
        body = received(upstreams.vllm)[-1]
        assert {name: body[name] for name in IDENTITY} == IDENTITY
        assert body["prompt_cache_key"] == "alice-conversation-1", "forwarded like `user`"
        assert body["stream_options"] == {"include_usage": True}, "the rest of the body as before"
        # `gateway check` says which backends get the ids.
        checked = render_policy(gateway.runtime.policy).splitlines()
        assert [line for line in checked if "forward_user" in line and "b300-vllm" in line]
        assert not [line for line in checked if "forward_user" in line and "paid-api" in line]
        # The paid API is another backend: forward_user is off there, so it learns nothing.
        assert anthropic_message(gateway, "paid-only").status_code == 200
        (paid,) = received(upstreams.paid)
        assert not [name for name in IDENTIFYING if name in paid]


def test_ledger_user_hashed_keeps_a_keyed_hash_for_per_user_spend(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_USER_HASH_KEY", HASH_KEY)
    with gateway_with(upstreams, tmp_path, monkeypatch, tail="  user: hashed\n") as gateway:
        assert anthropic_message(gateway, "vllm-only").status_code == 200
        chat = {"model": "vllm-only", "messages": [{"role": "user", "content": "hi"}], "user": "alice"}
        for _ in range(2):
            assert (
                httpx.post(gateway.base_url + "/chat/completions", json=chat, timeout=30).status_code == 200
            )
        ledger = tmp_path / "ledger.sqlite3"
        eventually(lambda: len(ledger_rows(ledger)) == 3, 10, "three rows")
    alice = hmac.new(HASH_KEY.encode(), b"alice", hashlib.sha256).hexdigest()[:32]
    claude = hmac.new(HASH_KEY.encode(), CLAUDE_USER.encode(), hashlib.sha256).hexdigest()[:32]
    assert [row["user_hash"] for row in ledger_rows(ledger)] == [claude, alice, alice]
    assert b"alice" not in ledger.read_bytes() and b"d3v1ce-42" not in ledger.read_bytes()
    assert not [name for body in received(upstreams.vllm) for name in IDENTIFYING if name in body]
    result = subprocess.run(
        python_module("gateway", "spend", "--ledger", str(ledger), "--by", "user", "--format", "json"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    by_user = {row["user"]: row["requests"] for row in json.loads(result.stdout)["rows"]}
    assert by_user == {alice: 2, claude: 1}


def test_ledger_user_hashed_without_its_key_records_no_user_and_says_so(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "backends:\n  b:\n    dialect: vllm\n    url: http://127.0.0.1:1/v1\n    model: m\n"
        "    pricing: {per_token: {input_usd_per_mtok: 1, output_usd_per_mtok: 2}}\n"
        "routes:\n  r:\n    backends: [b]\n"
        "ledger:\n  user: hashed\n  user_hash_key_env: NO_SUCH_VARIABLE_HERE\n"
    )
    from gateway.policy.load import load_policy

    compiled = load_policy(str(policy))
    assert compiled.user_hash_key is None
    (warning,) = [w for w in compiled.warnings if "NO_SUCH_VARIABLE_HERE" in w]
    assert f"{policy}:11" in warning and "ledger.user" in warning and "no user is recorded" in warning


def recorded_claude_code(session: str | None = None) -> dict[str, Any]:
    """Claude Code's recorded first turn (tests/clients/fixtures), its session id replaced if asked."""
    fixture = json.loads(
        (Path(__file__).parent / "clients" / "fixtures" / "claude_code_first_turn.json").read_text()
    )
    body: dict[str, Any] = fixture["body"]
    if session is not None:
        user_id = json.loads(body["metadata"]["user_id"])
        body["metadata"]["user_id"] = json.dumps({**user_id, "session_id": session})
    return {**body, "model": "vllm-only", "stream": False}


def test_a_recorded_claude_code_session_keys_its_conversation_and_its_user_is_hashed_once(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session id in Claude Code's ``metadata.user_id`` reaches the prefix index as the conversation's
    key (cache-aware routing follows the session), and two sessions of one user are one user's spend."""
    monkeypatch.setenv("GATEWAY_USER_HASH_KEY", HASH_KEY)
    with gateway_with(upstreams, tmp_path, monkeypatch, tail="  user: hashed\n") as gateway:
        for session in (None, "11111111-2222-4333-8444-555555555555"):
            response = httpx.post(
                gateway.url + "/v1/messages",
                json=recorded_claude_code(session),
                headers={"anthropic-version": "2023-06-01"},
                timeout=60,
            )
            assert response.status_code == 200, response.text
        shelf = gateway.runtime.prefixes.index._shelves["b300-vllm"]
        assert {"00000000-0000-4000-8000-000000000000", "11111111-2222-4333-8444-555555555555"} <= set(
            shelf.clients
        )
        eventually(lambda: len(ledger_rows(tmp_path / "ledger.sqlite3")) == 2, 10, "two rows")
    user = '{"account_uuid":"","device_id":"' + "0" * 64 + '"}'
    expected = hmac.new(HASH_KEY.encode(), user.encode(), hashlib.sha256).hexdigest()[:32]
    assert [row["user_hash"] for row in ledger_rows(tmp_path / "ledger.sqlite3")] == [expected, expected]
    assert not [name for body in received(upstreams.vllm) for name in IDENTIFYING if name in body]
