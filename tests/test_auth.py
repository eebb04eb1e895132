"""Who may call what: API keys, route permissions, admin access, and secrets that never leak."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.values.auth import digest_of
from tests.conftest import PAID_KEY, Gateway, Upstreams, policy_yaml, running_gateway

TEAM_KEY = "gwk-team-a-0123456789abcdefghijklmnopqrstuvwxyz"
OPS_KEY = "gwk-ops-0123456789abcdefghijklmnopqrstuvwxyzABCD"
HELLO = [{"role": "user", "content": "hi"}]
AUTH = f"""
auth:
  keys:
    - {{name: team-a, sha256: {digest_of(TEAM_KEY)}, routes: [vllm-only, paid-only]}}
    - {{name: ops, sha256: {digest_of(OPS_KEY)}, admin: true}}
"""


@pytest.fixture
def guarded(upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(upstreams) + AUTH)
    with running_gateway(path) as gateway:
        yield gateway
    upstreams.reset()


def chat(gateway: Gateway, model: str = "vllm-only", **headers: str) -> httpx.Response:
    body = {"model": model, "messages": HELLO}
    return httpx.post(gateway.base_url + "/chat/completions", json=body, headers=headers, timeout=30)


def upstream_count(upstreams: Upstreams) -> int:
    """Completion requests the emulators received (their load-signal scrapes are recorded too)."""
    return sum(
        entry["path"].endswith("completions")
        for server in upstreams.all().values()
        for entry in httpx.get(server.url + "/emulator/requests").json()
    )


def test_missing_or_wrong_key_is_401_and_never_goes_upstream(guarded: Gateway, upstreams: Upstreams) -> None:
    before = upstream_count(upstreams)
    for headers in (
        {},
        {"authorization": "Bearer gwk-wrong"},
        {"x-api-key": "gwk-wrong"},
        {"authorization": "Basic x"},
    ):
        response = chat(guarded, **headers)
        assert response.status_code == 401
        error = response.json()["error"]
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
        assert "gwk-wrong" not in response.text, "a presented key is never echoed"
    assert upstream_count(upstreams) == before
    refusals = guarded.runtime.errors_returned
    assert refusals[("gateway", "invalid_api_key")] == 4


def test_a_valid_key_by_either_header_is_served(guarded: Gateway) -> None:
    assert chat(guarded, authorization=f"Bearer {TEAM_KEY}").status_code == 200
    assert chat(guarded, **{"x-api-key": TEAM_KEY}).status_code == 200
    client = openai.OpenAI(base_url=guarded.base_url, api_key=TEAM_KEY, max_retries=0)
    assert client.chat.completions.create(model="paid-only", messages=HELLO).choices[0].message.content  # type: ignore[arg-type]
    assert guarded.runtime.recent[-1].api_key_name == "team-a"


def test_a_route_the_key_may_not_use_is_403(guarded: Gateway, upstreams: Upstreams) -> None:
    before = upstream_count(upstreams)
    response = chat(guarded, "kimi-k3", authorization=f"Bearer {TEAM_KEY}")
    assert response.status_code == 403
    assert response.json()["error"]["type"] == "permission_error"
    assert upstream_count(upstreams) == before
    assert guarded.runtime.errors_returned[("gateway", "route_not_allowed")] == 1
    models = httpx.get(guarded.base_url + "/models", headers={"authorization": f"Bearer {TEAM_KEY}"}).json()
    assert {m["id"] for m in models["data"]} == {"vllm-only", "paid-only"}


def test_admin_surfaces_need_an_admin_key(guarded: Gateway) -> None:
    for path in ("/admin/policy", "/admin/backends", "/admin/explain?model=kimi-k3"):
        assert httpx.get(guarded.url + path).status_code == 401
        assert (
            httpx.get(guarded.url + path, headers={"authorization": f"Bearer {TEAM_KEY}"}).status_code == 403
        )
        assert (
            httpx.get(guarded.url + path, headers={"authorization": f"Bearer {OPS_KEY}"}).status_code == 200
        )
    assert httpx.post(guarded.url + "/admin/policy/reload").status_code == 401
    assert httpx.get(guarded.url + "/health").status_code == 200, "probes stay open"


def test_client_headers_that_look_like_the_gateways_are_ignored(
    guarded: Gateway, upstreams: Upstreams
) -> None:
    spoofed = {"x-gateway-backend": "a100-llamacpp", "x-gateway-route": "kimi-k3", "x-gateway-decision": "x"}
    response = chat(guarded, "vllm-only", authorization=f"Bearer {TEAM_KEY}", **spoofed)
    assert response.headers["x-gateway-backend"] == "b300-vllm"
    assert response.headers["x-gateway-route"] == "vllm-only"
    sent = httpx.get(upstreams.vllm.url + "/emulator/requests").json()[-1]["headers"]
    assert not any(name.lower().startswith("x-gateway") for name in sent)
    assert "authorization" not in {name.lower() for name in sent}, "the client's key never goes upstream"


def test_no_secret_in_logs_headers_errors_or_observations(
    guarded: Gateway, upstreams: Upstreams, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    for key in (TEAM_KEY, OPS_KEY, "gwk-wrong-but-secret"):
        for model in ("vllm-only", "paid-only", "kimi-k3", "unknown-model"):
            response = chat(guarded, model, authorization=f"Bearer {key}")
            seen += [response.text, *(f"{k}: {v}" for k, v in response.headers.items())]
    httpx.post(upstreams.paid.url + "/emulator/faults", json={"error_rate": 1.0})
    failed = chat(guarded, "paid-only", authorization=f"Bearer {TEAM_KEY}")
    assert failed.status_code == 502
    seen += [failed.text, *(f"{k}: {v}" for k, v in failed.headers.items())]
    seen += [record.getMessage() for record in caplog.records]
    seen += [repr(observation) for observation in guarded.runtime.recent]
    seen += [httpx.get(guarded.url + "/admin/policy", headers={"x-api-key": OPS_KEY}).text]
    seen += [httpx.get(guarded.url + "/admin/backends", headers={"x-api-key": OPS_KEY}).text]
    text = "\n".join(seen)
    for secret in (TEAM_KEY, OPS_KEY, "gwk-wrong-but-secret", PAID_KEY):
        assert secret not in text
    for server in upstreams.all().values():
        assert server.url not in failed.text, "internal URLs never reach clients"


def test_non_loopback_without_keys_refuses_to_start(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 2
    assert "no API keys" in result.stderr and "--open" in result.stderr


def test_beyond_loopback_a_policy_that_loses_its_keys_fails_closed(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(upstreams))
    with running_gateway(path, require_keys=True) as gateway:
        response: Any = chat(gateway)
        assert response.status_code == 401


def test_a_key_budget_caps_that_keys_spend(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capped_key = "gwk-capped-0123456789abcdefghijklmnopqrstuvwxyz"
    keys = f"""
