"""`gateway check`: each problem and an exit code for bad files, a readable summary for good ones."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from gateway.policy.check import check_main, usd
from gateway.policy.jsonschema import REGENERATE, SCHEMA_FILE, policy_json_schema, render_policy_json_schema

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "policies" / "default.yaml"


def run_check(path: Path | str) -> tuple[int, str]:
    out = io.StringIO()
    status = check_main(str(path), out=out)
    return status, out.getvalue()


def test_valid_policy_prints_the_compiled_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAID_API_KEY", "sk-test")
    status, output = run_check(DEFAULT)
    assert status == 0
    assert output.startswith(f"{DEFAULT}: valid (3 backends, 4 routes, sha256 ")
    lines = output.splitlines()
    route = lines.index("route kimi-k3: Interactive chat; the cheapest backend predicted to meet the SLO")
    assert lines[route + 1 : route + 8] == [
        "  aliases: claude-*, gpt-*, codex-*",
        "  objective: lowest_cost, when infeasible: fastest",
        "  slo: TTFT p95 <= 3000 ms, decode >= 20 tok/s",
        "  fallback: up to 3 attempts within 600 s; exploration 2%",
        "  1. b300-vllm      vllm      $62.93/h gpu_hours marginal "
        "(~$190.01/1M out at 92 tok/s until measured)",
        "  2. a100-llamacpp  llamacpp  $20.09/h gpu_hours marginal "
        "(~$620.06/1M out at 9 tok/s until measured)",
        "  3. paid-api       openai    per_token: $0.60/1M in, $0.15/1M cached in, $15.00/1M out, "
        "thinking billed as output",
    ]
    assert "  objective: lowest_ttft, when infeasible: fastest" in lines
    assert "  slo: none (every healthy candidate is feasible)" in lines
    assert "warnings:" not in lines
    assert "sk-test" not in output


def test_unset_credentials_are_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAID_API_KEY", raising=False)
    status, output = run_check(DEFAULT)
    assert status == 0
    assert output.splitlines()[-2:] == [
        "warnings:",
        f"  {DEFAULT}:93:5 backends.paid-api.api_key_env: environment variable PAID_API_KEY is not set; "
        "requests go without a key",
    ]


def test_invalid_policy_prints_each_problem_and_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(
        "backends:\n"
        "  pool: {dialect: vllm, url: http://h/v1, model: m, pricing: {gpu_hours: {usd_per_hour: 1}}}\n"
        "routes:\n"
        "  kimi-k3:\n"
        "    backends: [pool, pol]\n"
        "    slo: {ttft_p95_ms: 0}\n"
    )
    status, output = run_check(path)
    assert status == 1
    assert output.splitlines() == [
        f"{path}:5:22 routes.kimi-k3.backends[1]: unknown backend 'pol' (did you mean 'pool'?); "
        "defined backends: pool",
        f"{path}:6:11 routes.kimi-k3.slo.ttft_p95_ms: Input should be greater than 0",
    ]


def test_missing_or_unreadable_file_exits_2(tmp_path: Path) -> None:
    status, output = run_check(tmp_path / "nope.yaml")
    assert (status, output) == (
        2,
        f"{tmp_path / 'nope.yaml'}: cannot read the policy file: No such file or directory\n",
    )
    status, output = run_check(tmp_path)
    assert status == 2 and "cannot read the policy file" in output


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        (15.0, "$15.00"),
        (0.6000000000000001, "$0.60"),
        (0.075, "$0.075"),
        (0.0, "$0.00"),
        (1234.5, "$1,234.50"),
    ],
)
def test_prices_read_as_people_quote_them(amount: float, text: str) -> None:
    assert usd(amount) == text


def test_committed_json_schema_is_current() -> None:
    assert SCHEMA_FILE == ROOT / "policies" / "policy.schema.json"
    committed = SCHEMA_FILE.read_text(encoding="utf-8") if SCHEMA_FILE.exists() else ""
    assert committed == render_policy_json_schema(), (
        f"policies/policy.schema.json is stale: run `{REGENERATE}`"
    )


def test_json_schema_describes_the_policy_file() -> None:
    schema = policy_json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == "Gateway policy file"
    assert set(schema["properties"]) == {
        "version",
        "server",
        "backends",
        "routes",
        "ledger",
        "auth",
        "store",
        "tuning",
        "telemetry",
    }
    assert schema["additionalProperties"] is False
    assert json.loads(render_policy_json_schema()) == schema


def test_shipped_policies_pass_the_json_schema_editors_use() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from ruamel.yaml import YAML

    validator = jsonschema.Draft202012Validator(policy_json_schema())
    for path in sorted((ROOT / "policies").rglob("*.yaml")):
        document = json.loads(json.dumps(YAML(typ="safe").load(path.read_text())))
        assert not list(validator.iter_errors(document)), path
