"""/dashboard: its JSON has what the page shows, and in headless Chromium the page comes alive, shows
each route's spend as the ledger has it, follows new traffic, and is saved as a screenshot."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import httpx
import pytest

from gateway.money.budgets import period_bounds
from tests.conftest import Gateway

from .chromium import chromium, chromium_path
from .conftest import HELLO, MakeGateway, chat, ledger_path, ledger_rows, settle

MIX = (("paid-only", False), ("vllm-only", True), ("kimi-k3", True), ("paid-only", True))
ROUTES = """
  kimi-k3:
    backends: [b300-vllm, paid-api]
  vllm-only:
    backends: [b300-vllm]
  paid-only:
    backends: [paid-api]
    budgets: {per_day_usd: 0.05, per_month_usd: 1.0}
"""


def traffic(gateway: Gateway, rounds: int) -> int:
    sent = 0
    for _ in range(rounds):
        for route, stream in MIX:
            assert chat(gateway, route, stream=stream).status_code == 200
            sent += 1
    return sent


def ledger_today(path: Path, wall: float) -> dict[str, float]:
    start, _ = period_bounds("day", wall)
    conn = sqlite3.connect(path)
    try:
        query = "SELECT route, sum(cost_usd) FROM requests WHERE time >= ? GROUP BY route"
        return dict(conn.execute(query, (start,)).fetchall())
    finally:
        conn.close()


def shown(usd: float) -> str:
    """How the page writes an amount (dashboard.js usd())."""
    return f"${usd:,.2f}" if abs(usd) >= 1 else f"${usd:.6f}"


def test_data_endpoint_has_every_view(make_gateway: MakeGateway, tmp_path: Path) -> None:
    gateway = make_gateway(ROUTES)
    sent = traffic(gateway, 1)
    settle(gateway, sent)
    data = httpx.get(gateway.url + "/dashboard/data").json()
    today = ledger_today(ledger_path(tmp_path), data["now"])
    routes = {r["route"]: r for r in data["routes"]}
    assert set(routes) == {"kimi-k3", "vllm-only", "paid-only"}
    for name, usd in today.items():
        assert routes[name]["today_usd"] == pytest.approx(usd, rel=1e-12)
        assert routes[name]["last_hour_usd"] == pytest.approx(usd, rel=1e-12)
    assert sum(sum(v) for v in data["series"]["routes"].values()) == pytest.approx(sum(today.values()))
    backends = {b["backend"]: b for b in data["backends"]}
    assert backends["paid-api"]["usd_per_mtok_out"] == pytest.approx(15.0)
    assert backends["b300-vllm"]["ttft_p95_s"] > 0 and backends["b300-vllm"]["decode_tokens_per_s"] > 0
    budgets = {(b["name"], b["period"]) for b in data["budgets"]}
    assert budgets == {("paid-only", "day"), ("paid-only", "month")}
    assert len(data["recent"]) == sent and all(r["reason"] for r in data["recent"])
    started = [r["time"] for r in data["recent"]]
    assert started == sorted(started, reverse=True), "newest start first: the time each row shows"
    assert data["ledger"]["location"] == str(ledger_path(tmp_path).resolve())
    assert not data["ledger"]["shared"] and data["replicas"] == []
    page = httpx.get(gateway.url + "/dashboard")
    assert page.status_code == 200 and "dashboard.js" in page.text
    assert httpx.get(gateway.url + "/dashboard/static/dashboard.js").status_code == 200


@pytest.mark.slow
def test_the_page_shows_the_ledgers_spend_live_in_chromium(make_gateway: MakeGateway, tmp_path: Path) -> None:
    if chromium_path() is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium); CI installs it")
    gateway = make_gateway(ROUTES)
    sent = traffic(gateway, 2)
    settle(gateway, sent)
    with chromium(tmp_path / "chromium-profile") as page:
        page.navigate(gateway.url + "/dashboard")
        page.wait_for("document.querySelector('#status.live') !== null")
        for round_ in range(2):
            today = ledger_today(ledger_path(tmp_path), gateway.runtime.wall_clock())
            # The page polls: wait until what it shows is what the ledger holds now.
            expected = {route: shown(usd) for route, usd in today.items()}
            script = (
                "Object.fromEntries([...document.querySelectorAll('#routes tr[data-route]')]"
                ".map(tr => [tr.dataset.route, tr.querySelector('td.today').textContent]))"
            )
            page.wait_for(script, equals=expected)
            exact = page.evaluate(
                "Object.fromEntries([...document.querySelectorAll('#routes tr[data-route]')]"
                ".map(tr => [tr.dataset.route, Number(tr.querySelector('td.today').dataset.usd)]))"
            )
            for route, usd in today.items():
                assert exact[route] == pytest.approx(usd, rel=1e-9)
            if round_ == 0:
                sent += traffic(gateway, 1)  # new spend must reach the open page by itself
                settle(gateway, sent)
        assert page.evaluate("document.querySelectorAll('#recent tbody tr').length") == sent
        assert page.evaluate("document.querySelectorAll('#chart polyline.series').length") == 3
        price = "#backends tr[data-backend='paid-api'] td:nth-child(3)"
        assert page.evaluate(f'document.querySelector("{price}").textContent') == "$15.00"
        png = page.screenshot(tmp_path / "dashboard.png")
    assert png.startswith(b"\x89PNG") and len(png) > 20_000


def test_with_keys_the_ledger_names_the_key_and_only_admins_read_spend(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    ops, app = "gwk-ops-admin-key-for-tests", "gwk-app-key-for-tests"
    keys = f"""
