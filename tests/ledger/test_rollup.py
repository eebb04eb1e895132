"""The spend reports at volume read the hourly rollup (migration 6) plus at most an hour of raw rows:
their totals must be a full scan's, for every grouping and window, after inserts, after a migration
of a ledger that already had rows, and after `gateway ledger prune`; and the queries must be ones an
index answers (EXPLAIN), not scans of every request."""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.ledger import LedgerReader, LedgerRow, open_database
from gateway.ledger.migrations import migrations
from gateway.ledger.prune import RollupMismatch, check_rollup, prune, same_total
from gateway.ledger.rollup import DIMENSIONS, HOUR_S, hour_of, rollup_totals
from gateway.ledger.settings import LEDGER_ENV
from tests.servers import python_module

from .test_contract import keyed

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z, an hour's start
BY = ("route", "backend", "key", "replica", "user")


def random_rows(count: int, seed: int, hours: int = 30) -> list[LedgerRow]:
    """Rows over ``hours`` hours, with NULL keys, '' routes, refusals, several cost bases, and some
    rows a hair either side of an hour's start (where a division could round across it)."""
    rng = random.Random(seed)
    rows = []
    for n in range(count):
        if n % 17 == 0:
            boundary = START + rng.randrange(1, hours) * HOUR_S
            time = rng.choice([boundary, boundary - 1e-6, boundary + 1e-6, boundary - 2.3e-7])
        else:
            time = START + rng.random() * hours * HOUR_S
        refused = rng.random() < 0.08
        status = "refused" if refused else rng.choice(["ok"] * 8 + ["error", "cancelled"])
        rows.append(
            LedgerRow(
                time=time,
                request_id=f"s{seed}-{n}",
                api_key_name=rng.choice(["team-a", "team-b", None, ""]),
                route="" if refused and rng.random() < 0.5 else rng.choice(["kimi", "cheap", "agents"]),
                endpoint="chat",
                stream=rng.random() < 0.7,
                backend=None if refused else rng.choice(["b300", "h200", "paid"]),
                upstream_model="kimi-k3",
                prompt_tokens=rng.randrange(0, 90_000),
                cached_prompt_tokens=rng.randrange(0, 30_000),
                completion_tokens=rng.randrange(0, 9_000),
                reasoning_tokens=rng.randrange(0, 4_000),
                usage_source="reported",
                cost_usd=0.0 if refused else rng.random() * 0.05,
                cost_basis=None if refused else rng.choice(["per_token", "gpu_hours_amortized"]),
                reserved_usd=None,
                ttft_s=0.5,
                first_answer_s=0.6,
                decode_tokens_per_s=80.0,
                duration_s=3.0,
                status=status,
                error_type=rng.choice(["invalid_json", "rate_limit_exceeded", None]) if refused else None,
                attempts=0 if refused else rng.choice([1, 1, 1, 2]),
                decision_reason="cheapest_feasible",
                replica=rng.choice(["r0", "r1", None]),
                user_hash=rng.choice([None, "u1", "u2", "u3"]),
                # a flood of refusals folded into one row (ledger/refused.py) counts every request
                request_count=rng.choice([1, 1, 20, 137]) if refused else 1,
            )
        )
    return rows


def windows(seed: int) -> list[tuple[float, float | None]]:
    rng = random.Random(seed)
    found: list[tuple[float, float | None]] = [
        (START + 1.5 * HOUR_S, START + 50 * HOUR_S),
        (START - 7 * HOUR_S, START + 24 * HOUR_S),
        (START + 23.99 * HOUR_S, START + 48.01 * HOUR_S),
        (0.0, None),
        (START, None),
        (START + 5 * HOUR_S, START + 9 * HOUR_S),
    ]
    for _ in range(12):
        since = START + rng.random() * 32 * HOUR_S
        found.append((since, None))
        found.append((since, since + rng.choice([10.0, 0.5 * HOUR_S, 2.2 * HOUR_S, 20 * HOUR_S])))
        found.append((START + rng.randrange(0, 30) * HOUR_S, START + rng.randrange(1, 31) * HOUR_S + 7.5))
    return found


def assert_rollup_is_a_scan(reader: LedgerReader, window_seed: int = 1) -> None:
    assert reader.rolled_up
    for since, until in windows(window_seed):
        for by in BY:
            rolled = {t.key: t for t in reader.totals(by, since, until)}
            scanned = {t.key: t for t in reader.scan_totals(by, since, until)}
            assert rolled.keys() == scanned.keys(), (by, since, until)
            for key, total in rolled.items():
                assert same_total(total, scanned[key]), (by, since, until, total, scanned[key])
        assert sorted(reader.refusals(since, until)) == sorted(reader.scan_refusals(since, until))


