"""The spend ledger: one SQLite row per request, appended in O(1) on the request path and written in
batches by a background thread; ``close()`` writes what is left, so a SIGTERM loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

from gateway.observation import Observation

log = logging.getLogger("gateway.ledger")

SCHEMA_VERSION = 1
# Bounded so a ledger that cannot write (full disk) costs memory up to a limit, then drops the oldest.
MAX_PENDING_ROWS = 200_000


class LedgerRow(NamedTuple):
    """One request. ``time`` is the wall-clock start in Unix seconds; costs are USD; durations seconds.

    A tuple in column order: built once per request and handed to ``executemany`` as is.
    """

    time: float
    request_id: str
    api_key_name: str | None  # the key's name from the policy, never the key itself
    route: str
    endpoint: str
    stream: bool
    backend: str | None  # the last backend tried (the one that answered, when one did)
    upstream_model: str | None
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int  # includes reasoning tokens
    reasoning_tokens: int
    usage_source: str | None  # "reported" by the upstream or "counted" by the gateway; None: no usage
    cost_usd: float
    cost_basis: str | None  # "per_token", "gpu_hours_amortized", "gpu_hours_unmeasured"
    reserved_usd: float | None  # what budget admission reserved, to audit predictions against costs
    ttft_s: float | None
    first_answer_s: float | None
    decode_tokens_per_s: float | None
    duration_s: float | None
    status: str  # "ok" or "error"
    error_type: str | None
    attempts: int
    decision_reason: str | None


COLUMNS: tuple[str, ...] = LedgerRow._fields
_CREATE = f"""
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY,
    time REAL NOT NULL, request_id TEXT NOT NULL, api_key_name TEXT, route TEXT NOT NULL,
    endpoint TEXT NOT NULL, stream INTEGER NOT NULL, backend TEXT, upstream_model TEXT,
    prompt_tokens INTEGER NOT NULL, cached_prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, reasoning_tokens INTEGER NOT NULL, usage_source TEXT,
    cost_usd REAL NOT NULL, cost_basis TEXT, reserved_usd REAL,
    ttft_s REAL, first_answer_s REAL, decode_tokens_per_s REAL, duration_s REAL,
    status TEXT NOT NULL, error_type TEXT, attempts INTEGER NOT NULL, decision_reason TEXT
);
CREATE INDEX IF NOT EXISTS requests_time ON requests (time);
PRAGMA user_version = {SCHEMA_VERSION};
"""
_INSERT = f"INSERT INTO requests ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"


def row_of(
    observation: Observation, started_wall: float, upstream_model: str | None, reserved_usd: float | None
) -> LedgerRow:
    """The ledger row of a finished request: tokens summed over its attempts, timings of the last one."""
    prompt = cached = completion = reasoning = 0
    source: str | None = None
    for attempt in observation.attempts:
        usage = attempt.usage
        if usage is not None:
            prompt, cached = prompt + usage.prompt_tokens, cached + usage.cached_prompt_tokens
            completion, reasoning = completion + usage.completion_tokens, reasoning + usage.reasoning_tokens
            source = "counted" if usage.source == "counted" or source == "counted" else "reported"
    final = observation.final
    finished = observation.finished_at
    return LedgerRow(
        started_wall,
        observation.request_id,
        observation.api_key_name,
        observation.route,
        observation.endpoint,
        observation.stream,
        observation.backend,
        upstream_model,
        prompt,
        cached,
        completion,
        reasoning,
        source,
        observation.cost_usd or 0.0,
        observation.cost_basis,
        reserved_usd,
        final.ttft_s if final else None,
        final.first_answer_s if final else None,
        final.decode_tokens_per_s if final else None,
        None if finished is None else finished - observation.started_at,
        observation.status,
        observation.error_type,
        len(observation.attempts),
        observation.decision_reason,
    )


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection in WAL mode, so readers (reports, the dashboard's seed) never block the writer."""
    if readonly:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=10.0)
        conn.execute("PRAGMA journal_mode=WAL")
        # Durable across a crash of this process (not of the machine), at a fraction of FULL's fsyncs.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(_CREATE)
    return conn


