"""``gateway advise --ledger``: the traffic a real gateway served (over the emulators) becomes a plan,
printed with its table and limits, and advice.json (the demo's case, made small)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson

from tests.conftest import Gateway

REQUESTS = 12


def test_advise_reads_the_ledger_a_gateway_wrote_and_prints_a_plan(gateway: Gateway, tmp_path: Path) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
    for i in range(REQUESTS):
        model = ("kimi-k3", "pool-then-api", "paid-only")[i % 3]
        assert (
            httpx.post(gateway.base_url + "/chat/completions", json={**body, "model": model}).status_code
            == 200
        )
    ledger = gateway.runtime.ledger
    deadline = time.monotonic() + 30
    while ledger.rows_written < REQUESTS and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ledger.rows_written >= REQUESTS
    out = tmp_path / "advise"
    args = ["advise", "--ledger", str(gateway.policy_path.parent / "ledger.sqlite3"), "--since", "1h"]
    args += ["--policy", str(gateway.policy_path), "--out", str(out), "--no-plots", "--quiet"]
    result = subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stderr
    assert "recommended:" in result.stdout
    assert f"{REQUESTS} requests seen" in result.stdout
    advice = orjson.loads((out / "advice.json").read_bytes())
    assert advice["plans"][0]["name"] == "today"
    assert advice["recommended"] in {plan["name"] for plan in advice["plans"]}
