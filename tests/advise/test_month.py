"""The month's traffic (bench/month.py): weekdays and weekends shaped apart by calendar day, coding
agents' sessions among the chat, and its ledger, written through the ledger's own schema, replayed by
``gateway advise --ledger`` row for row."""

from __future__ import annotations

import itertools
from pathlib import Path

from bench.month import AGENT_ROUTE, AGENT_SESSIONS, WEEKDAY, WEEKEND, curve, month_day, write_ledger
from gateway.simulate.replay import ledger_workload
from gateway.simulate.workload import parse_start


def test_each_calendar_day_gets_its_kind_of_curve() -> None:
    friday = parse_start("2026-03-06T00:00:00Z")
    points = curve(friday, 3)
    peaks = [max(rps for hour, rps in points if 24 * day <= hour < 24 * (day + 1)) for day in range(3)]
    weekday_peak, weekend_peak = max(r for _, r in WEEKDAY), max(r for _, r in WEEKEND)
    assert peaks == [weekday_peak, weekend_peak, weekend_peak]  # Friday, Saturday, Sunday


def test_the_month_ledger_replays_row_for_row(tmp_path: Path) -> None:
    # A fixed Wednesday noon: its one whole day back is a Tuesday, with agents' sessions at this scale
    # (a weekend's round to none, so a run on a Sunday or Monday by the clock saw no agents' route).
    path, wednesday = tmp_path / "month.sqlite3", parse_start("2026-03-04T12:00:00Z")
    rows, _ = write_ledger(str(path), days=2, scale=0.01, now=wednesday)
    replayed = ledger_workload(path, wednesday - 30 * 86_400.0)
    assert rows > 100 and len(replayed.requests) == rows
    assert {r.route for r in replayed.requests} == {"kimi-k3", "kimi-k3-batch", "kimi-k3-fast", AGENT_ROUTE}
    assert all(r.reasoning_tokens < r.output_tokens for r in replayed.requests)  # thinking-heavy, not all


def test_agent_sessions_resend_their_growing_conversation_among_the_chat() -> None:
    monday = parse_start("2026-03-02T00:00:00Z")
    day = month_day(monday, 0, scale=0.1)
    turns = [r for r in day if r.route == AGENT_ROUTE]
    sessions = {r.session for r in turns}
    assert len(sessions) == round(AGENT_SESSIONS["weekday"] * 0.1) and len(turns) > 5 * len(sessions)
    assert [r.at for r in day] == sorted(r.at for r in day)  # one stream of arrivals, chat and agents
    for session in sessions:
        prompts = [r for r in turns if r.session == session]
        assert all(8 * 3600 <= r.at < 86_400 for r in prompts)  # begun in the working day
        assert prompts[-1].prompt_tokens <= 300_000
        # Each turn's prompt is the last one plus one message: the shared prefix and all before it.
        for a, b in itertools.pairwise(prompts):
            assert b.prompt_tokens > a.prompt_tokens
            assert b.shape is not None and a.shape is not None and b.shape[1][:-1] == a.shape[1]
