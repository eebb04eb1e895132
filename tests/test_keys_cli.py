"""`gateway keys`: `create` prints a whole `auth:` block that pastes into a policy without one and
works; `list` shows names, routes, admin, limits and budgets, never a digest in full."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.values.auth import digest_of
from tests.conftest import PAID_KEY, Upstreams, policy_yaml, running_gateway

HELLO = [{"role": "user", "content": "hi"}]


def gateway_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args], capture_output=True, text=True, check=False, timeout=60
    )


def test_the_printed_auth_block_pastes_into_a_policy_without_one_and_the_key_works(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = gateway_command("keys", "create", "ci-bot", "--routes", "vllm-only")
    assert created.returncode == 0, created.stderr
    key = re.search(r"^  (gwk-\S+)$", created.stdout, re.MULTILINE)
    assert key is not None
    block = created.stdout.split("\n\nauth:\n", 1)[1].split("\n\n", 1)[0]
    policy = tmp_path / "policy.yaml"
    text = policy_yaml(upstreams)
    assert "auth:" not in text
    policy.write_text(text + "auth:\n" + block + "\n")
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    checked = gateway_command("check", str(policy))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    upstreams.reset()
    with running_gateway(policy) as gateway:
        url = gateway.base_url + "/chat/completions"

        def chat(model: str, headers: dict[str, str]) -> int:
            body = {"model": model, "messages": HELLO}
            return httpx.post(url, json=body, headers=headers, timeout=30).status_code

        bearer = {"authorization": f"Bearer {key.group(1)}"}
        assert chat("vllm-only", bearer) == 200
        assert chat("paid-only", bearer) == 403, "only the routes it was created for"
        assert chat("vllm-only", {}) == 401
    upstreams.reset()


def test_list_shows_names_routes_admin_limits_and_budgets_but_no_full_digest(tmp_path: Path) -> None:
    alice, ops = (
        "gwk-alice-0123456789abcdefghijklmnopqrstuvwxyzAB",
        "gwk-ops-0123456789abcdefghijklmnopqrstuvwxyzABCD",
    )
    policy = tmp_path / "policy.yaml"
    default = (Path(__file__).resolve().parent.parent / "policies" / "default.yaml").read_text()
    policy.write_text(
        default
        + f"""
auth:
  keys:
    - name: alice
      sha256: {digest_of(alice)}
      routes: [kimi-k3]
      rate_limit: {{requests_per_minute: 60}}
      budgets: {{per_day_usd: 5, per_month_usd: 100}}
    - {{name: ops, sha256: {digest_of(ops)}, admin: true}}
"""
    )
    listed = gateway_command("keys", "list", "--policy", str(policy))
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[3:]}
    assert set(rows) == {"alice", "ops"}
    assert re.search(
        r"kimi-k3\s+no\s+60 req/min\s+\$5/day, \$100/month \(reject\)\s+[0-9a-f]{8}…$", rows["alice"]
    )
    assert re.search(r"all\s+yes\s+-\s+-\s+[0-9a-f]{8}…$", rows["ops"])
    for secret in (alice, ops):
        assert digest_of(secret) not in listed.stdout and digest_of(secret)[:9] not in listed.stdout
        assert secret not in listed.stdout


def test_list_says_when_a_policy_has_no_keys() -> None:
    listed = gateway_command("keys", "list")
    assert listed.returncode == 0
    assert "no API keys" in listed.stdout and "gateway keys create NAME" in listed.stdout
