"""Tenants cannot see each other through the prefix cache (issue 41): on a route two API keys use, what
a caller is told of cached prompts (x-gateway-expected-cached-tokens, x-gateway-decision,
/admin/explain) counts only its own key's prompts, and the engine itself is asked to keep the keys'
caches apart (vLLM's ``cache_salt``, honoured by the emulator as vLLM does), so its TTFT tells nothing
either. A route that opts into sharing (``prefix_cache: {share: fleet}``) shares both again."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.values.auth import digest_of
from tests.conftest import PAID_KEY, Gateway, Upstreams, policy_yaml, running_gateway

ALICE = "gwk-alice-0123456789abcdefghijklmnopqrstuvwxyz"
BOB = "gwk-bob-0123456789abcdefghijklmnopqrstuvwxyzAB"
OPS = "gwk-ops-0123456789abcdefghijklmnopqrstuvwxyzABCD"
ROUTES = """
  pool:
    backends: [b300-vllm]
    exploration: 0
  shared-pool:
    backends: [b300-vllm]
    exploration: 0
    prefix_cache: {share: fleet}
  paid-only:
    backends: [paid-api]
"""
AUTH = f"""
auth:
  keys:
    - {{name: alice, sha256: {digest_of(ALICE)}, routes: [pool, shared-pool, paid-only]}}
    - {{name: bob, sha256: {digest_of(BOB)}, routes: [pool, shared-pool, paid-only]}}
    - {{name: ops, sha256: {digest_of(OPS)}, admin: true}}
"""


@pytest.fixture
def tenants(upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(upstreams, ROUTES) + AUTH)
    with running_gateway(path) as gateway:
        yield gateway
    upstreams.reset()


def memo() -> list[dict[str, str]]:
    """Bob's confidential memo as a system prompt of ~2,000 tokens, new to the emulator's cache."""
    system = f"Confidential merger memo {uuid.uuid4()}: Northwind buys Contoso for $4.2B. " + (
        "The deal team alone may read this. " * 220
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": "Summarise the memo."}]


def send(gateway: Gateway, key: str, messages: list[dict[str, str]], route: str = "pool") -> httpx.Response:
    body = {"model": route, "messages": messages, "max_tokens": 8}
    headers = {"authorization": f"Bearer {key}", "session-id": "memo-session"}
    response = httpx.post(gateway.base_url + "/chat/completions", json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response


def told(response: httpx.Response) -> tuple[int, str]:
    """What the caller was told: the expected cached tokens, and the decision's text."""
    return int(response.headers["x-gateway-expected-cached-tokens"]), response.headers["x-gateway-decision"]


def engine_cached(response: httpx.Response) -> int:
    cached: int = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    return cached


def sent_upstream(server: Any) -> list[dict[str, Any]]:
    """The memo's requests as the emulator received them (the gateway's own probes left out)."""
    return [
        entry["body"]
        for entry in httpx.get(server.url + "/emulator/requests").json()
        if entry["path"].endswith("completions") and "memo" in str(entry["body"].get("messages"))
    ]


def explain(gateway: Gateway, caller: str, **params: str) -> httpx.Response:
    query = {"model": "pool", "prompt_tokens": "2500", "cache_key": "memo-session", **params}
    headers = {"authorization": f"Bearer {caller}"}
    return httpx.get(gateway.url + "/admin/explain", params=query, headers=headers, timeout=10)


def test_bobs_prompt_is_never_reported_cached_to_alice(tenants: Gateway, upstreams: Upstreams) -> None:
    messages = memo()
    first = send(tenants, BOB, messages)
    assert told(first)[0] == 0
    again = send(tenants, BOB, messages)  # bob is told of his own prompt, and the engine reuses it
    expected, decision = told(again)
    assert expected > 1024 and f"expected cache hit {expected} tokens" in decision
    assert engine_cached(again) > 1024

    # /admin/explain of bob's session id: not alice's to call; an admin sees each key's own view.
    assert explain(tenants, ALICE).status_code == 403
    as_alice = explain(tenants, OPS, key="alice").json()
    as_bob = explain(tenants, OPS, key="bob").json()
    assert as_alice["cache_scope"] == "key:alice" and as_bob["cache_scope"] == "key:bob"
    held = {c["backend"]: c["expected_cached_tokens"] for c in as_bob["candidates"]}
    assert held["b300-vllm"] > 1024
    assert all(c["expected_cached_tokens"] == 0 for c in as_alice["candidates"])
    assert all(c["expected_cached_tokens"] == 0 for c in explain(tenants, OPS).json()["candidates"])
    assert explain(tenants, OPS, key="mallory").status_code == 400

    alice = send(tenants, ALICE, messages)  # the same prompt, the same session id: nothing of bob's
    expected, decision = told(alice)
    assert expected == 0 and "expected cache hit" not in decision
    assert engine_cached(alice) == 0  # the engine did not reuse bob's blocks: no TTFT channel either
    assert told(send(tenants, ALICE, messages))[0] > 1024  # her own prompt, once sent, is hers

    # Every request to the pool carried its key's salt: one per key, never the same.
    salts = [body.get("cache_salt") for body in sent_upstream(upstreams.vllm)]
    assert len(salts) == 4 and all(isinstance(s, str) and len(s) >= 32 for s in salts)
    assert salts[0] == salts[1] and salts[2] == salts[3] and salts[0] != salts[2]


def test_a_route_that_opts_into_sharing_shares(tenants: Gateway, upstreams: Upstreams) -> None:
    messages = memo()
    send(tenants, BOB, messages, route="shared-pool")
    alice = send(tenants, ALICE, messages, route="shared-pool")
    assert told(alice)[0] > 1024 and engine_cached(alice) > 1024
    assert all("cache_salt" not in body for body in sent_upstream(upstreams.vllm))


def test_a_paid_api_is_never_sent_a_salt(tenants: Gateway, upstreams: Upstreams) -> None:
    send(tenants, BOB, memo(), route="paid-only")
    bodies = sent_upstream(upstreams.paid)
    assert bodies and all("cache_salt" not in body for body in bodies)
