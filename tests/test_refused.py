"""Refused requests are visible: a request the gateway turns away through any door (bad JSON, unknown
model, a door's 400, no or a wrong key, a forbidden route, a body too large, a rate limit) gets a ledger
row with status ``refused``, its reason, its route and key when known; a log line at info; a count by
reason in /metrics; and shows in `gateway spend` and the dashboard's data."""

from __future__ import annotations

import json
import logging
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.values.auth import digest_of
from tests.conftest import PAID_KEY, Gateway, Upstreams, policy_yaml, running_gateway
from tests.servers import python_module
from tests.spend.conftest import ledger_rows
from tests.test_exchange import eventually

TEAM_KEY = "gwk-team-0123456789abcdefghijklmnopqrstuvwxyzABCD"
OPS_KEY = "gwk-ops-0123456789abcdefghijklmnopqrstuvwxyzABCDE"
LIMITED_KEY = "gwk-limited-0123456789abcdefghijklmnopqrstuvwxyzAB"
POLICY_TAIL = f"""
auth:
  keys:
    - {{name: team-a, sha256: {digest_of(TEAM_KEY)}, routes: [vllm-only]}}
    - {{name: ops, sha256: {digest_of(OPS_KEY)}, admin: true}}
    - {{name: limited, sha256: {digest_of(LIMITED_KEY)}, rate_limit: {{requests_per_minute: 1}}}}
server:
  max_body_bytes: 4096
ledger:
  flush_interval_s: 0.05
"""
HELLO = [{"role": "user", "content": "hi"}]
TEAM = {"authorization": f"Bearer {TEAM_KEY}"}


@pytest.fixture
def guarded(upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(upstreams) + POLICY_TAIL)
    with running_gateway(path) as gateway:
        yield gateway
    upstreams.reset()


