"""The embedded ledger: a SQLite file in WAL mode, so readers (reports, the dashboard) never block
the one writer. The default when no PostgreSQL URL is configured."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from gateway.ledger.database import LedgerRejected, LedgerUnavailable
from gateway.ledger.migrations import TRACKING_TABLE, migrations
from gateway.ledger.reader import SQLITE, LedgerReader
from gateway.ledger.rows import COLUMNS, split_probes

INSERT = (
    f"INSERT INTO requests ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
    " ON CONFLICT (row_key) DO NOTHING"
)
# Synthetic probes have a table of their own: spend reports over ``requests`` never see them.
INSERT_PROBE = INSERT.replace("INSERT INTO requests", "INSERT INTO probes", 1)
WRITE_BUSY_TIMEOUT_S = 2.0
# The spend rollup (migration 7) of the requests rows past an id: what a batch just inserted (ignored
# rows take no id), summed per grouping, hour and day in one statement, as PostgreSQL's statement-level
# trigger does; migration 8 dropped SQLite's per-row trigger for it. The batch's rows are first summed
# by everything a grouping can name (most of a batch shares its route, backend, key and replica), and
# only those sums are spread over the six groupings and two spans: spreading each row was 12 tuples a
# row, and the rollup half the ledger writer's CPU. A row's hour is computed as the trigger did (the
# largest h with h * 3600 <= time). ``WHERE true`` keeps SQLite from reading the upsert's ON as a join's.
ROLLUP_SINCE = """
INSERT INTO spend_rollup
SELECT b.dimension, s.hours, b.hour / s.hours, coalesce(b.name, ''), b.name IS NULL,
    coalesce(b.cost_basis, ''),
    sum(b.requests), sum(b.errors), sum(b.refused), sum(b.fallbacks),
    sum(b.prompt_tokens), sum(b.cached_prompt_tokens), sum(b.completion_tokens), sum(b.reasoning_tokens),
    sum(b.cost_usd)
FROM (
    SELECT d.dimension, CASE d.dimension WHEN 'route' THEN g.route WHEN 'backend' THEN g.backend
        WHEN 'key' THEN g.api_key_name WHEN 'replica' THEN g.replica WHEN 'user' THEN g.user_hash
        ELSE coalesce(g.error_type, '') END AS name, g.*
    FROM (
        SELECT route, backend, api_key_name, replica, user_hash, error_type, cost_basis,
            status = 'refused' AS is_refused,
            CAST(time / 3600 AS INTEGER) - (CAST(time / 3600 AS INTEGER) * 3600 > time) AS hour,
            sum(request_count) AS requests, sum((status <> 'ok') * request_count) AS errors,
            sum((status = 'refused') * request_count) AS refused, sum(attempts > 1) AS fallbacks,
            sum(prompt_tokens) AS prompt_tokens, sum(cached_prompt_tokens) AS cached_prompt_tokens,
            sum(completion_tokens) AS completion_tokens, sum(reasoning_tokens) AS reasoning_tokens,
            sum(cost_usd) AS cost_usd
        FROM requests WHERE id > ?
        GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
    ) AS g JOIN spend_dimensions d ON d.dimension <> 'refused' OR g.is_refused
) AS b CROSS JOIN spend_spans AS s
WHERE true
GROUP BY 1, 2, 3, 4, 5, 6
ON CONFLICT (dimension, hours, bucket, name, name_null, cost_basis) DO UPDATE SET
    requests = requests + excluded.requests, errors = errors + excluded.errors,
    refused = refused + excluded.refused, fallbacks = fallbacks + excluded.fallbacks,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    cached_prompt_tokens = cached_prompt_tokens + excluded.cached_prompt_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens,
    cost_usd = cost_usd + excluded.cost_usd
