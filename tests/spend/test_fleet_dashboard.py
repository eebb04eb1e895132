"""A gateway on a shared PostgreSQL ledger that other replicas already wrote to: its budgets start
from the fleet's spend, and /dashboard shows the fleet (replica column, replicas table), each GPU
pool's idle cost beside what requests were charged, errors and fallbacks per route, rounded axis
labels, labelled overlapping lines and recent decisions sorted by the time they show; in headless
Chromium, with a screenshot."""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.ledger import LedgerRow, open_database
from tests.conftest import Gateway

from .chromium import Page, chromium, chromium_path
from .conftest import MakeGateway, chat, clear_of_midnight, settle

ROUTES = """
  kimi-k3:
    backends: [b300-vllm, paid-api]
    budgets: {per_day_usd: 100}
  vllm-only:
    backends: [b300-vllm]
  paid-only:
    backends: [paid-api]
"""
OTHER = "gateway-7d9f-other"


def other_replicas_rows(now: float) -> list[tuple[Any, ...]]:
    """What another replica wrote before this gateway started: spend on two routes, one failed
    request and one that needed a fallback."""
    rows = []
    for n in range(6):
        route = "kimi-k3" if n < 4 else "vllm-only"
        row = LedgerRow(
            time=now - 60 + n,
            request_id=f"other-{n}",
            api_key_name=None,
            route=route,
            endpoint="chat",
            stream=True,
            backend="b300-vllm" if n != 1 else "paid-api",
            upstream_model="kimi-k3",
            prompt_tokens=12,
            cached_prompt_tokens=0,
            completion_tokens=300,
            reasoning_tokens=120,
            usage_source="reported",
            cost_usd=0.0125 if n != 0 else 0.0,
            cost_basis="gpu_hours_amortized",
            reserved_usd=0.02,
            ttft_s=0.95,
            first_answer_s=1.4,
            decode_tokens_per_s=92.0,
            duration_s=4.0,
            status="error" if n == 0 else "ok",
            error_type="upstream_failed" if n == 0 else None,
            attempts=2 if n == 1 else 1,
            decision_reason="cheapest_feasible",
            replica=OTHER,
        )
        rows.append((*row, f"other-key-{n}"))
    return rows


@pytest.fixture
def fleet_gateway(make_gateway: MakeGateway, postgres_url: str) -> Gateway:
    seeded = open_database(postgres_url)
    seeded.open()
    # Seeded a minute back, then read as today's: the test must not straddle a UTC midnight (a CI run
    # at 00:00 UTC once failed three of these tests: the seeded rows fell on the day before).
    seeded.write(other_replicas_rows(clear_of_midnight()))
    seeded.close()
    gateway = make_gateway(ROUTES, ledger_path=postgres_url)
    sent = 0
    for route, stream in (("paid-only", False), ("vllm-only", True), ("kimi-k3", False)) * 2:
        assert chat(gateway, route, stream=stream).status_code == 200
        sent += 1
    settle(gateway, sent)
    return gateway


def fresh_data(gateway: Gateway) -> dict[str, Any]:
    """The dashboard's JSON once its view of the ledger is newer than the last row written."""
    written_at = time.time()
    deadline = time.monotonic() + 15
    while True:
        data: dict[str, Any] = httpx.get(gateway.url + "/dashboard/data").json()
        if (data["ledger"]["read_at"] or 0) > written_at:
            return data
        assert time.monotonic() < deadline, "the ledger view never refreshed"
        time.sleep(0.2)


def test_budgets_start_from_the_fleets_spend(fleet_gateway: Gateway) -> None:
    runtime = fleet_gateway.runtime
    (use,) = [u for u in runtime.budgets.usage(runtime.policy, time.time()) if u.name == "kimi-k3"]
    # The other replica's 0.0375 for kimi-k3 was there before this gateway started; ours came on top.
    with runtime.ledger.database.reading() as reader:
        ledger = {t.key: t.cost_usd for t in reader.totals("route", time.time() - 3600)}
    assert use.spent_usd == pytest.approx(ledger["kimi-k3"], rel=1e-9)
    assert use.spent_usd > 0.0375