auth:
  keys:
    - {{name: ops, sha256: {hashlib.sha256(ops.encode()).hexdigest()}, admin: true}}
    - {{name: app, sha256: {hashlib.sha256(app.encode()).hexdigest()}}}
"""
    gateway = make_gateway(ROUTES, policy_suffix=keys)
    answered = httpx.post(
        gateway.base_url + "/chat/completions",
        json={"model": "paid-only", "messages": HELLO},
        headers={"authorization": f"Bearer {app}"},
        timeout=30,
    )
    assert answered.status_code == 200
    settle(gateway, 1)
    (row,) = ledger_rows(ledger_path(tmp_path))
    assert row["api_key_name"] == "app"
    for path in ("/metrics", "/dashboard/data"):
        assert httpx.get(gateway.url + path).status_code == 401
        assert httpx.get(gateway.url + path, headers={"authorization": f"Bearer {app}"}).status_code == 403
        assert httpx.get(gateway.url + path, headers={"authorization": f"Bearer {ops}"}).status_code == 200
    assert httpx.get(gateway.url + "/dashboard").status_code == 200, "the page itself holds no data"


def test_the_page_shows_refused_requests_by_reason_in_chromium(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    if chromium_path() is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium); CI installs it")
    gateway = make_gateway(ROUTES)
    url = gateway.base_url + "/chat/completions"
    for body in (b"{not json", b'{"model": "no-such-route", "messages": []}', b'{"model": "paid-only"}'):
        assert httpx.post(url, content=body, headers={"content-type": "application/json"}).status_code >= 400
    assert chat(gateway, "paid-only").status_code == 200
    settle(gateway, 4)
    with chromium(tmp_path / "chromium-profile") as page:
        page.navigate(gateway.url + "/dashboard")
        page.wait_for("document.querySelector('#status.live') !== null")
        reasons = (
            "Object.fromEntries([...document.querySelectorAll('#refused tr[data-reason]')]"
            ".map(tr => [tr.dataset.reason, tr.querySelector('td.requests').textContent]))"
        )
        expected = {"invalid_json": "1", "model_not_found": "1", "invalid_request_error": "1"}
        page.wait_for(reasons, equals=expected)
        assert page.evaluate("document.getElementById('no-refused').hidden") is True
        routes = "[...document.querySelectorAll('#routes tr[data-route]')].map(tr => tr.dataset.route)"
        assert "" not in page.evaluate(routes), "the route-less refusals are no route of the table"