def test_the_rollup_equals_a_full_scan_after_inserts_for_every_grouping_and_window(
    target: str | Path,
) -> None:
    rows = random_rows(1500, seed=7)
    database = open_database(target)
    database.open()
    for start in range(0, len(rows), 200):
        database.write(keyed(rows[start : start + 200]))
    database.write(keyed(rows[:300]))  # retried batches: skipped rows must not reach the rollup
    with database.reading() as reader:
        assert sum(t.requests for t in reader.totals("route", 0.0)) == sum(r.request_count for r in rows)
        assert_rollup_is_a_scan(reader)
        grand = sum(t.cost_usd for t in reader.totals("backend", 0.0))
        assert grand == pytest.approx(sum(r.cost_usd for r in rows), rel=1e-12)
    more = random_rows(400, seed=8)
    database.write(keyed(more, prefix="more"))  # into hours the rollup already has
    with database.reading() as reader:
        assert sum(t.requests for t in reader.totals("key", 0.0)) == sum(r.request_count for r in rows + more)
        assert_rollup_is_a_scan(reader, window_seed=2)
    database.close()


def test_the_hour_of_a_row_is_the_one_a_time_comparison_gives() -> None:
    for hour in (0, 1, 490_896, 500_000):
        start = float(hour * HOUR_S)
        assert hour_of(start) == hour
        assert hour_of(start - 1e-6) == hour - 1 or hour == 0
        assert hour_of(start + 1e-6) == hour
        below = start
        for _ in range(40):  # the doubles just below the hour's start all belong to the hour before
            below = float.__sub__(below, abs(below) * 2.2e-16 or 5e-324)
            assert hour_of(below) == hour - 1 or hour == 0


def schema_6(target: str | Path) -> None:
    """A ledger at schema 6, as a gateway before the rollup left it (no rows yet)."""
    dialect = "sqlite" if isinstance(target, Path) else "postgresql"
    earlier = [m for m in migrations(dialect) if m.version <= 6]
    if isinstance(target, Path):
        with sqlite3.connect(target) as conn:
            conn.execute(
                "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT, applied_at REAL)"
            )
            for m in earlier:
                for statement in m.statements:
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_migrations VALUES (?, ?, 0)", (m.version, m.name))
        return
    with psycopg.connect(target, autocommit=True) as pg:
        pg.execute(
            "CREATE TABLE schema_migrations"
            " (version INTEGER PRIMARY KEY, name TEXT, applied_at DOUBLE PRECISION)"
        )
        for m in earlier:
            for statement in m.statements:
                pg.execute(statement.encode())
            pg.execute("INSERT INTO schema_migrations VALUES (%s, %s, 0)", (m.version, m.name))


def insert_raw(target: str | Path, rows: Sequence[tuple[Any, ...]], columns: Sequence[str]) -> None:
    names = ", ".join(columns)
    if isinstance(target, Path):
        with sqlite3.connect(target) as conn:
            conn.executemany(f"INSERT INTO requests ({names}) VALUES ({', '.join('?' * len(columns))})", rows)
        return
    with psycopg.connect(target) as pg, pg.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO requests ({names}) VALUES ({', '.join(['%s'] * len(columns))})", rows
        )


def test_the_migration_sums_the_rows_a_ledger_already_has(target: str | Path) -> None:
    from gateway.ledger import COLUMNS

    schema_6(target)
    rows = random_rows(600, seed=11)
    insert_raw(target, keyed(rows), COLUMNS)
    database = open_database(target)
    assert 7 in database.open(), "the rollup's migration ran on the ledger with rows"
    after = random_rows(200, seed=12)
    database.write(keyed(after, prefix="after"))  # and the trigger takes over
    with database.reading() as reader:
        assert sum(t.requests for t in reader.totals("route", 0.0)) == sum(
            r.request_count for r in rows + after
        )
        assert_rollup_is_a_scan(reader, window_seed=3)
    database.close()


def reports(reader: LedgerReader, since: float) -> dict[str, Any]:
    return {
        by: {
            t.key: (t.requests, t.errors, t.completion_tokens, round(t.cost_usd, 9))
            for t in reader.totals(by, since)
        }
        for by in BY
    } | {"refused": reader.refusals(since), "earliest": reader.earliest()}


def test_prune_deletes_old_rows_and_every_report_keeps_its_totals(target: str | Path) -> None:
    rows = random_rows(1200, seed=21)
    database = open_database(target)
    database.open()
    database.write(keyed(rows))
    cutoff_at = START + 12.4 * HOUR_S  # inside an hour: prune keeps that hour's rows
    starts = (0.0, START, START + 12 * HOUR_S, START + 20.5 * HOUR_S)
    with database.reading() as reader:
        before = {since: reports(reader, since) for since in starts}
    dry = prune(database, cutoff_at, dry_run=True)
    pruned = prune(database, cutoff_at)
    assert pruned.before == START + 12 * HOUR_S and dry.rows == pruned.rows
    assert pruned.rows == sum(r.time < pruned.before for r in rows) > 0
    with database.reading() as reader:
        kept = reader.query("SELECT count(*) FROM requests")[0][0]
        assert kept == len(rows) - pruned.rows
        for since in starts:
            assert reports(reader, since) == before[since], since
        assert_rollup_is_a_scan_after(reader, pruned.before)
    assert prune(database, cutoff_at).rows == 0, "a second prune finds nothing left to delete"
    database.close()


