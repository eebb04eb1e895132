"""One contract, two ledgers: SQLite and PostgreSQL migrate to the same schema, take the same rows
(a retried batch counted once) and answer the reports' queries alike."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from gateway.ledger import COLUMNS, Ledger, LedgerRow, LedgerUnavailable, open_database
from gateway.ledger.migrations import latest_version
from gateway.ledger.sqlite import SqliteLedger


def row(n: int, **fields: object) -> LedgerRow:
    base = LedgerRow(
        time=1_750_000_000.0 + n,
        request_id=f"r{n}",
        api_key_name="team-a" if n % 2 else None,
        route="kimi" if n % 3 else "cheap",
        endpoint="chat",
        stream=n % 2 == 0,
        backend="b300" if n % 3 else "paid",
        upstream_model="kimi-k3",
        prompt_tokens=10,
        cached_prompt_tokens=2,
        completion_tokens=100 + n,
        reasoning_tokens=40,
        usage_source="reported",
        cost_usd=0.001 * n,
        cost_basis="per_token" if n % 3 == 0 else "gpu_hours_amortized",
        reserved_usd=0.01,
        ttft_s=0.9,
        first_answer_s=1.2,
        decode_tokens_per_s=92.0,
        duration_s=2.0,
        status="ok" if n % 5 else "error",
        error_type=None if n % 5 else "upstream_failed",
        attempts=2 if n % 4 == 0 else 1,
        decision_reason="cheapest_feasible",
        replica=f"replica-{n % 3}",
    )
    return base._replace(**fields)


def keyed(rows: list[LedgerRow], prefix: str = "k") -> list[tuple[object, ...]]:
    return [(*r, f"{prefix}{r.request_id}") for r in rows]


def test_a_new_ledger_migrates_to_the_latest_schema_once(target: str | Path) -> None:
    database = open_database(target)
    dialect = "postgresql" if database.shared else "sqlite"
    assert database.open() == list(range(1, latest_version(dialect) + 1))
    database.close()
    again = open_database(target)
    assert again.open() == [], "a second start applies nothing"
    again.close()


def test_both_dialects_have_the_same_columns(tmp_path: Path, postgres_url: str) -> None:
    lite = SqliteLedger(tmp_path / "l.sqlite3")
    lite.open()
    lite.close()
    with sqlite3.connect(tmp_path / "l.sqlite3") as conn:
        sqlite_columns = [r[1] for r in conn.execute("PRAGMA table_info(requests)")]
    pg = open_database(postgres_url)
    pg.open()
    pg.close()
    with psycopg.connect(postgres_url) as conn:
        query = "SELECT column_name FROM information_schema.columns WHERE table_name = 'requests'"
        query += " ORDER BY ordinal_position"
        pg_columns = [r[0] for r in conn.execute(query)]
    # Columns a later migration added sit after row_key in the table; the writer names them all.
    assert sqlite_columns == pg_columns and sorted(sqlite_columns) == sorted(["id", *COLUMNS])


def test_totals_buckets_recent_agree_with_the_rows(target: str | Path) -> None:
    rows = [row(n) for n in range(1, 31)]
    database = open_database(target)
    database.open()
    database.write(keyed(rows))
    database.write(keyed(rows[:10]))  # the same batch again (a retry after an unclear failure)
    with database.reading() as reader:
        by_route = {t.key: t for t in reader.totals("route", 0.0)}
        assert sum(t.requests for t in by_route.values()) == 30, "the retried batch is not counted twice"
        for route in ("kimi", "cheap"):
            mine = [r for r in rows if r.route == route]
            total = by_route[route]
            assert total.requests == len(mine)
            assert total.errors == sum(r.status != "ok" for r in mine)
            assert total.fallbacks == sum(r.attempts > 1 for r in mine)
            assert total.completion_tokens == sum(r.completion_tokens for r in mine)
            assert total.cost_usd == pytest.approx(sum(r.cost_usd for r in mine), rel=1e-12)
            assert set(total.bases.split(",")) == {r.cost_basis for r in mine}
        assert isinstance(by_route["kimi"].requests, int) and isinstance(by_route["kimi"].errors, int)
        assert next(t.key for t in reader.totals("route", 0.0)) == "kimi", "largest spend first"
        replicas = {t.key: t.requests for t in reader.totals("replica", 0.0)}
        assert replicas == {"replica-0": 10, "replica-1": 10, "replica-2": 10}
        keys = {t.key: t.requests for t in reader.totals("key", 0.0)}
        assert keys == {"team-a": 15, None: 15}
        window = reader.totals("route", rows[10].time, rows[20].time)
        assert sum(t.requests for t in window) == 10, "[since, until)"
        buckets = reader.buckets(rows[0].time, 10.0)
        assert sum(b[3] for b in buckets) == 30
        assert sum(b[2] for b in buckets) == pytest.approx(sum(r.cost_usd for r in rows))
        assert all(b[0] % 10.0 == 0 for b in buckets), "bucket starts are multiples of the width"
        assert reader.earliest() == rows[0].time
        recent = reader.recent(5)
        assert [r["request_id"] for r in recent] == ["r30", "r29", "r28", "r27", "r26"]
        assert recent[0]["replica"] == "replica-0" and recent[0]["attempts"] == 1
        assert reader.location == database.location
    database.close()


def test_refusals_and_per_user_totals_read_alike(target: str | Path) -> None:
    """Refused rows (schema 4: no route when none was named) count by reason and per route; rows with
    a user hash total per user; probes (their own table) take the new column too."""
    refused = [
        row(n, status="refused", error_type=reason, route=route, backend=None, attempts=0, cost_usd=0.0)
        for n, (reason, route) in enumerate(
            [
                ("invalid_json", ""),
                ("model_not_found", ""),
                ("invalid_json", ""),
                ("rate_limit_exceeded", "kimi"),
            ],
            start=100,
        )
    ]
    served = [row(n, status="ok", error_type=None, user_hash="u1" if n % 2 else "u2") for n in range(1, 7)]
    database = open_database(target)
    database.open()
    database.write(keyed([*refused, *served, row(200, probe=True, user_hash="probe")]))
    with database.reading() as reader:
        assert reader.refusals(0.0) == [
            ("invalid_json", 2),
            ("model_not_found", 1),
            ("rate_limit_exceeded", 1),
        ]
        assert reader.refusals(refused[1].time, refused[3].time) == [
            ("invalid_json", 1),
            ("model_not_found", 1),
        ]
        by_route = {t.key: t for t in reader.totals("route", 0.0)}
        assert (by_route[""].requests, by_route[""].refused, by_route[""].errors) == (3, 3, 3)
        assert by_route["kimi"].refused == 1 and isinstance(by_route["kimi"].refused, int)
        users = {t.key: t.requests for t in reader.totals("user", 0.0)}
        assert users == {"u1": 3, "u2": 3, None: 4}
        replayed = reader.replay_rows(0.0)
        assert len(replayed) == 6 and "refused" not in {r.status for r in replayed}, (
            "a replay sends no refusal"
        )
    database.close()


async def test_the_writer_batches_and_close_writes_the_rest(target: str | Path) -> None:
    ledger = Ledger(target, flush_interval_s=3600, batch_size=4)
    await ledger.start()
    for n in range(1, 11):
        ledger.append(row(n))
    assert await ledger.flush()
    assert ledger.rows_written >= 8 and ledger.up
    await ledger.close()
    assert ledger.rows_written == 10 and ledger.pending == 0
    with ledger.database.reading() as reader:
        assert sum(t.requests for t in reader.totals("route", 0.0)) == 10


def test_a_ledger_that_cannot_be_opened_says_where(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(LedgerUnavailable, match=str(blocker)):
        SqliteLedger(blocker / "ledger.sqlite3").open()
    closed = open_database("postgresql://postgres:hunter2@127.0.0.1:1/nothing")
    with pytest.raises(LedgerUnavailable, match="cannot open the ledger") as failure:
        closed.open()
    assert "hunter2" not in str(failure.value), "the password never reaches a message"
    assert closed.location == "postgresql://postgres:***@127.0.0.1:1/nothing"


def test_a_ledger_from_before_migrations_is_brought_up_to_date(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    from gateway.ledger.migrations import MIGRATIONS_DIR

    with sqlite3.connect(path) as conn:  # what the first gateway wrote: the v1 table, one row
        conn.executescript((MIGRATIONS_DIR / "sqlite" / "0001_requests.sql").read_text())
        first = COLUMNS[: COLUMNS.index("replica")]  # the columns of schema 1
        old_columns, values = ", ".join(first), ", ".join("?" * len(first))
        conn.execute(f"INSERT INTO requests ({old_columns}) VALUES ({values})", tuple(row(1))[: len(first)])
    ledger = SqliteLedger(path)
    assert ledger.open() == list(range(1, latest_version("sqlite") + 1))
    ledger.write(keyed([row(2)]))
    with ledger.reading() as reader:
        assert sum(t.requests for t in reader.totals("route", 0.0)) == 2
    ledger.close()
