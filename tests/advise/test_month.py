"""The month's traffic (bench/month.py): weekdays and weekends shaped apart by calendar day, and its
ledger, written through the ledger's own schema, replayed by ``gateway advise --ledger`` row for row."""

from __future__ import annotations

import time
from pathlib import Path

from bench.month import WEEKDAY, WEEKEND, curve, write_ledger
from gateway.simulate.replay import ledger_workload
from gateway.simulate.workload import parse_start


def test_each_calendar_day_gets_its_kind_of_curve() -> None:
    friday = parse_start("2026-03-06T00:00:00Z")
    points = curve(friday, 3)
    peaks = [max(rps for hour, rps in points if 24 * day <= hour < 24 * (day + 1)) for day in range(3)]
    weekday_peak, weekend_peak = max(r for _, r in WEEKDAY), max(r for _, r in WEEKEND)
    assert peaks == [weekday_peak, weekend_peak, weekend_peak]  # Friday, Saturday, Sunday


def test_the_month_ledger_replays_row_for_row(tmp_path: Path) -> None:
    path = tmp_path / "month.sqlite3"
    rows, _ = write_ledger(str(path), days=2, scale=0.01)
    replayed = ledger_workload(path, time.time() - 30 * 86_400.0)
    assert rows > 100 and len(replayed.requests) == rows
    assert {r.route for r in replayed.requests} == {"kimi-k3", "kimi-k3-batch", "kimi-k3-fast"}
    assert all(r.reasoning_tokens < r.output_tokens for r in replayed.requests)  # thinking-heavy, not all
