"""Nothing about the upstreams leaks to clients: no response header of any endpoint (answers, errors,
streams cut mid-way) names an upstream host or carries a backend credential, and the request log holds
no prompt text, even for a request whose upstream fails."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.routing import Mount, Route

from gateway.api import admin, dashboard, openai
from gateway.request.auth import policy_line
from tests.conftest import PAID_KEY, Gateway, Upstreams, running_gateway

DEAD_HOST = "upstream-host-a7c3e1.invalid"  # never resolves: every attempt there fails
ADMIN_KEY = "sk-leak-test-admin-key-0123456789"
PROMPT = "the-prompt-text-that-must-not-be-logged-5b8d"


@pytest.fixture
def leaky(upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    path = tmp_path / "policy.yaml"
    path.write_text(f"""
backends:
  dead:
    dialect: vllm
    url: http://{DEAD_HOST}:8000/v1
    model: m
    pricing: {{gpu_hours: {{usd_per_hour: 1.0}}}}
    signals: {{metrics_url: http://{DEAD_HOST}:8000/metrics, health_url: http://{DEAD_HOST}:8000/health}}
    timeouts: {{first_byte_s: 2, idle_s: 1}}
  paid-api:
    dialect: openai
    url: {upstreams.paid.url}/v1
    model: kimi-k3
    api_key_env: TEST_PAID_API_KEY
    pricing: {{per_token: {{input_usd_per_mtok: 0.6, output_usd_per_mtok: 15}}}}
    timeouts: {{first_byte_s: 5, idle_s: 1}}
routes:
  kimi-k3:
    backends: [dead, paid-api]
    exploration: 0
  dead-only:
    backends: [dead]
  paid-only:
    backends: [paid-api]
    fallback: {{max_attempts: 1}}
auth:
  keys:
    {policy_line("ops", ADMIN_KEY, routes=[], admin=True)}
""")
    with running_gateway(path) as gateway:
        yield gateway
    upstreams.reset()


def secrets(upstreams: Upstreams) -> list[str]:
    hosts = [DEAD_HOST, upstreams.paid.url.split("//")[1]]  # host:port, never a bare number
    return [PAID_KEY, ADMIN_KEY, *hosts]


def leaks(response: httpx.Response, upstreams: Upstreams) -> list[str]:
    raw = "\n".join(f"{k}: {v}" for k, v in response.headers.multi_items())
    return [s for s in secrets(upstreams) if s.lower() in raw.lower()]


def chat(route: str, stream: bool) -> dict[str, object]:
    return {
        "model": route,
        "stream": stream,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 20,
    }


def every_get_path() -> list[str]:
    paths = [r.path for r in (*openai.routes, *admin.routes, *dashboard.routes) if isinstance(r, Route)]
    gets = [
        r.path
        for r in (*openai.routes, *admin.routes, *dashboard.routes)
        if isinstance(r, Route) and "GET" in (r.methods or ())
    ]
    statics = [f"{r.path}/dashboard.js" for r in dashboard.routes if isinstance(r, Mount)]
    assert len(paths) > 10
    return [*gets, *statics, "/no-such-path", "/admin/explain?route=kimi-k3"]


def test_no_response_header_names_an_upstream_or_carries_a_credential(
    leaky: Gateway, upstreams: Upstreams, caplog: pytest.LogCaptureFixture
) -> None:
    auth = {"authorization": f"Bearer {ADMIN_KEY}"}
    seen: list[tuple[str, int]] = []
    caplog.set_level(logging.DEBUG)
    with httpx.Client(base_url=leaky.url, timeout=30) as client:
        responses = [client.get(path, headers=auth) for path in every_get_path()]
        responses += [client.get("/admin/policy")]  # no key: an error answer
        responses.append(client.post("/admin/policy/reload", headers=auth))
        for endpoint in ("/v1/chat/completions", "/chat/completions"):
            for route in ("kimi-k3", "dead-only", "paid-only", "no-such-route"):
                for stream in (False, True):
                    responses.append(client.post(endpoint, json=chat(route, stream), headers=auth))
        responses.append(client.post("/v1/chat/completions", content=b"{not json", headers=auth))
        responses.append(
            client.post("/v1/completions", json={"model": "dead-only", "prompt": PROMPT}, headers=auth)
        )
        # A stream the upstream cuts after its first frames: the client gets an SSE error event.
        httpx.post(upstreams.paid.url + "/emulator/faults", json={"drop_after_chunks": 2})
        with client.stream("POST", "/v1/chat/completions", json=chat("paid-only", True), headers=auth) as cut:
            body = cut.read().decode()
            responses.append(cut)
        assert cut.status_code == 200 and '"error"' in body, body
        assert not [s for s in secrets(upstreams) if s in body], body
    for response in responses:
        seen.append((str(response.request.url.path), response.status_code))
        assert not leaks(response, upstreams), (response.request.url, dict(response.headers))
        # Bodies too, but for the admin's own views, which show the backends' URLs to an admin key.
        if not response.request.url.path.startswith(("/admin", "/dashboard", "/metrics")):
            body_text = response.read().decode(errors="replace")
            assert not [s for s in secrets(upstreams) if s in body_text], (
                response.request.url,
                body_text[:300],
            )
    statuses = {status for _, status in seen}
    assert {200, 401, 404, 400} <= statuses, seen
    assert any(status >= 500 for _, status in seen), "some answer must be an upstream failure"
    # The request log of all that, failures included, never holds the prompt.
    assert caplog.records, "the failing requests logged something"
    assert not [r for r in caplog.records if PROMPT in r.getMessage()]