def test_the_data_shows_the_fleet_pools_errors_and_fallbacks(
    fleet_gateway: Gateway, postgres_url: str
) -> None:
    data = fresh_data(fleet_gateway)
    assert data["ledger"]["shared"] and data["ledger"]["location"] == postgres_url
    replicas = {r["replica"]: r for r in data["replicas"]}
    assert set(replicas) == {OTHER, data["replica"]}
    assert replicas[OTHER]["today_requests"] == 6 and replicas[data["replica"]]["today_requests"] == 6
    routes = {r["route"]: r for r in data["routes"]}
    assert (routes["kimi-k3"]["errors_today"], routes["kimi-k3"]["fallbacks_today"]) == (1, 1)
    assert routes["kimi-k3"]["today_requests"] == 4 + 2, "the fleet's requests, not this replica's"
    recent = data["recent"]
    assert {r["replica"] for r in recent} == {OTHER, data["replica"]}
    assert [r["time"] for r in recent] == sorted((r["time"] for r in recent), reverse=True)
    pools = {p["backend"]: p for p in data["pools"]}
    assert set(pools) == {"b300-vllm", "a100-llamacpp"}, "GPU-hour pools only"
    for pool in pools.values():
        assert pool["attributed_usd"] + pool["idle_usd"] == pytest.approx(
            pool["usd_per_hour"] * pool["hours"]
        )
    assert pools["b300-vllm"]["attributed_usd"] > 0.0125 * 4


@pytest.mark.slow
def test_the_fleet_dashboard_in_chromium(fleet_gateway: Gateway, tmp_path: Path) -> None:
    if chromium_path() is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium); CI installs it")
    data = fresh_data(fleet_gateway)
    with chromium(tmp_path / "chromium-profile") as page:
        page.navigate(fleet_gateway.url + "/dashboard")
        page.wait_for("document.querySelector('#status.live') !== null")
        page.wait_for("!document.getElementById('replicas-section').hidden")
        assert page.evaluate("document.querySelectorAll('#replicas tbody tr').length") == 2
        assert sorted(each(page, "#pools tbody tr", "e.dataset.pool")) == ["a100-llamacpp", "b300-vllm"]
        idle = "Number(document.querySelector('#pools tr[data-pool=\"a100-llamacpp\"] td.idle').dataset.usd)"
        assert page.evaluate(idle) > 0, "a pool that served nothing is all idle"
        errors = "document.querySelector('#routes tr[data-route=\"kimi-k3\"] td.errors').textContent"
        assert page.evaluate(errors) == "1"
        # The y axis: evenly spaced amounts of 1, 2 or 5 times a power of ten, with no stray digits.
        ticks = each(page, "#chart .y-tick", "e.textContent")
        values = [float(t.lstrip("$").replace(",", "")) for t in ticks]
        step = values[1] - values[0]
        assert re.fullmatch(r"[125]0*", f"{step:.10e}".split("e")[0].replace(".", "").rstrip("0") or "1")
        assert all(v == pytest.approx(i * step) for i, v in enumerate(values))
        assert len({len(t.split(".")[-1]) for t in ticks if "." in t}) <= 1, "one number of decimals"
        minutes = each(page, "#chart .x-tick", "e.textContent")
        assert minutes and all(re.fullmatch(r"\d\d:\d[05]", m) for m in minutes), minutes
        # Every line is labelled at its end, labels apart even when the lines end together.
        labels = each(page, "#chart .end-label", "[e.textContent, Number(e.getAttribute('y'))]")
        assert sorted(name for name, _ in labels) == sorted(data["series"]["routes"])
        heights = sorted(y for _, y in labels)
        assert all(b - a >= 14 for a, b in itertools.pairwise(heights))
        dashes = each(page, "#chart polyline.series", "e.getAttribute('stroke-dasharray')")
        assert len(set(dashes)) == len(dashes), "each line its own dash pattern"
        shown = page.evaluate(
            "[...document.querySelectorAll('#recent tbody tr')].map(tr => Number(tr.dataset.time))"
        )
        assert shown == sorted(shown, reverse=True) and len(shown) == 12
        replicas = page.evaluate(
            "[...document.querySelectorAll('#recent tbody tr td:nth-child(3)')].map(td => td.textContent)"
        )
        assert OTHER in replicas
        assert page.evaluate("document.getElementById('recent-time').textContent").startswith("started")
        assert "fleet ledger postgresql://" in page.evaluate("document.getElementById('ledger').textContent")
        png = page.screenshot(tmp_path / "fleet-dashboard.png")
    assert png.startswith(b"\x89PNG") and len(png) > 20_000


def each(page: Page, selector: str, expression: str) -> list[Any]:
    """``expression`` (of ``e``) for every element ``selector`` matches, in document order."""
    values: list[Any] = page.evaluate(f"[...document.querySelectorAll({selector!r})].map(e => {expression})")
    return values
