"""/metrics after known traffic: every metric is there with the values the traffic implies, and the
exposition passes `promtool check metrics`."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Gateway, Upstreams

from .conftest import MakeGateway, chat, ledger_path, ledger_rows, settle

ROUTES = """
  kimi-k3:
    backends: [b300-vllm, paid-api]
    exploration: 0
  vllm-only:
    backends: [b300-vllm]
  paid-only:
    backends: [paid-api]
  capped:
    backends: [paid-api]
    budgets: {per_day_usd: 0, per_month_usd: 5}
"""
# Every family the gateway exports (names as the exposition shows them, without _bucket/_sum/_count).
EXPORTED = {
    "gateway_requests_total",
    "gateway_refused_requests_total",
    "gateway_tokens_total",
    "gateway_spend_usd_total",
    "gateway_decisions_total",
    "gateway_upstream_errors_total",
    "gateway_errors_total",
    "gateway_ttft_seconds",
    "gateway_time_to_first_answer_seconds",
    "gateway_decode_tokens_per_second",
    "gateway_overhead_seconds",
    "gateway_backend_inflight_requests",
    "gateway_backend_circuit_state",
    "gateway_backend_circuit_opened_total",
    "gateway_backend_usd_per_million_output_tokens",
    "gateway_backend_decode_tokens_per_second",
    "gateway_budget_limit_usd",
    "gateway_budget_spent_usd",
    "gateway_budget_reserved_usd",
    "gateway_budget_remaining_usd",
    "gateway_policy_reloads_total",
    "gateway_policy_reload_failures_total",
    "gateway_policy_last_reload_ok",
    "gateway_policy_last_reload_success_timestamp_seconds",
    "gateway_ledger_rows_written_total",
    "gateway_ledger_rows_dropped_total",
    "gateway_ledger_write_errors_total",
    "gateway_ledger_rows_spooled_total",
    "gateway_ledger_spool_rows",
    "gateway_ledger_spool_errors_total",
    "gateway_ledger_pending_rows",
}


class Scrape:
    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        self.families: set[str] = set()
        for family in text_string_to_metric_families(text):
            suffix = "_total" if family.type == "counter" else ""
            self.families.add(family.name + suffix)
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def __call__(self, metric: str, /, **labels: str) -> float:
        return self.samples[(metric, frozenset(labels.items()))]

    def get(self, metric: str, /, **labels: str) -> float | None:
        return self.samples.get((metric, frozenset(labels.items())))


def scrape(gateway: Gateway) -> Scrape:
    response = httpx.get(gateway.url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return Scrape(response.text)


def set_faults(server: object, **faults: object) -> None:
    httpx.post(f"{server.url}/emulator/faults", json=faults).raise_for_status()  # type: ignore[attr-defined]


def test_known_traffic_shows_in_every_metric(
    make_gateway: MakeGateway, upstreams: Upstreams, tmp_path: Path
) -> None:
    gateway = make_gateway(ROUTES)
    with_usage = {"include_usage": True}
    streams = [chat(gateway, "vllm-only", stream=True, stream_options=with_usage) for _ in range(2)]
    paid = chat(gateway, "paid-only")
    capped = chat(gateway, "capped")
    unknown = chat(gateway, "no-such-route")
    set_faults(upstreams.vllm, error_rate=1.0, error_status=503)
    rescued = chat(gateway, "kimi-k3")
    # With the failure above, four more are five in a row: b300-vllm's circuit opens.
    failed = [chat(gateway, "vllm-only") for _ in range(4)]
    assert [r.status_code for r in (*streams, paid, rescued)] == [200] * 4
    assert (capped.status_code, unknown.status_code, {r.status_code for r in failed}) == (429, 404, {502})
    settle(gateway, 10)  # nine served or failed, and the refused unknown route
    m = scrape(gateway)

    assert m.families >= EXPORTED, f"missing: {sorted(EXPORTED - m.families)}"
    assert m("gateway_requests_total", route="vllm-only", backend="b300-vllm", status="ok") == 2
    assert m("gateway_requests_total", route="vllm-only", backend="b300-vllm", status="upstream_failed") == 4
    assert m("gateway_requests_total", route="paid-only", backend="paid-api", status="ok") == 1
    assert m("gateway_requests_total", route="kimi-k3", backend="paid-api", status="ok") == 1
    assert m("gateway_requests_total", route="capped", backend="", status="budget_exhausted") == 1
    assert m("gateway_decisions_total", route="vllm-only", reason="only_candidate") == 6

    usage = [
        next(
            json.loads(line[6:])["usage"]
            for line in r.text.splitlines()
            if line.startswith("data: {") and '"usage":{' in line
        )
        for r in streams
    ]
    prompt = sum(u["prompt_tokens"] for u in usage)
    reasoning = sum(u["completion_tokens_details"]["reasoning_tokens"] for u in usage)
    completion = sum(u["completion_tokens"] for u in usage)
    vllm = {"route": "vllm-only", "backend": "b300-vllm"}
    prompt_kinds = ("input", "cached_input")
    assert sum(m.get("gateway_tokens_total", kind=kind, **vllm) or 0 for kind in prompt_kinds) == prompt
    assert m("gateway_tokens_total", kind="reasoning", **vllm) == reasoning
    assert m("gateway_tokens_total", kind="output", **vllm) == completion - reasoning

    rows = {r["route"]: r for r in ledger_rows(ledger_path(tmp_path), "status = 'ok'")}
    assert m("gateway_spend_usd_total", route="paid-only", backend="paid-api") == pytest.approx(
        rows["paid-only"]["cost_usd"]
    )
    stream_rows = ledger_rows(ledger_path(tmp_path), "route = 'vllm-only' AND status = 'ok'")
    assert m("gateway_ttft_seconds_count", **vllm) == 2
    assert m("gateway_ttft_seconds_sum", **vllm) == pytest.approx(sum(r["ttft_s"] for r in stream_rows))
    assert m("gateway_time_to_first_answer_seconds_sum", **vllm) == pytest.approx(
        sum(r["first_answer_s"] for r in stream_rows)
    )
    assert m("gateway_decode_tokens_per_second_count", **vllm) == 2
    assert m("gateway_decode_tokens_per_second_sum", **vllm) == pytest.approx(
        sum(r["decode_tokens_per_s"] for r in stream_rows)
    )
    assert m("gateway_overhead_seconds_count", stream="true") == 2
    # Non-streamed: paid, capped, rescued, the four failures, and the unknown route (refused).
    assert m("gateway_overhead_seconds_count", stream="false") == 1 + 1 + 1 + 4 + 1
    assert m("gateway_refused_requests_total", reason="model_not_found") == 1
    assert m("gateway_refused_requests_total", reason="budget_exhausted") == 1

    assert m("gateway_errors_total", origin="gateway", code="model_not_found") == 1
    assert m("gateway_errors_total", origin="gateway", code="budget_exhausted") == 1
    assert m("gateway_errors_total", origin="upstream", code="upstream_failed") == 4
    assert m("gateway_upstream_errors_total", backend="b300-vllm", type="http_5xx") == 5

    assert m("gateway_backend_usd_per_million_output_tokens", backend="paid-api") == pytest.approx(15.0)
    assert m("gateway_backend_decode_tokens_per_second", backend="b300-vllm") > 0
    assert m("gateway_backend_inflight_requests", backend="b300-vllm") == 0
    assert m("gateway_backend_circuit_state", backend="b300-vllm") in (1, 2)  # open, or half-open by now
    assert m("gateway_backend_circuit_opened_total", backend="b300-vllm") == 1
    assert m("gateway_backend_circuit_state", backend="paid-api") == 0

    capped_day = {"scope": "route", "name": "capped", "period": "day"}
    assert m("gateway_budget_limit_usd", **capped_day) == 0
    assert m("gateway_budget_remaining_usd", **capped_day) == 0
    assert m("gateway_budget_limit_usd", scope="route", name="capped", period="month") == 5
    assert m("gateway_budget_reserved_usd", **capped_day) == 0
    assert m("gateway_ledger_rows_written_total") == 10
    assert m("gateway_ledger_pending_rows") == 0
    assert m("gateway_ledger_rows_dropped_total", kind="billable") == 0
    assert m("gateway_ledger_rows_dropped_total", kind="refused") == 0
    assert m("gateway_ledger_write_errors_total") == m("gateway_ledger_rows_spooled_total") == 0


def test_policy_reloads_show_success_and_failure(make_gateway: MakeGateway) -> None:
    gateway = make_gateway()
    holder = gateway.runtime.policy_source
    started = scrape(gateway)
    assert started("gateway_policy_reloads_total") == started("gateway_policy_reload_failures_total") == 0
    assert started("gateway_policy_last_reload_ok") == 1
    good = gateway.policy_path.read_text()
    gateway.policy_path.write_text(good + "\nnot: valid\n")
    assert not holder.reload_now()  # type: ignore[attr-defined]
    broken = scrape(gateway)
    assert broken("gateway_policy_reload_failures_total") == 1
    assert broken("gateway_policy_last_reload_ok") == 0
    gateway.policy_path.write_text(good.replace("first_byte_s: 5", "first_byte_s: 6"))
    assert holder.reload_now()  # type: ignore[attr-defined]
    fixed = scrape(gateway)
    assert fixed("gateway_policy_reloads_total") == 1 and fixed("gateway_policy_last_reload_ok") == 1
    assert fixed("gateway_policy_last_reload_success_timestamp_seconds") >= started(
        "gateway_policy_last_reload_success_timestamp_seconds"
    )


def test_exposition_passes_promtool(make_gateway: MakeGateway, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install -y prometheus); CI installs it")
    gateway = make_gateway(ROUTES)
    for route in ("vllm-only", "paid-only", "capped"):
        chat(gateway, route, stream=route == "vllm-only")
    settle(gateway, 3)
    exposition = httpx.get(gateway.url + "/metrics").text
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=exposition, capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == "" and checked.stderr.strip() == "", "promtool's linter has remarks"


def test_health_and_metrics_say_which_version_runs(make_gateway: MakeGateway) -> None:
    gateway = make_gateway()
    installed = version("gateway")
    health = httpx.get(gateway.url + "/health")
    assert health.json() == {"status": "ok", "version": installed}
    exposition = httpx.get(gateway.url + "/metrics").text
    python = platform.python_version()
    assert f'gateway_build_info{{python="{python}",version="{installed}"}} 1.0' in exposition.splitlines()