auth:
  keys:
    - {{name: capped, sha256: {digest_of(capped_key)}, budgets: {{per_day_usd: 0.005}}}}
    - {{name: team-a, sha256: {digest_of(TEAM_KEY)}}}
"""
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(upstreams) + keys)
    body = {"model": "paid-only", "messages": HELLO, "max_tokens": 100}
    with running_gateway(path) as gateway:
        url = gateway.base_url + "/chat/completions"
        statuses = []
        for _ in range(8):
            response = httpx.post(url, json=body, headers={"x-api-key": capped_key}, timeout=30)
            statuses.append(response.status_code)
            if response.status_code == 429:
                error = response.json()["error"]
                assert error["code"] == "budget_exhausted" and "key 'capped'" in error["message"]
        assert statuses[0] == 200 and 429 in statuses, statuses
        assert httpx.post(url, json=body, headers={"x-api-key": TEAM_KEY}, timeout=30).status_code == 200
        spent = sum(o.cost_usd or 0.0 for o in gateway.runtime.recent if o.api_key_name == "capped")
        assert spent <= 0.005


@pytest.mark.parametrize("workers", [1, 2])
def test_metrics_on_their_own_port_need_no_key(upstreams: Upstreams, tmp_path: Path, workers: int) -> None:
    from tests.servers import ProcessServer, free_port, python_module, wait_http

    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(upstreams) + AUTH)
    port, metrics_port = free_port(), free_port()
    args = ["serve", "--policy", str(path), "--port", str(port), "--metrics-port", str(metrics_port)]
    args += ["--workers", str(workers), "--ledger", str(tmp_path / "ledger.sqlite3")]
    gateway = ProcessServer(python_module("gateway", *args), env={"TEST_PAID_API_KEY": PAID_KEY}).start()
    try:
        wait_http(f"http://127.0.0.1:{metrics_port}/metrics", timeout=60)
        wait_http(f"http://127.0.0.1:{port}/health", timeout=60)
        body = {"model": "paid-only", "messages": HELLO}
        headers = {"authorization": f"Bearer {TEAM_KEY}"}
        assert (
            httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=headers).status_code
            == 200
        )
        exposition = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert "gateway_requests_total" in exposition
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 401, (
            "the API port still wants a key"
        )
        elsewhere = httpx.post(
            f"http://127.0.0.1:{metrics_port}/v1/chat/completions", json=body, headers=headers
        )
        assert elsewhere.status_code in (404, 405), "the metrics port serves nothing else"
    finally:
        assert gateway.stop() == 0
