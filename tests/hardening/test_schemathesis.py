"""schemathesis against a real gateway over the emulators, from the gateway's own /openapi.json, and the
regressions it (and the hypothesis properties) found, each over real HTTP.

The fuzz run is bounded (examples per operation and a time budget) so that it takes a minute or so on a
busy two-core machine; ``python -m bench.reliability.fuzz`` runs the long version.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from bench.reliability.fuzz import CHECKS, TRACEBACK, summarize
from gateway.values.auth import digest_of
from tests.conftest import PAID_KEY, Gateway, Upstreams, policy_yaml, running_gateway

ADMIN = "gwk-schemathesis-admin"
USER = "gwk-schemathesis-user"


@pytest.fixture
def keyed_gateway(upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    """Keys in the policy, so that the auth checks (ignored_auth, 401s described) have work to do."""
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    path = tmp_path / "policy.yaml"
    keys = f"""
auth:
  keys:
    - {{name: ops, sha256: {digest_of(ADMIN)}, admin: true}}
    - {{name: app, sha256: {digest_of(USER)}, routes: [kimi-k3]}}
"""
    path.write_text(policy_yaml(upstreams) + keys)
    with running_gateway(path) as gateway:
        yield gateway
    upstreams.reset()


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    found = []
    for record in caplog.records:
        text = record.getMessage() + (
            logging.Formatter().formatException(record.exc_info) if record.exc_info else ""
        )
        if record.exc_info or TRACEBACK.search(text):
            found.append(text[:2000])
    return found


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    keyed_gateway: Gateway, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    report = tmp_path / "report.json"
    argv = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{keyed_gateway.url}/openapi.json",
        "--header", f"Authorization: Bearer {ADMIN}", "--checks", CHECKS, "--mode", "all",
        "--phases", "coverage,fuzzing", "--max-examples", "8", "--seed", "1", "--max-time", "60",
        "--request-timeout", "30", "--workers", "1", "--suppress-health-check", "all", "--no-color",
        "--continue-on-failure", "--report", "json", "--report-json-path", str(report),
    ]  # fmt: skip
    env = {**os.environ, "SCHEMATHESIS_HOOKS": ""}
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert report.exists(), done.stdout[-3000:] + done.stderr[-2000:]
    summary = summarize(orjson.loads(report.read_bytes()))
    operations = orjson.loads(httpx.get(keyed_gateway.url + "/openapi.json", headers=auth()).content)["paths"]
    # Every operation schemathesis loaded was tested; loaded from a URL it counts one fewer than the
    # description lists (22 of 23, seen with schemathesis 4.32.5), so the bound allows that one.
    described = sum(len(item) for item in operations.values())
    assert summary["operations_tested"] == summary["operations_total"] >= described - 1
    assert summary["requests"] > 100
    assert summary["failures"] == 0, f"{summary['by_check']}\n{done.stdout[-6000:]}"
    assert not tracebacks(caplog)


def auth(key: str = ADMIN) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


# --- what the fuzzers found, each a 500 with a traceback before its fix --------------------------------

MESSAGE = [{"role": "user", "content": "hi"}]
DOOR_REGRESSIONS: list[tuple[str, dict[str, Any]]] = [
    (
        "/v1/messages",
        {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
    ),
    ("/v1/messages", {"max_tokens": 8, "messages": MESSAGE, "system": [{"type": "text", "text": None}]}),
    ("/v1/messages", {"max_tokens": 8, "messages": MESSAGE, "tools": 5}),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]}),
    ("/v1/responses", {"input": "hi", "tools": 5}),
]


@pytest.mark.parametrize(("path", "body"), DOOR_REGRESSIONS)
def test_a_door_refuses_a_field_of_the_wrong_type_with_a_400(
    keyed_gateway: Gateway, path: str, body: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    response = httpx.post(
        keyed_gateway.url + path, json={"model": "kimi-k3", **body}, headers=auth(USER), timeout=30
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert not tracebacks(caplog)


@pytest.mark.parametrize("value", ["1" + "0" * 30, "18446744073709551616", "²", "١٢"])
def test_explain_refuses_numbers_it_could_not_answer_with_a_400(
    keyed_gateway: Gateway, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    for name in ("prompt_tokens", "max_tokens"):
        params = {"model": "kimi-k3", name: value}
        response = httpx.get(keyed_gateway.url + "/admin/explain", params=params, headers=auth(), timeout=30)
        assert response.status_code == 400, response.text
        assert re.search(name, response.json()["error"]["message"])
    assert not tracebacks(caplog)


def test_a_policy_file_nested_too_deeply_is_rejected_and_the_running_policy_keeps_serving(
    keyed_gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    """ruamel parses nesting recursively; before, a RecursionError escaped the loader (a 500 here)."""
    caplog.set_level(logging.WARNING)
    good = keyed_gateway.policy_path.read_text()
    keyed_gateway.policy_path.write_text(good + "\nextra: " + "[" * 5000 + "]" * 5000 + "\n")
    response = httpx.post(keyed_gateway.url + "/admin/policy/reload", headers=auth(), timeout=30)
    assert response.status_code == 422, response.text
    assert "nested too deeply" in response.json()["error"]["message"]
    body = {"model": "kimi-k3", "messages": MESSAGE, "max_tokens": 4}
    served = httpx.post(keyed_gateway.url + "/v1/chat/completions", json=body, headers=auth(USER), timeout=30)
    assert served.status_code == 200, served.text
    assert not tracebacks(caplog)