def assert_rollup_is_a_scan_after(reader: LedgerReader, horizon: float) -> None:
    """Past the pruned horizon, the rows are still there to compare with."""
    check_rollup(reader, horizon, START + 40 * HOUR_S)


def test_prune_deletes_nothing_when_the_rollup_does_not_hold_the_rows(target: str | Path) -> None:
    rows = random_rows(300, seed=31)
    database = open_database(target)
    database.open()
    database.write(keyed(rows))
    with database.maintaining() as ledger:  # a rollup that lost an hour (as rows loaded without it)
        ledger.execute(
            "DELETE FROM spend_rollup WHERE dimension = 'backend' AND bucket = ? / hours",
            (hour_of(START) + 2,),
        )
    with pytest.raises(RollupMismatch, match="nothing pruned"):
        prune(database, START + 10 * HOUR_S)
    with database.reading() as reader:
        assert reader.query("SELECT count(*) FROM requests")[0][0] == len(rows)
        assert reader.pruned() == (None, None)
    database.close()


class Recording:
    """Runs the rollup's queries on a reader and keeps them, to EXPLAIN them after."""

    def __init__(self, reader: LedgerReader) -> None:
        self.reader = reader
        self.queries: list[tuple[str, Sequence[Any]]] = []

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        self.queries.append((sql, params))
        return self.reader.query(sql, params)


def test_the_report_queries_read_the_rollup_and_the_time_index(target: str | Path) -> None:
    database = open_database(target)
    database.open()
    database.write(keyed(random_rows(800, seed=41)))
    with database.reading() as reader:
        for by in DIMENSIONS:
            recording = Recording(reader)
            rollup_totals(recording, by, START + 3.5 * HOUR_S, START + 9.25 * HOUR_S, None)
            probes = [(sql, params) for sql, params in recording.queries if "LIMIT 1" in sql]
            summed = [(sql, params) for sql, params in recording.queries if "LIMIT 1" not in sql]
            assert len(summed) == 1, "one statement sums the rollup and the edges"
            for sql, params in probes:
                assert re.search(r"requests_(status_)?time", explain(reader, sql, params))
            sql, params = summed[0]
            assert sql.count("FROM requests") == 2 and sql.count("FROM spend_rollup") == 1, sql
            plan = explain(reader, sql, params)
            # The rollup by its primary key, the edges' raw rows by an index on the start time, and
            # never a scan of every request.
            assert re.search(r"spend_rollup_pkey|spend_rollup USING PRIMARY KEY", plan), plan
            assert re.search(r"requests_(status_)?time", plan), plan
            assert not re.search(r"Seq Scan on requests|SCAN requests(?! USING)", plan), plan
    database.close()


def explain(reader: LedgerReader, sql: str, params: Sequence[Any]) -> str:
    """The plan, with sequential scans priced out on PostgreSQL (these test tables are tiny; the
    question is whether an index answers the query at all, as it does at volume)."""
    if reader.dialect.name == "sqlite":
        return " ".join(str(row[-1]) for row in reader.query(f"EXPLAIN QUERY PLAN {sql}", params))
    reader.execute("SET enable_seqscan = off")
    try:
        return " ".join(str(row[0]) for row in reader.query(f"EXPLAIN {sql}", params))
    finally:
        reader.execute("RESET enable_seqscan")


def test_gateway_ledger_prune_keeps_gateway_spend_s_totals(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    database = open_database(ledger)
    database.open()
    database.write(keyed(random_rows(500, seed=51)))
    database.close()
    env = {k: v for k, v in os.environ.items() if k != LEDGER_ENV}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = python_module("gateway", *args, "--ledger", str(ledger))
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, check=False)

    def spent(by: str) -> dict[str, Any]:
        done = run("spend", "--by", by, "--since", "2025-12-31", "--format", "json")
        assert done.returncode == 0, done.stderr
        document = json.loads(done.stdout)
        return {
            r[by]: (r["requests"], r["completion_tokens"], round(r["cost_usd"], 9)) for r in document["rows"]
        }

    before = {by: spent(by) for by in BY}
    done = run("ledger", "prune", "--before", "2026-01-01T15:30:00")
    assert done.returncode == 0, done.stderr
    assert "deleted" in done.stdout and "before 2026-01-01T15:00:00Z" in done.stdout
    assert {by: spent(by) for by in BY} == before
    bad = run("ledger", "prune", "--before", "yesterday-ish")
    assert bad.returncode == 2 and "--before 'yesterday-ish'" in bad.stderr
