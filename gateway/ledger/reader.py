"""The reports' queries over a ledger connection, written once for SQLite and PostgreSQL: spend totals
per route, backend, key or replica; time buckets for the live view; the newest rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from gateway.ledger.rollup import rollup_totals
from gateway.ledger.rows import GROUP_COLUMNS, SpendTotal


class Cursor(Protocol):
    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    """What both ``sqlite3.Connection`` and ``psycopg.Connection`` offer."""

    def execute(self, query: Any, params: Any = ..., /) -> Any: ...


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str  # "sqlite" or "postgresql": the migrations folder too
    placeholder: str  # "?" or "%s"
    distinct_list: str  # aggregate of distinct values into "a,b", with {} for the column
    bucket: str  # the start of a time bucket, {} for the bucket width placeholder
    table_exists: str  # a query answering one row when the table named by its parameter exists


SQLITE = Dialect(
    "sqlite",
    "?",
    "group_concat(DISTINCT {})",
    "CAST(time / {p} AS INTEGER) * {p}",
    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
)
POSTGRESQL = Dialect(
    "postgresql",
    "%s",
    "string_agg(DISTINCT {}, ',')",
    "floor(time / {p}) * {p}",
    "SELECT 1 WHERE to_regclass(?) IS NOT NULL",
)

RECENT_COLUMNS = (
    "time",
    "request_id",
    "replica",
    "route",
    "backend",
    "attempts",
    "decision_reason",
    "status",
    "error_type",
    "cost_usd",
    "ttft_s",
    "api_key_name",
)


class LedgerReader:
    """Read-only queries; the caller owns the connection (and its closing)."""

    def __init__(self, conn: Connection, dialect: Dialect, location: str) -> None:
        self.conn = conn
        self.dialect = dialect
        self.location = location  # the ledger this read, for the reports to name
        self._rollup: bool | None = None  # has the hourly rollup (schema 6); asked once
        self._pruned: tuple[float | None, float | None] | None = None  # (before, earliest) pruned

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        rows: list[Any] = self.conn.execute(sql.replace("?", self.dialect.placeholder), params).fetchall()
        return rows

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """A statement that answers no rows (maintenance on a ``maintaining()`` connection)."""
        self.conn.execute(sql.replace("?", self.dialect.placeholder), params)

    @property
    def rolled_up(self) -> bool:
        """Whether this ledger keeps the hourly rollup the reports read (a ledger a gateway of this
        version opened has it; a report may read an older one, by full scans)."""
        if self._rollup is None:
            self._rollup = bool(self.query(self.dialect.table_exists, ("spend_rollup",)))
        return self._rollup

    def pruned(self) -> tuple[float | None, float | None]:
        """(before, earliest): rows before ``before`` were pruned, the oldest of them started at
        ``earliest``; (None, None) when nothing was."""
        if self._pruned is None:
            self._pruned = (None, None)
            if self.rolled_up:
                rows = self.query("SELECT max(before), min(earliest) FROM ledger_pruned")
                if rows and rows[0][0] is not None:
                    self._pruned = (float(rows[0][0]), None if rows[0][1] is None else float(rows[0][1]))
        return self._pruned

    def totals(self, by: str, since: float, until: float | None = None) -> list[SpendTotal]:
        """Totals per ``by`` (route, backend, key, replica or user) of rows that started in [since, until),
        largest spend first: from the hourly rollup and at most an hour of raw rows where the ledger
        has it (``rollup.py``), else by a full scan."""
        if by not in GROUP_COLUMNS:  # a fixed name, never user text
            raise KeyError(by)
        if self.rolled_up:
            return rollup_totals(self, by, since, until, self.pruned()[0])
        return self.scan_totals(by, since, until)

    def scan_totals(self, by: str, since: float, until: float | None = None) -> list[SpendTotal]:
        """``totals`` by a scan of every row in the window: the reference the rollup must equal."""
        column = GROUP_COLUMNS[by]  # a fixed column name, never user text
        until_clause = "" if until is None else " AND time < ?"
        params: Sequence[float] = (since,) if until is None else (since, until)
        bases = self.dialect.distinct_list.format("cost_basis")
        query = (
            f"SELECT {column}, sum(request_count),"
            " sum(CASE WHEN status <> 'ok' THEN request_count ELSE 0 END),"
            " sum(prompt_tokens), sum(cached_prompt_tokens), sum(completion_tokens), sum(reasoning_tokens),"
            f" sum(cost_usd), coalesce({bases}, ''), sum(CASE WHEN attempts > 1 THEN 1 ELSE 0 END),"
            " sum(CASE WHEN status = 'refused' THEN request_count ELSE 0 END)"
            f" FROM requests WHERE time >= ?{until_clause} GROUP BY {column}"
            f" ORDER BY sum(cost_usd) DESC, {column}"
        )
        return [SpendTotal(*(_plain(v) for v in row)) for row in self.query(query, params)]

    def refusals(self, since: float, until: float | None = None) -> list[tuple[str, int]]:
        """(reason, requests) for the refused requests that started in [since, until), most first:
        the reason is the error type the gateway refused with, a fixed vocabulary of its own."""
        if self.rolled_up:
            rolled = rollup_totals(self, "refused", since, until, self.pruned()[0])
            return sorted(((str(t.key), t.requests) for t in rolled), key=lambda r: (-r[1], r[0]))
        return self.scan_refusals(since, until)

    def scan_refusals(self, since: float, until: float | None = None) -> list[tuple[str, int]]:
        """``refusals`` by a scan of the refused rows in the window."""
        until_clause = "" if until is None else " AND time < ?"
        params: Sequence[float] = (since,) if until is None else (since, until)
        query = (
            "SELECT coalesce(error_type, ''), sum(request_count) FROM requests"
            f" WHERE status = 'refused' AND time >= ?{until_clause} GROUP BY 1 ORDER BY 2 DESC, 1"
        )
        return [(str(reason), int(count)) for reason, count in self.query(query, params)]

    def buckets(self, since: float, bucket_s: float) -> list[tuple[float, str, float, int]]:
        """(bucket start, route, USD, requests) for rows since ``since``, to seed the live spend view."""
        start = self.dialect.bucket.format(p="?")
        query = (
            f"SELECT {start}, route, sum(cost_usd), sum(request_count) FROM requests"
            " WHERE time >= ? GROUP BY 1, 2"
        )
        return [
            (float(b), r, float(u), int(n)) for b, r, u, n in self.query(query, (bucket_s, bucket_s, since))
        ]

    def earliest(self) -> float | None:
        """The start of the oldest request the ledger has counted (pruned ones included)."""
        rows = self.query("SELECT min(time) FROM requests")
        kept = None if not rows or rows[0][0] is None else float(rows[0][0])
        pruned = self.pruned()[1]
        return kept if pruned is None else pruned if kept is None else min(kept, pruned)

    def recent(self, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` rows by start time, newest first."""
        query = f"SELECT {', '.join(RECENT_COLUMNS)} FROM requests ORDER BY time DESC LIMIT ?"
        return [dict(zip(RECENT_COLUMNS, row, strict=True)) for row in self.query(query, (limit,))]

    def replay_rows(self, since: float) -> list[ReplayRow]:
        """Rows that started at or after ``since``, oldest first (``gateway simulate --workload ledger:``);
        not the refused ones, which never reached a backend (nor, most of them, a route)."""
        query = (
            "SELECT time, route, stream, prompt_tokens, completion_tokens, reasoning_tokens, status"
            " FROM requests WHERE time >= ? AND status <> 'refused' ORDER BY time"
        )
        return [
            ReplayRow(float(t), r, bool(s), int(p), int(c), int(rs), st)
            for t, r, s, p, c, rs, st in self.query(query, (since,))
        ]


class ReplayRow(NamedTuple):
    """What a replay of past traffic needs from one ledger row."""

    time: float
    route: str
    stream: bool
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    status: str


def _plain(value: Any) -> Any:
    """PostgreSQL's sum() of bigints is a Decimal: reports want ints."""
    if value is not None and type(value).__name__ == "Decimal":
        return int(value)
    return value
