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

SCHEMA_VERSION = 2
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
    # Schema 2: what the request used and went through.
    prefill_cost_usd: float | None = None  # a pool's share of cost_usd for processing the prompt
    queued_s: float = 0.0  # seconds waiting in the route's queue for a free or unpaused candidate
    attempt_log: str = ""  # each attempt, in order: "backend:status[:http_status]" joined by ";"
    probe: bool = False  # a synthetic probe of the gateway's own, billed to no route or key


COLUMNS: tuple[str, ...] = LedgerRow._fields
_CREATE = """
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY,
    time REAL NOT NULL, request_id TEXT NOT NULL, api_key_name TEXT, route TEXT NOT NULL,
    endpoint TEXT NOT NULL, stream INTEGER NOT NULL, backend TEXT, upstream_model TEXT,
    prompt_tokens INTEGER NOT NULL, cached_prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, reasoning_tokens INTEGER NOT NULL, usage_source TEXT,
    cost_usd REAL NOT NULL, cost_basis TEXT, reserved_usd REAL,
    ttft_s REAL, first_answer_s REAL, decode_tokens_per_s REAL, duration_s REAL,
    status TEXT NOT NULL, error_type TEXT, attempts INTEGER NOT NULL, decision_reason TEXT,
    prefill_cost_usd REAL, queued_s REAL NOT NULL DEFAULT 0, attempt_log TEXT NOT NULL DEFAULT '',
    probe INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS requests_time ON requests (time);
"""
# Columns added after schema 1, for ledgers written by an older gateway.
_ADDED_COLUMNS = (
    ("prefill_cost_usd", "REAL"),
    ("queued_s", "REAL NOT NULL DEFAULT 0"),
    ("attempt_log", "TEXT NOT NULL DEFAULT ''"),
    ("probe", "INTEGER NOT NULL DEFAULT 0"),
)
_INSERT = f"INSERT INTO requests ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
# Synthetic probes (gateway/probes.py) go to their own table with the same columns: they are the
# gateway's own traffic, billed to no route or key, so spend reports over ``requests`` never see them.
_INSERT_PROBE = _INSERT.replace("INSERT INTO requests", "INSERT INTO probes", 1)


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
        observation.prefill_cost_usd,
        observation.queued_s,
        attempt_log(observation),
        observation.endpoint == "probe",
    )


def attempt_log(observation: Observation) -> str:
    """Every attempt of a request in one short string, e.g. "paid-api:upstream_error:503;b300:ok"."""
    return ";".join(
        f"{a.backend}:{a.status}" + ("" if a.http_status is None else f":{a.http_status}")
        for a in observation.attempts
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
        _migrate(conn)
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
        self._probes: deque[LedgerRow] = deque(maxlen=10_000)
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

    def append_probe(self, row: LedgerRow) -> None:
        """A synthetic probe's row, for the ``probes`` table (written with the next batch)."""
        self._probes.append(row)

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
        probes = [self._probes.popleft() for _ in range(len(self._probes))]
        if probes:
            try:
                with conn:
                    conn.executemany(_INSERT_PROBE, probes)
            except sqlite3.Error:
                log.exception("ledger write of %d probe rows failed; they are dropped", len(probes))
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


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring a ledger an older gateway wrote up to this schema: columns are only ever added."""
    present = {row[1] for row in conn.execute("PRAGMA table_info(requests)")}
    for name, kind in _ADDED_COLUMNS:
        if name not in present:
            conn.execute(f"ALTER TABLE requests ADD COLUMN {name} {kind}")
    conn.execute("CREATE TABLE IF NOT EXISTS probes AS SELECT * FROM requests WHERE 0")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    conn.commit()
