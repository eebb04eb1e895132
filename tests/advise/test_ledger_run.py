"""``gateway advise --ledger`` reads a ledger a day at a time (gateway/advise/ledger_run.py): the same
traffic as the whole window read at once (``simulate/replay.py``), to the float, while the request rows
it holds are only the sampled days', never the window's."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench.month import write_ledger
from gateway.advise.ledger_run import LedgerRun
from gateway.advise.runs import WorkloadRun, day_cuts
from gateway.advise.search import advise
from gateway.ledger import open_database
from gateway.ledger.rows import LedgerRow
from gateway.simulate.replay import ledger_workload
from tests.simulate.tiny import tiny_policy

DAYS = 9


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """Nine days of the month at a three-hundredth of its traffic, plus rows the replay treats apart:
    failures (they take their route's median answer length) and refusals (not replayed)."""
    path = tmp_path_factory.mktemp("ledger") / "month.sqlite3"
    write_ledger(str(path), days=DAYS, scale=1 / 300)
    since = time.time() - (DAYS + 1) * 86_400.0
    first = ledger_workload(path, since)
    odd: list[tuple[object, ...]] = []
    for i, request in enumerate(first.requests[::97]):
        at = first.start_wall + request.at + 0.5
        status = ("error", "cancelled", "refused", "ok")[i % 4]
        row = LedgerRow(
            at, f"odd-{i}", "fleet", request.route, "chat", True, "b300-vllm", "m", request.prompt_tokens,
            0, 0, 0, None, 0.0, None, None, None, None, None, None, status, None, 1, None,
        )  # fmt: skip
        odd.append((*row, f"odd-{i}"))
    database = open_database(path)
    database.open()
    try:
        database.write(odd)
    finally:
        database.close()
    return path, since


def test_the_day_by_day_read_is_the_whole_window_read_at_once(ledger: tuple[Path, float]) -> None:
    path, since = ledger
    whole = WorkloadRun(ledger_workload(path, since))
    by_day = LedgerRun(path, since)
    assert (by_day.start_wall, by_day.duration_s) == (whole.start_wall, whole.duration_s)
    assert by_day.summary() == whole.summary()
    cuts = day_cuts(by_day.start_wall, by_day.duration_s)
    assert len(cuts) >= DAYS - 1  # the whole days up to today
    for start, end in cuts:
        assert by_day.day(start, end) == whole.day(start, end), (start, end)
    failed = [r for r in whole.workload.requests if r.output_tokens and r.reasoning_tokens == 0]
    assert failed, "the failed rows replay with their route's median answer"


def test_advise_on_a_ledger_holds_only_the_sampled_days_rows(tmp_path: Path) -> None:
    # Nine whole days of the tiny world's route (a request every 15 minutes, busier on weekdays).
    path, first_day = tmp_path / "days.sqlite3", (time.time() // 86_400.0 - DAYS) * 86_400.0
    rows = []
    for day in range(DAYS):
        weekend = time.gmtime(first_day + day * 86_400.0).tm_wday >= 5
        for i in range(0, 96, 2 if weekend else 1):
            at = first_day + day * 86_400.0 + i * 900.0 + 1.0
            row = LedgerRow(
                at, f"r-{day}-{i}", None, "r", "chat", True, "pool", "m", 10, 0, 301, 0, "reported", 0.0,
                "per_token", None, 1.0, None, 100.0, 4.0, "ok", None, 1, None,
            )  # fmt: skip
            rows.append((*row, f"r-{day}-{i}"))
    database = open_database(path)
    database.open()
    try:
        database.write(rows)
    finally:
        database.close()
    run = LedgerRun(path, first_day)
    advice = advise(tiny_policy(tmp_path), run, 0.99, sample=True, workers=2)
    read, largest = run.rows_read, run.largest_read
    assert advice.requests == len(rows) and len(advice.samples) < len(
        day_cuts(run.start_wall, run.duration_s)
    )
    replayed = [len(run.day(s.start_s, s.end_s).requests) for s in advice.samples]
    # Each sampled day read once, a day at a time, for all the plans' replays; no other day's rows.
    assert read == sum(replayed) < len(rows) / 2
    assert largest == max(replayed) <= 96


def test_summing_the_days_reports_each_day_done(ledger: tuple[Path, float]) -> None:
    """The summing of a month takes seconds before any replay starts: its bar moves a day at a time."""
    path, since = ledger
    run = LedgerRun(path, since)
    seen: list[tuple[int, int]] = []
    run.sum_days(lambda done, days: seen.append((done, days)))
    days = len(day_cuts(run.start_wall, run.duration_s))
    assert seen == [(done, days) for done in range(1, days + 1)]
    assert run.summary().day_requests and len(run.summary().day_requests) == days
