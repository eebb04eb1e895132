"""``gateway simulate`` end to end: a workload file through a policy and every baseline (table, JSON,
plots), a ledger written by real gateway traffic replayed, and workload files that do not load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.cli import main
from tests.conftest import PAID_KEY, Upstreams, policy_yaml, running_gateway

REPO = Path(__file__).resolve().parents[2]
SMALL_DAY = """
name: small-day
seed: 3
duration_s: 7200
arrivals:
  curve: [[0, 0.05], [1, 0.4], [2, 0.05]]
requests:
  prompt_tokens: {median: 500, sigma: 0.8, max: 20000}
  output_tokens: {median: 600, sigma: 0.6, max: 4000}
  routes: {kimi-k3: 0.8, kimi-k3-batch: 0.2}
faults:
  - {backend: b300-vllm, kind: down, start_s: 3000, end_s: 3600}
"""


def test_simulate_prints_the_table_and_writes_json_and_plots(tmp_path: Path) -> None:
    workload = tmp_path / "small.yaml"
    workload.write_text(SMALL_DAY)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "gateway", "simulate", "--policy", str(REPO / "policies/default.yaml"),
               "--workload", str(workload), "--baseline", "all", "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    for name in ("default", "oracle", "round-robin", "least-busy", "lowest-latency", "lowest-price",
                 "shuffle", "all-to-paid-api", "all-to-b300-vllm", "all-to-a100-llamacpp"):  # fmt: skip
        assert name in done.stdout, name
    report = json.loads((out / "report.json").read_text())
    runs = {run["name"]: run for run in report["runs"]}
    assert len(runs) == 10 and report["requests"] > 100
    default, oracle, api_only = runs["default"], runs["oracle"], runs["all-to-paid-api"]
    assert default["kind"] == "policy" and oracle["kind"] == "baseline"
    # Pools are paid by the hour whether used or not: two hours of both pools in every run.
    assert default["pool_hours_usd"] == pytest.approx({"b300-vllm": 2 * 62.93, "a100-llamacpp": 2 * 20.09})
    assert api_only["share"] == {"paid-api": 1.0}
    # The oracle meets the SLO at least as often as the all-to-API baseline does at most cost.
    assert oracle["slo_attainment"] >= default["slo_attainment"] - 0.02
    assert 0 < default["ttft_p50_s"] <= default["ttft_p95_s"] <= default["ttft_p99_s"]
    # The B300 pool's half hour down fails the streams under way on it, and nothing else.
    assert set(default["failures_by_kind"]) <= {"upstream_dropped"}
    for png in ("cost-vs-slo.png", "over-the-day-default.png", "over-the-day-oracle.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png


def test_a_ledger_of_gateway_traffic_replays(
    upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(upstreams))
    ledger = tmp_path / "ledger.sqlite3"
    sent = {"kimi-k3": 6, "paid-only": 3, "vllm-only": 2}
    with running_gateway(policy, ledger_path=ledger) as gateway:
        for route, count in sent.items():
            for i in range(count):
                body = {"model": route, "messages": [{"role": "user", "content": f"hello {i} " * 40}],
                        "stream": i % 2 == 0, "max_tokens": 40}  # fmt: skip
                response = httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=60)
                assert response.status_code == 200, response.text
    out = tmp_path / "out"
    code = main(["simulate", "--policy", str(policy), "--workload", f"ledger:{ledger}", "--since", "1h",
                 "--baseline", "oracle", "--out", str(out), "--no-plots", "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert report["requests"] == sum(sent.values())
    runs = {run["name"]: run for run in report["runs"]}
    assert runs["policy"]["ok"] == sum(sent.values())
    # The paid-only route can only have gone to the API, in the replay as in the gateway.
    assert runs["policy"]["api_usd"]["paid-api"] > 0
    assert "ledger:" in report["workload"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("duration_s: 60\narrivals: {ramp: {from_rps: 1, to_rps: 2}}\n", "needs both arrivals and requests"),
        ("seats: 3\n", "seats"),
        (
            "arrivals: {curve: [[0, 1]]}\nrequests: {prompt_tokens: {median: 1}, output_tokens: {median: 1}, "
            "routes: {r: 1}}\n",
            "at least two points",
        ),
    ],
)
def test_a_bad_workload_file_is_named_with_its_problem(
    tmp_path: Path, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = tmp_path / "bad.yaml"
    workload.write_text(text)
    code = main(["simulate", "--policy", str(REPO / "policies/default.yaml"), "--workload", str(workload),
                 "--out", str(tmp_path), "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "bad.yaml" in err and message in err


def test_a_missing_ledger_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--policy", str(REPO / "policies/default.yaml"),
                 "--workload", f"ledger:{tmp_path / 'none.sqlite3'}", "--quiet"])  # fmt: skip
    assert code == 2
    assert "no such file" in capsys.readouterr().err


def test_the_bundled_day_is_a_hundred_thousand_requests_with_faults() -> None:
    from gateway.simulate.workload import read_workload_file, synthesize

    day = synthesize(read_workload_file(REPO / "bench/workloads/kimi-day.yaml"))
    assert 90_000 < len(day.requests) < 110_000
    assert day.duration_s == 86_400 and [f.kind for f in day.faults] == ["down", "slow"]
    assert {r.route for r in day.requests} == {"kimi-k3", "kimi-k3-batch", "kimi-k3-fast"}
    assert day.requests == synthesize(read_workload_file(REPO / "bench/workloads/kimi-day.yaml")).requests