"""


OPEN_BUSY_TIMEOUT_S = 10.0


def connect(
    path: Path,
    *,
    readonly: bool = False,
    wait_s: float = OPEN_BUSY_TIMEOUT_S,
    # The ledger's: durable across a crash of this process (not of the machine), at a fraction of
    # FULL's fsyncs. The spool asks for FULL.
    synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
) -> sqlite3.Connection:
    """A connection to the SQLite file ``path`` (made, with its folder, if new) in WAL mode, waiting up
    to ``wait_s`` for another connection holding it; ``readonly``: one that reads the file as it is."""
    if readonly:
        return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=wait_s)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=wait_s, isolation_level=None)
    into_wal(conn, wait_s)
    conn.execute(f"PRAGMA synchronous={synchronous}")
    return conn


def into_wal(conn: sqlite3.Connection, wait_s: float) -> None:
    """Put the file in WAL mode, waiting up to ``wait_s`` for another process doing the same.

    Two processes opening a new file at once (``gateway serve --workers 2``) race to switch it: the
    loser holds a read lock while it asks for the write lock, so SQLite answers "database is locked"
    at once rather than calling the busy handler (which could deadlock). Asked again, it finds the file
    in WAL mode already, or switches it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY
            if not busy or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)


def migrate(conn: sqlite3.Connection) -> list[int]:
    """Apply the migrations this file lacks, each in its own transaction; return their versions."""
    applied = []
    conn.execute(TRACKING_TABLE)
    for migration in migrations("sqlite"):
        conn.execute("BEGIN IMMEDIATE")  # one migrator at a time, even across processes
        try:
            done = conn.execute("SELECT 1 FROM schema_migrations WHERE version = ?", (migration.version,))
            if done.fetchone() is None:
                for statement in migration.statements:
                    conn.execute(statement)
                record = "INSERT INTO schema_migrations VALUES (?, ?, ?)"
                conn.execute(record, (migration.version, migration.name, time.time()))
                applied.append(migration.version)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return applied


class SqliteLedger:
    """A ledger file. The writer thread opens its own connection; readers open read-only ones."""

    shared = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None

    @property
    def location(self) -> str:
        return str(self.path.resolve())

    def open(self) -> list[int]:
        try:
            conn = connect(self.path)
            applied = migrate(conn)
            # A write waits this long for another writer of the file, then fails: its rows go to the
            # spool (a locked ledger holds the rows that arrive meanwhile in memory only).
            conn.execute(f"PRAGMA busy_timeout = {int(WRITE_BUSY_TIMEOUT_S * 1000)}")
        except (sqlite3.Error, OSError) as exc:
            raise LedgerUnavailable(f"cannot open the ledger at {self.path}: {exc}") from exc
        self._conn = conn
        return applied

    def write(self, rows: Sequence[tuple[Any, ...]]) -> None:
        conn = self._conn
        if conn is None:
            raise LedgerUnavailable("the ledger is not open")
        try:
            with conn:
                conn.execute("BEGIN")
                requests, probes = split_probes(rows)
                if requests:
                    (last,) = conn.execute("SELECT coalesce(max(id), 0) FROM requests").fetchone()
                    conn.executemany(INSERT, requests)
                    conn.execute(ROLLUP_SINCE, (last,))
                if probes:
                    conn.executemany(INSERT_PROBE, probes)
        except (sqlite3.IntegrityError, sqlite3.InterfaceError, OverflowError) as exc:
            raise LedgerRejected(f"the ledger refused rows: {exc}") from exc
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"ledger write failed: {exc}") from exc

    @contextlib.contextmanager
    def reading(self) -> Iterator[LedgerReader]:
        try:
            conn = connect(self.path, readonly=True)
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"no ledger at {self.path}: {exc}") from exc
        try:
            yield LedgerReader(conn, SQLITE, self.location)
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"reading the ledger at {self.path} failed: {exc}") from exc
        finally:
            conn.close()

    @contextlib.contextmanager
    def maintaining(self) -> Iterator[LedgerReader]:
        try:
            conn = connect(self.path)
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"cannot write the ledger at {self.path}: {exc}") from exc
        try:
            yield LedgerReader(conn, SQLITE, self.location)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