class Ledger:
    """Collects rows from the event loop and writes them from one thread, in batches.

    ``append`` only puts a tuple on a deque (thread-safe in CPython) and, when a batch is full, wakes
    the writer; every other ``flush_interval_s`` the writer takes whatever is there.
    """

    def __init__(self, path: Path, *, flush_interval_s: float = 1.0, batch_size: int = 500) -> None:
        self.path = path
        self._flush_interval_s = flush_interval_s
        self._batch_size = batch_size
        self._pending: deque[LedgerRow] = deque()
        self._batch: list[LedgerRow] = []  # being written now; kept and retried when a write fails
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._open_error: BaseException | None = None
        self.rows_appended = 0
        self.rows_written = 0
        self.rows_dropped = 0
        self.write_errors = 0

    @property
    def pending(self) -> int:
        return len(self._pending) + len(self._batch)

    def append(self, row: LedgerRow) -> None:
        pending = self._pending
        if len(pending) >= MAX_PENDING_ROWS:
            pending.popleft()
            self.rows_dropped += 1
        pending.append(row)
        self.rows_appended += 1
        if len(pending) >= self._batch_size:
            self._wake.set()

    async def start(self) -> None:
        """Open (and create) the database in the writer thread; raise here if it cannot be opened."""
        self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
        self._thread.start()
        await asyncio.to_thread(self._started.wait)
        if self._open_error is not None:
            raise RuntimeError(f"cannot open the ledger at {self.path}: {self._open_error}")

    async def close(self) -> None:
        """Write every pending row, then stop the writer."""
        thread = self._thread
        if thread is None:
            return
        self._stopping = True
        self._wake.set()
        await asyncio.to_thread(thread.join)
        self._thread = None

    async def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until the rows appended so far are written; False if that took over ``timeout_s``."""
        target = self.rows_appended
        for _ in range(max(1, int(timeout_s / 0.01))):
            if self._thread is None or self.rows_written + self.rows_dropped >= target:
                return True
            self._wake.set()
            await asyncio.sleep(0.01)
        return False

    def _run(self) -> None:
        try:
            conn = connect(self.path)
        except (sqlite3.Error, OSError) as exc:
            self._open_error = exc
            self._started.set()
            return
        self._started.set()
        try:
            while not self._stopping:
                self._wake.wait(self._flush_interval_s)
                self._wake.clear()
                self._write_pending(conn)
            self._write_pending(conn)
            if self.pending:
                log.error("ledger closed with %d rows unwritten (see the errors above)", self.pending)
        finally:
            conn.close()

    def _write_pending(self, conn: sqlite3.Connection) -> None:
        pending = self._pending
        while self._batch or pending:
            if not self._batch:
                self._batch = [pending.popleft() for _ in range(min(self._batch_size, len(pending)))]
            try:
                with conn:
                    conn.executemany(_INSERT, self._batch)
            except sqlite3.Error:
                self.write_errors += 1
                log.exception("ledger write of %d rows failed; will retry", len(self._batch))
                return
            self.rows_written += len(self._batch)
            self._batch = []


class SpendTotal(NamedTuple):
    """Spend summed over ledger rows sharing a key (a route, a backend, an API key name...)."""

    key: str | None
    requests: int
    errors: int
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cost_usd: float
    bases: str  # the cost bases seen, comma-separated


GROUP_COLUMNS: Mapping[str, str] = MappingProxyType(
    {"route": "route", "backend": "backend", "key": "api_key_name"}
)


def spend_totals(
    conn: sqlite3.Connection, by: str, since: float, until: float | None = None
) -> list[SpendTotal]:
    """Totals per ``by`` (route, backend or key) for rows that started in [since, until)."""
    column = GROUP_COLUMNS[by]  # a fixed column name, never user text
    until_clause = "" if until is None else " AND time < ?"
    params: Sequence[float] = (since,) if until is None else (since, until)
    query = (
        f"SELECT {column}, count(*), sum(status != 'ok'), sum(prompt_tokens), sum(cached_prompt_tokens),"
        " sum(completion_tokens), sum(reasoning_tokens), sum(cost_usd),"
        " coalesce(group_concat(DISTINCT cost_basis), '')"
        f" FROM requests WHERE time >= ?{until_clause} GROUP BY {column} ORDER BY sum(cost_usd) DESC, 1"
    )
    return [SpendTotal(*row) for row in conn.execute(query, params)]


def spend_buckets(
    conn: sqlite3.Connection, since: float, bucket_s: float
) -> Iterable[tuple[float, str, float, int]]:
    """(bucket start, route, USD, requests) for rows since ``since``, to seed the live spend view."""
    query = (
        "SELECT CAST(time / ? AS INTEGER) * ?, route, sum(cost_usd), count(*)"
        " FROM requests WHERE time >= ? GROUP BY 1, 2"
    )
    return conn.execute(query, (bucket_s, bucket_s, since)).fetchall()


def earliest_time(conn: sqlite3.Connection) -> float | None:
    row = conn.execute("SELECT min(time) FROM requests").fetchone()
    return None if row is None or row[0] is None else float(row[0])


class ReplayRow(NamedTuple):
    """What a replay of past traffic needs from one ledger row."""

    time: float
    route: str
    stream: bool
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    status: str


def replay_rows(conn: sqlite3.Connection, since: float) -> list[ReplayRow]:
    """Rows that started at or after ``since``, oldest first (``gateway simulate --workload ledger:``)."""
    query = (
        "SELECT time, route, stream, prompt_tokens, completion_tokens, reasoning_tokens, status"
        " FROM requests WHERE time >= ? ORDER BY time"
    )
    return [ReplayRow(t, r, bool(s), p, c, rs, st) for t, r, s, p, c, rs, st in conn.execute(query, (since,))]