def send(gateway: Gateway, path: str, request_id: str, body: Any, **headers: str) -> httpx.Response:
    """POST ``body`` (bytes as they are, else JSON) with our own request id, so its row can be found."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", "x-request-id": request_id, **headers}
    return httpx.post(gateway.base_url + path, content=content, headers=headers, timeout=30)


# request id -> (door path, body, headers, HTTP status, reason, route in the row, key in the row)
REFUSALS: dict[str, tuple[str, Any, dict[str, str], int, str, str, str | None]] = {
    "chat-bad-json": (
        "/chat/completions",
        b'{"model": "vllm-only", ',
        TEAM,
        400,
        "invalid_json",
        "",
        "team-a",
    ),
    "chat-unknown-model": (
        "/chat/completions",
        {"model": "claude-opus-4-8", "messages": HELLO},
        TEAM,
        404,
        "model_not_found",
        "",
        "team-a",
    ),
    "chat-no-messages": (
        "/chat/completions",
        {"model": "vllm-only", "messages": []},
        TEAM,
        400,
        "invalid_request_error",
        "vllm-only",
        "team-a",
    ),
    "chat-no-key": (
        "/chat/completions",
        {"model": "vllm-only", "messages": HELLO},
        {},
        401,
        "invalid_api_key",
        "",
        None,
    ),
    "chat-forbidden-route": (
        "/chat/completions",
        {"model": "paid-only", "messages": HELLO},
        TEAM,
        403,
        "route_not_allowed",
        "paid-only",
        "team-a",
    ),
    "chat-too-large": (
        "/chat/completions",
        {"model": "vllm-only", "messages": [{"role": "user", "content": "x" * 5000}]},
        TEAM,
        413,
        "request_too_large",
        "",
        "team-a",
    ),
    "completions-no-prompt": (
        "/completions",
        {"model": "vllm-only"},
        TEAM,
        400,
        "invalid_request_error",
        "vllm-only",
        "team-a",
    ),
    "messages-no-max-tokens": (
        "/messages",
        {"model": "vllm-only", "messages": HELLO},
        TEAM,
        400,
        "invalid_request_error",
        "vllm-only",
        "team-a",
    ),
    "messages-bad-json": ("/messages", b"not json", TEAM, 400, "invalid_json", "", "team-a"),
    "responses-no-input": (
        "/responses",
        {"model": "vllm-only"},
        TEAM,
        400,
        "invalid_request_error",
        "vllm-only",
        "team-a",
    ),
    "embeddings-unknown-model": (
        "/embeddings",
        {"model": "nope", "input": "hi"},
        TEAM,
        404,
        "model_not_found",
        "",
        "team-a",
    ),
}


def test_every_doors_refusals_get_a_ledger_row_a_log_line_and_a_count(
    guarded: Gateway, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
    for request_id, (path, body, headers, status, *_) in REFUSALS.items():
        response = send(guarded, path, request_id, body, **headers)
        assert response.status_code == status, (request_id, response.text)
        if path == "/messages":  # each door keeps its own error shape
            assert response.json()["type"] == "error", response.text
        else:
            assert "error" in response.json(), response.text
    # A rate limit's refusal: the key's one request a minute is served, the next is turned away.
    limited = {"authorization": f"Bearer {LIMITED_KEY}"}
    assert (
        send(
            guarded, "/chat/completions", "limited-1", {"model": "vllm-only", "messages": HELLO}, **limited
        ).status_code
        == 200
    )
    assert (
        send(
            guarded, "/chat/completions", "limited-2", {"model": "vllm-only", "messages": HELLO}, **limited
        ).status_code
        == 429
    )
    expected = {rid: (reason, route, key) for rid, (_, _, _, _, reason, route, key) in REFUSALS.items()}
    expected["limited-2"] = ("rate_limit_exceeded", "vllm-only", "limited")

    ledger = tmp_path / "ledger.sqlite3"
    eventually(lambda: len(ledger_rows(ledger)) == len(expected) + 1, 10, "every request's row")
    rows = {row["request_id"]: row for row in ledger_rows(ledger)}
    assert rows["limited-1"]["status"] == "ok"
    for request_id, (reason, route, key) in expected.items():
        row = rows[request_id]
        got = (row["status"], row["error_type"], row["route"], row["api_key_name"], row["attempts"])
        assert got == ("refused", reason, route, key, 0), request_id
        assert row["cost_usd"] == 0 and row["backend"] is None
    assert {rows[rid]["endpoint"] for rid in ("messages-bad-json", "responses-no-input")} == {
        "messages",
        "responses",
    }

    # One log line at info per refusal, with its request id and reason.
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.INFO and "refused request" in r.getMessage()
    ]
    for request_id, (reason, route, _) in expected.items():
        (line,) = [line for line in lines if f"refused request {request_id}:" in line]
        assert f": {reason} (" in line and f"route {route or '-'}," in line
    assert TEAM_KEY not in caplog.text and LIMITED_KEY not in caplog.text, "a key never reaches the log"

    # The metric, by reason.
    exposition = httpx.get(guarded.url + "/metrics", headers={"authorization": f"Bearer {OPS_KEY}"}).text
    counts = {reason: 0 for reason, _, _ in expected.values()}
    for reason, _, _ in expected.values():
        counts[reason] += 1
    for reason, count in counts.items():
        assert f'gateway_refused_requests_total{{reason="{reason}"}} {count}.0' in exposition, reason

    # The dashboard's data: refused, by reason (from the ledger), and no route named "".
    data = httpx.get(guarded.url + "/dashboard/data", headers={"authorization": f"Bearer {OPS_KEY}"}).json()
    assert {r["reason"]: r["requests"] for r in data["refused"]} == counts
    assert "" not in {r["route"] for r in data["routes"]}
    by_route = {r["route"]: r for r in data["routes"]}
    assert by_route["vllm-only"]["refused_today"] == sum(
        1 for _, route, _ in expected.values() if route == "vllm-only"
    )

    # gateway spend: a refused column, and the refusals by reason, in JSON and in the table.
    report = json.loads(spend("--ledger", str(ledger), "--format", "json").stdout)
    assert {r["reason"]: r["requests"] for r in report["refused"]} == counts
    rows_by_route = {r["route"]: r for r in report["rows"]}
    assert rows_by_route["(none)"]["refused"] == sum(1 for _, route, _ in expected.values() if not route)
    table = spend("--ledger", str(ledger)).stdout
    (line,) = [line for line in table.splitlines() if line.startswith("refused, by reason:")]
    assert all(re.search(rf"\b{reason} {count}\b", line) for reason, count in counts.items()), line


def spend(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        python_module("gateway", "spend", "--since", "1h", *args), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result


def test_refused_rows_reach_a_postgresql_ledger_and_its_reports(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_url: str
) -> None:
    """The fleet's ledger takes refused rows alike: a route-less one, one with its route and key."""
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(upstreams) + POLICY_TAIL)
    with running_gateway(path, ledger_path=postgres_url) as gateway:
        assert send(gateway, "/messages", "pg-bad-json", b"{", **TEAM).status_code == 400
        forbidden = {"model": "paid-only", "input": "hi"}
        assert send(gateway, "/responses", "pg-forbidden", forbidden, **TEAM).status_code == 403
        assert gateway.runtime.ledger.rows_appended == 2
        eventually(lambda: gateway.runtime.ledger.rows_written == 2, 10, "both rows written")
    import psycopg

    with psycopg.connect(postgres_url) as conn:
        query = (
            "SELECT request_id, status, error_type, route, api_key_name, endpoint FROM requests ORDER BY id"
        )
        rows = conn.execute(query).fetchall()
    assert rows == [
        ("pg-bad-json", "refused", "invalid_json", "", "team-a", "messages"),
        ("pg-forbidden", "refused", "route_not_allowed", "paid-only", "team-a", "responses"),
    ]
    report = json.loads(spend("--ledger", postgres_url, "--format", "json").stdout)
    assert report["refused"] == [
        {"reason": "invalid_json", "requests": 1},
        {"reason": "route_not_allowed", "requests": 1},
    ]
    assert {r["route"]: r["refused"] for r in report["rows"]} == {"(none)": 1, "paid-only": 1}


def test_token_counts_take_a_rate_window_of_their_own(guarded: Gateway) -> None:
    """``/v1/messages/count_tokens`` under the key's requests per minute, in a window apart from its
    messages (as Anthropic limits counting): before, a key could count without limit."""
    limited = {"authorization": f"Bearer {LIMITED_KEY}"}
    body = {"model": "vllm-only", "messages": HELLO}
    first = send(guarded, "/messages/count_tokens", "count-1", body, **limited)
    assert first.status_code == 200 and first.json()["input_tokens"] > 0, first.text
    second = send(guarded, "/messages/count_tokens", "count-2", body, **limited)
    assert second.status_code == 429, second.text
    assert second.json()["type"] == "error" and second.json()["error"]["type"] == "rate_limit_error"
    assert int(second.headers["retry-after"]) >= 1
    # The counts took nothing from the key's messages: its one request a minute is still there.
    message = send(guarded, "/messages", "limited-message", {**body, "max_tokens": 20}, **limited)
    assert message.status_code == 200, message.text
    # A key without a limit counts as before.
    for n in range(3):
        assert send(guarded, "/messages/count_tokens", f"team-{n}", body, **TEAM).status_code == 200
