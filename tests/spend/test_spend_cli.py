"""`gateway spend` reads the ledger: totals per route, backend or key, as a table, CSV or JSON, and the
idle remainder of GPU-hour pools when given the policy."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.ledger.migrations import latest_version
from gateway.ledger.settings import LEDGER_ENV, resolve_ledger
from gateway.money.spend import parse_since
from gateway.policy.compiled import CompiledPolicy
from gateway.policy.load import load_policy
from tests.servers import python_module

from .conftest import MakeGateway, chat, ledger_path, ledger_rows, settle

ROUTES = """
  vllm-only:
    backends: [b300-vllm]
  paid-only:
    backends: [paid-api]
"""


def spend(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != LEDGER_ENV} | (env or {})
    return subprocess.run(
        python_module("gateway", "spend", *args),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=cwd,
        env=environ,
    )


@pytest.fixture
def traffic(make_gateway: MakeGateway, tmp_path: Path) -> Path:
    gateway = make_gateway(ROUTES)
    for route, stream in (("paid-only", False), ("paid-only", True), ("vllm-only", True)):
        assert chat(gateway, route, stream=stream).status_code == 200
    settle(gateway, 3)
    return ledger_path(tmp_path)


def totals_by(ledger: Path, column: str) -> dict[str, tuple[int, int, float]]:
    out: dict[str, tuple[int, int, float]] = {}
    for row in ledger_rows(ledger):
        requests, tokens, usd = out.get(row[column], (0, 0, 0.0))
        out[row[column]] = (requests + 1, tokens + row["completion_tokens"], usd + row["cost_usd"])
    return out


def test_json_by_route_matches_the_ledger(traffic: Path) -> None:
    result = spend("--ledger", str(traffic), "--by", "route", "--format", "json", "--since", "1h")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    got = {r["route"]: (r["requests"], r["completion_tokens"], r["cost_usd"]) for r in report["rows"]}
    expected = totals_by(traffic, "route")
    assert got.keys() == expected.keys()
    for route, (requests, tokens, usd) in expected.items():
        assert got[route][:2] == (requests, tokens)
        assert got[route][2] == pytest.approx(usd, rel=1e-12)
    assert report["total_usd"] == pytest.approx(sum(v[2] for v in expected.values()), rel=1e-12)
    paid = next(r for r in report["rows"] if r["route"] == "paid-only")
    assert paid["usd_per_mtok_out"] == pytest.approx(paid["cost_usd"] / paid["completion_tokens"] * 1e6)
    assert "--policy" in report["note"]
    assert report["ledger"] == str(traffic.resolve()), "the report names the ledger it read"


def test_table_and_csv_by_backend_and_key(traffic: Path) -> None:
    table = spend("--ledger", str(traffic), "--by", "backend")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("spend by backend")
    assert lines[1] == f"ledger: {traffic.resolve()}"
    assert any(line.startswith("paid-api") for line in lines) and lines[-2].startswith("total")
    as_csv = spend("--ledger", str(traffic), "--format", "csv")
    assert as_csv.stderr.strip() == f"ledger: {traffic.resolve()} (from --ledger)", (
        "CSV stays rows; the ledger goes to stderr"
    )
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert {r["route"] for r in rows} == {"paid-only", "vllm-only"}
    assert sum(int(r["requests"]) for r in rows) == 3
    by_key = json.loads(spend("--ledger", str(traffic), "--by", "key", "--format", "json").stdout)
    assert [(r["key"], r["requests"]) for r in by_key["rows"]] == [("(none)", 3)]


def test_idle_remainder_of_gpu_hour_pools_with_the_policy(traffic: Path, tmp_path: Path) -> None:
    started = min(r["time"] for r in ledger_rows(traffic))
    args = ("--ledger", str(traffic), "--by", "backend", "--format", "json", "--policy")
    result = spend(*args, str(tmp_path / "policy.yaml"))
    upper_hours = (time.time() - started) / 3600
    assert result.returncode == 0, result.stderr
    rows: dict[str, dict[str, Any]] = {r["backend"]: r for r in json.loads(result.stdout)["rows"]}
    # The A100 pool served nothing: its whole time since the ledger's first row is idle.
    idle = rows["(idle) a100-llamacpp"]
    assert 0 < idle["cost_usd"] <= 20.09 * upper_hours and idle["cost_basis"] == "gpu_hours_idle"
    assert "(idle) b300-vllm" in rows and "(idle) paid-api" not in rows


def test_since_and_errors() -> None:
    now = 1_750_000_000.0
    assert parse_since("24h", now) == now - 86_400
    assert parse_since("90s", now) == now - 90
    assert parse_since("2025-06-01", now) == 1_748_736_000.0
    with pytest.raises(ValueError, match="24h"):
        parse_since("yesterday", now)
    missing = spend("--ledger", "/nonexistent/ledger.sqlite3")
    assert missing.returncode == 2 and "no ledger at /nonexistent/ledger.sqlite3" in missing.stderr


def test_spend_by_default_reads_the_policys_ledger_or_says_which_file_it_missed(
    traffic: Path, tmp_path: Path
) -> None:
    policy = str(tmp_path / "policy.yaml")  # its ledger.path is the traffic's ledger
    report = json.loads(spend("--policy", policy, "--format", "json").stdout)
    assert report["ledger"] == str(traffic.resolve()) and len(report["rows"]) > 2
    elsewhere = subprocess.run(
        python_module("gateway", "spend"), capture_output=True, text=True, cwd=tmp_path / "..", timeout=60
    )
    assert elsewhere.returncode == 2, "no silent empty report from another folder"
    assert str((tmp_path / ".." / "var" / "ledger.sqlite3").resolve()) in elsewhere.stderr


def test_ledger_migrate_creates_the_schema_once(tmp_path: Path, postgres_url: str) -> None:
    for target in (str(tmp_path / "new.sqlite3"), postgres_url):
        first = subprocess.run(
            python_module("gateway", "ledger", "migrate", "--ledger", target), capture_output=True, text=True
        )
        assert first.returncode == 0, first.stderr
        latest = latest_version("sqlite")
        applied = ", ".join(str(v) for v in range(1, latest + 1))
        assert f"applied {applied}" in first.stdout and f"schema version {latest}" in first.stdout
        again = subprocess.run(
            python_module("gateway", "ledger", "migrate", "--ledger", target), capture_output=True, text=True
        )
        assert "applied none (already current)" in again.stdout
    refused = subprocess.run(
        python_module("gateway", "ledger", "migrate", "--ledger", "postgresql://nobody:secret@127.0.0.1:1/x"),
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "cannot open" in refused.stderr and "secret" not in refused.stderr


def test_a_window_with_no_requests_is_an_empty_report(traffic: Path) -> None:
    result = spend("--ledger", str(traffic), "--since", "2999-01-01", "--format", "json")
    assert result.returncode == 0
    assert json.loads(result.stdout)["rows"] == []


def test_the_ledger_is_found_as_serve_finds_it_from_any_folder_and_named(
    traffic: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    policy = tmp_path / "policy.yaml"  # its ledger.path is where the gateway wrote `traffic`
    by_policy = spend("--policy", str(policy), "--format", "json", cwd=elsewhere)
    assert by_policy.returncode == 0, by_policy.stderr
    assert by_policy.stderr == f"ledger: {traffic} (from ledger.path of {policy})\n"
    report = json.loads(by_policy.stdout)
    assert report["ledger"] == str(traffic) and sum(r["requests"] for r in report["rows"]) == 3

    by_env = spend(cwd=elsewhere, env={LEDGER_ENV: str(traffic)})
    assert by_env.returncode == 0 and by_env.stderr == f"ledger: {traffic} (from ${LEDGER_ENV})\n"
    assert by_env.stdout.splitlines()[1] == f"ledger: {traffic}", "the table names it too"
    by_flag = spend("--ledger", str(traffic), cwd=elsewhere, env={LEDGER_ENV: "/nonexistent.sqlite3"})
    assert by_flag.returncode == 0 and by_flag.stderr == f"ledger: {traffic} (from --ledger)\n"

    # No flag, no env, the default policy: its relative ledger.path, in this folder, which has none.
    missing = spend(cwd=elsewhere)
    assert missing.returncode == 2 and missing.stdout == ""
    assert f"no ledger at {elsewhere / 'var' / 'ledger.sqlite3'} (from ledger.path of " in missing.stderr


def test_serve_and_spend_resolve_one_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    default = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"

    def policy() -> CompiledPolicy:
        return load_policy(default)

    def no_policy() -> CompiledPolicy:
        raise AssertionError("the flag or the environment is enough; no policy is read")

    assert resolve_ledger(None, policy, {}).target == tmp_path / "var" / "ledger.sqlite3"
    assert resolve_ledger(None, no_policy, {LEDGER_ENV: "spent.db"}).target == tmp_path / "spent.db"
    assert resolve_ledger("flag.db", no_policy, {LEDGER_ENV: "spent.db"}).target == tmp_path / "flag.db"
    url = "postgresql://gateway:secret@db:5432/gateway"
    located = resolve_ledger(None, no_policy, {LEDGER_ENV: url})
    assert located.target == url and "secret" not in str(located), "a URL is shown without its password"
